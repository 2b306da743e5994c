"""``python -m vit_rope.shards``: ``vit_rope.data.shard_writer``'s command."""

import sys

from vit_rope.data.shard_writer import main

if __name__ == "__main__":
    sys.exit(main())
