"""``python -m vit_rope.evaluate``: ``vit_rope.eval.command``'s command."""

from vit_rope.eval.command import main

if __name__ == "__main__":
    raise SystemExit(main())
