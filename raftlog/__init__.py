"""raftmq raftlog package."""
