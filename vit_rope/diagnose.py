"""``python -m vit_rope.diagnose`` and ``vit-rope-diagnose``: frequency coverage, learned directions and attention
entropy of a model; the command lives in ``vit_rope.eval.diagnostics``.
"""

import sys

from vit_rope.eval.diagnostics import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
