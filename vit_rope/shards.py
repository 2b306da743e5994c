"""``python -m vit_rope.shards``: ``vit_rope.data.shard_writer``'s command."""

from vit_rope.data.shard_writer import main

if __name__ == "__main__":
    raise SystemExit(main())
