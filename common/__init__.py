"""The floor under raftmq's servers and SDK: wire types, the error table, settings, channel
options, shared value types, the message model, the record codec and the filters.

Imports grpcio and protobuf only; starts no threads and imports nothing above it."""
