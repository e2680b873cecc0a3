"""raftmq chaos package."""
