"""``python -m vit_rope.diagnose``: ``vit_rope.eval.diagnostics``'s command."""

from vit_rope.eval.diagnostics import main

if __name__ == "__main__":
    raise SystemExit(main())
