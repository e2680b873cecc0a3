"""Cluster tooling: the cluster description, the local process runner, compose generation, process
supervision and the `raftmq` umbrella command. Sits above the SDK; no server imports it."""
