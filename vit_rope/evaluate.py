"""``python -m vit_rope.evaluate`` and ``vit-rope-evaluate``: accuracy against input resolution under every RoPE
resolution policy; the command lives in ``vit_rope.eval.command``.
"""

import sys

from vit_rope.eval.command import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
