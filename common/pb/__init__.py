"""Wire types generated from proto/raftmq/*.proto by scripts/gen_proto.sh and committed
(`scripts/gen_proto.sh --check` in `make lint` keeps them equal to a fresh generation)."""
