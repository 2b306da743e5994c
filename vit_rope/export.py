"""``python -m vit_rope.export`` and ``vit-rope-export``: ONNX export with dynamic batch, height and width, checked with
ONNX Runtime; the command lives in ``vit_rope.eval.onnx``.
"""

import sys

from vit_rope.eval.onnx import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
