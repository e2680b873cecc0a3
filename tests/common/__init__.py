"""Tests of raftmq.common."""
