"""raftmq spark_source package."""
