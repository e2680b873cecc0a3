"""Test harnesses: processes, local Raft clusters and helpers used only by the tests."""
