"""``python -m vit_rope.shards`` and ``vit-rope-shards``: an image folder written as WebDataset shards in timm's layout
(``vit_rope.data.shard_writer``).
"""

import sys

from vit_rope.data.shard_writer import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
