"""Generated wire types: run scripts/gen_proto.sh; only this file is committed."""
