"""``python -m vit_rope.export``: ``vit_rope.eval.onnx``'s command."""

from vit_rope.eval.onnx import main

if __name__ == "__main__":
    raise SystemExit(main())
