"""The RoPE rotation alone: ours against a plain copy of the same tensors and against the usual implementations.

    python benchmarks/rope_kernel.py                       # ViT-S shapes at 224 px, batch 8, fp32, CPU
    python benchmarks/rope_kernel.py --device cuda --dtype bfloat16 --batch-size 64 --img-size 384 --json out.json

Input: the qkv projection output of one attention layer, ``[B, N, 3, nh, D]`` with a class token. Every
implementation rotates its q and k (patch tokens; the class token is left as it is) by the same tables:

- ``copy``: no rotation, ``q`` and ``k`` copied into a preallocated buffer; the bandwidth reference;
- ``ours_in_place``: ``vit_rope.layers.fused.rotate_qk`` without autograd: in place in the qkv buffer (eager inference),
  PyTorch backend;
- ``ours_autograd``: ``rotate_qk`` recording autograd, on a qkv tensor it may not change: a new qkv tensor, q and k
  rotated and v copied in one pass, so it moves v too (half as much again as q and k), PyTorch backend. Our models in
  training rotate in place instead, inside the projection's autograd node (``project_rotate_qk``), as
  ``ours_in_place`` does;
- ``ours_triton_in_place``, ``ours_triton_autograd``: the same with the Triton kernels (CUDA only);
- ``ours_reference``: ``vit_rope.layers.rotary.apply_rope`` on q and k, out of place (what torch.compile fuses);
- ``complex_rope_vit``: RoPE-ViT's ``apply_rotary_emb`` (fp32 complex product, class token sliced off and written
  back);
- ``timm_rot_embed_cat``: timm's ``apply_rot_embed_cat`` as its Eva attention calls it (prefix sliced off and
  concatenated back, sin/cos table concatenated);
- ``build_tables``: not a rotation but the ``(cos, sin)`` tables themselves, built from the grid as the model does on
  every forward (positions, resolution policy, angles, prefix row): the price of keeping no table cache.

Rounds interleave the implementations; each figure is the median over rounds. On CUDA a round times each call with
``triton.testing.do_bench`` (CUDA events, L2 flushed before every call, launches queued behind the flush): a ViT-S
q and k at batch 128 fit the H100's 50 MB L2, and back-to-back calls on one buffer would measure the cache, not
memory. On CPU a round is ``--iters`` calls on the host clock. Bandwidth counts reading and writing q and k once (the
least any implementation must move), so "of copy" is the fraction of the copy's bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timm.layers import apply_rot_embed_cat
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vit_rope.encodings.base import image_coords  # noqa: E402
from vit_rope.encodings.rope.tables import RoPE2D  # noqa: E402
from vit_rope.eval.report import table  # noqa: E402
from vit_rope.layers import triton_rope  # noqa: E402
from vit_rope.layers.fused import rotate_qk  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope.layers.rotary import apply_rope, grid_positions  # noqa: E402


def split(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``[B, N, 3, nh, D] -> q, k, v`` each ``[B, nh, N, D]`` (views), as timm's attention does."""
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def _with_grad(fn: Callable[..., Tensor], *args: Tensor) -> Tensor:
    with torch.enable_grad():
        return fn(*args)


def implementations(qkv: Tensor, cos: Tensor, sin: Tensor) -> dict[str, Callable[[], object]]:
    """Zero-argument calls, one per implementation, on the same buffer and tables (prefix row 0 is identity)."""
    q, k, _ = split(qkv)
    out = torch.empty_like(qkv[:, :, :2])
    tracked = qkv.clone().requires_grad_()
    freqs_cis = torch.polar(torch.ones_like(cos[:, 1:]), torch.atan2(sin[:, 1:], cos[:, 1:]))  # [H, N-1, D/2]
    timm_emb = torch.cat((sin[:, 1:], cos[:, 1:]), -1).repeat_interleave(2, -1).to(qkv.dtype)  # [H, N-1, 2D] sin|cos

    def complex_rope_vit() -> tuple[Tensor, Tensor]:  # RoPE-ViT models/vit_rope.py: apply_rotary_emb
        xq, xk = q[:, :, 1:], k[:, :, 1:]
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        qo = torch.cat((q[:, :, :1], torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)), dim=2)
        ko = torch.cat((k[:, :, :1], torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)), dim=2)
        return qo, ko

    def timm_cat() -> tuple[Tensor, Tensor]:  # timm eva.py EvaAttention with a RotaryEmbeddingCat table
        qo = torch.cat((q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], timm_emb)), dim=2)
        ko = torch.cat((k[:, :, :1], apply_rot_embed_cat(k[:, :, 1:], timm_emb)), dim=2)
        return qo, ko

    calls = {"copy": lambda: out.copy_(qkv[:, :, :2])}
    for backend in ("torch", "triton") if triton_rope.supports(qkv, cos) else ("torch",):
        suffix = "" if backend == "torch" else "_triton"
        calls[f"ours{suffix}_in_place"] = functools.partial(rotate_qk, qkv, cos, sin, backend)
        calls[f"ours{suffix}_autograd"] = functools.partial(_with_grad, rotate_qk, tracked, cos, sin, backend)
    calls |= {
        "ours_reference": lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
        "complex_rope_vit": complex_rope_vit,
        "timm_rot_embed_cat": timm_cat,
    }
    return calls


def timer(device: torch.device, iters: int) -> Callable[[Callable[[], object]], float]:
    """Seconds per call: CUDA events around each call with a cold L2 (do_bench) on CUDA, the host clock on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench  # CUDA builds of torch bring triton

        return lambda fn: do_bench(fn, warmup=5, rep=20, return_mode="median") / 1e3

    def host(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters

    return host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--kind", choices=("axial", "mixed"), default="mixed", help="shared or per-head tables")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--num-heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20, help="calls per implementation per round (CPU)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    side = args.img_size // 16
    B, N, nh, D = args.batch_size, side * side + 1, args.num_heads, args.head_dim
    qkv = torch.randn(B, N, 3, nh, D, device=device, dtype=dtype)
    rope = RoPE2D(D, nh, args.kind).to(device)
    with torch.no_grad():
        cos, sin = rope(grid_positions(side, side, device=device), num_prefix_tokens=1)  # [H, N, D/2]
    calls = implementations(qkv, cos, sin)
    coord, grids = image_coords(side, side, device)
    calls["build_tables"] = lambda: rope(rope.place(coord, grids), 1, grids)  # as a model's forward builds them

    seconds = timer(device, args.iters)
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for call in calls.values():  # warm-up
            call()
        for _ in range(args.rounds):
            for name in random.sample(list(calls), len(calls)):
                times[name].append(seconds(calls[name]))
    moved = 2 * 2 * B * N * nh * D * qkv.element_size()  # read + write of q and k
    medians = {name: statistics.median(values) for name, values in times.items()}
    rows = [{"impl": name, "us": medians[name] * 1e6, "gb_s": moved / medians[name] / 1e9,
             "of_copy": medians["copy"] / medians[name]} for name in calls]
    print(f"# {device} {args.dtype} {args.kind}: qkv {list(qkv.shape)}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} interleaved rounds"
          + (" (do_bench, L2 flushed)" if device.type == "cuda" else f" x {args.iters} calls"))
    print(table(["implementation", "time (us)", "GB/s (q, k read + written)", "fraction of copy bandwidth"],
                [(r["impl"], f"{r['us']:.1f}", f"{r['gb_s']:.1f}", f"{r['of_copy']:.2f}") for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
