"""raftmq namesrv package."""
