"""raftmq proxy: the RocketMQ 5 gRPC API."""
