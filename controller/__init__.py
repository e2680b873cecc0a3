"""raftmq controller package."""
