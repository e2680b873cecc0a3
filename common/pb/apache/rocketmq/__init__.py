"""Generated wire types (scripts/gen_proto.sh)."""
