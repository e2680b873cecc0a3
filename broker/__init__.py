"""raftmq broker package."""
