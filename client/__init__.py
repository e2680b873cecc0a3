"""raftmq client package."""
