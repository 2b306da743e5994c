"""``python -m vit_rope.diagnose`` and ``vit-rope-diagnose``: frequency coverage, learned directions and attention
entropy of a trained or pretrained model.

The command lives in ``vit_rope.eval.diagnostics``; this module keeps the name users type.
"""

import sys

from vit_rope.eval.diagnostics import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
