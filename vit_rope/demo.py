"""A first look at vit-rope: build the RoPE-ViT models through timm and run them at several input sizes.

One model trained at 224 px runs unchanged at other sizes because RoPE depends only on the offsets between patches
(RoPE-ViT, Heo et al., ECCV 2024): the rotation tables are rebuilt for each grid, nothing is resampled.
"""

from __future__ import annotations

import argparse
import time

import timm
import torch

from . import registry  # noqa: F401  (registers the models)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit_rope_small_patch16_axial_224",
                                                        "vit_rope_small_patch16_mixed_224"])
    parser.add_argument("--sizes", nargs="+", default=["224", "320", "384", "512", "224x320"],
                        help="square sizes (N) or HxW, multiples of 16")
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args(argv)

    sizes = [tuple(int(v) for v in s.split("x")) if "x" in s else (int(s), int(s)) for s in args.sizes]
    torch.manual_seed(0)
    print(f"{'model':40s} {'input':>9s} {'tokens':>6s} {'logits':>10s} {'ms/img':>7s}")
    for name in args.models:
        model = timm.create_model(name).eval()
        for h, w in sizes:
            x = torch.randn(args.batch_size, 3, h, w)
            with torch.inference_mode():
                start = time.perf_counter()
                logits = model(x)
                ms = (time.perf_counter() - start) * 1000 / args.batch_size
            tokens = (h // 16) * (w // 16)
            print(f"{name:40s} {f'{h}x{w}':>9s} {tokens:6d} {str(tuple(logits.shape)):>10s} {ms:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
