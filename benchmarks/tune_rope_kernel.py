"""Tune the Triton rotation kernel: a BLOCK_T x num_warps sweep of every pass, checked against the default launch.

    python benchmarks/tune_rope_kernel.py --device cuda --json out.json   # ViT-S shapes, bf16, batch 128, 224 + 384
    python benchmarks/tune_rope_kernel.py --device cpu                    # tiny shapes, Triton's interpreter, no timing

``vit_rope.layers.triton_rope._launch`` picks ``BLOCK_T = 2048 // (2 * BLOCK_J)`` tokens per program and Triton's
default of 4 warps, a guess that has not been measured on a GPU. This script calls ``_launch`` with other values of
those two, for each pass our models make:

- ``infer_in_place``: q and k rotated in the qkv buffer (eager inference);
- ``train_forward``: a new qkv, q and k rotated and v copied (``rotate_qk`` recording autograd);
- ``backward``: the same with the conjugate table (the gradient of either forward);
- ``backward_table_grad`` (``mixed`` only, learned tables): the backward that also reads the forward output and
  writes the fp32 table gradients.

Every config's output is compared with ``_launch``'s: bitwise for the rotated tensor, to 1e-5 for the table
gradients; a config that differs is printed as MISMATCH and makes the exit status 1. On CUDA each launch is timed by
``triton.testing.do_bench`` (median) beside a plain copy of the same qkv tensor, the bandwidth reference of
``benchmarks/rope_kernel.py``. Without CUDA the kernel runs through Triton's interpreter, as ``_launch`` runs it on
CPU tensors: only the agreement is checked (no timing), on tiny shapes, which is what the unit test runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import describe_machine  # noqa: E402
from vit_rope.encodings.rope.tables import RoPE2D  # noqa: E402
from vit_rope.eval import report
from vit_rope.layers import triton_rope  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope.layers.rotary import grid_positions  # noqa: E402

if triton_rope.AVAILABLE:
    import triton
    import triton.testing

# defaults per device: ViT-S (6 heads of 64) at batch 128 on CUDA; shapes the interpreter runs in seconds elsewhere
DEFAULTS = {
    "cuda": {"img_sizes": [224, 384], "batch_size": 128, "num_heads": 6, "head_dim": 64,
             "block_t": [8, 16, 32, 64, 128], "num_warps": [1, 2, 4, 8]},
    "cpu": {"img_sizes": [32], "batch_size": 1, "num_heads": 2, "head_dim": 8, "block_t": [4, 8], "num_warps": [4]},
}


class Pass(NamedTuple):
    """One kernel pass: its launch flags, whether it writes into its input, and the bytes it must move."""

    conj: bool
    copy_v: bool
    table_grad: bool
    inplace: bool
    moved: int


def default_config(head_dim: int) -> tuple[int, int]:
    """``(BLOCK_T, num_warps)`` that ``triton_rope._launch`` uses for this head size (Triton's default: 4 warps)."""
    return triton_rope.default_block_t(head_dim), 4


def launch(src: Tensor, dst: Tensor, cos: Tensor, sin: Tensor, spec: Pass, out: Tensor | None, block_t: int,
           num_warps: int) -> tuple[Tensor, ...] | None:
    """``triton_rope._launch`` of ``spec`` with BLOCK_T and num_warps given; the table gradients when
    ``spec.table_grad``."""
    return triton_rope._launch(src, dst, cos, sin, conj=spec.conj, copy_v=spec.copy_v,
                               out=out if spec.table_grad else None, block_t=block_t, num_warps=num_warps)


def passes(kind: str, qkv: Tensor, cos: Tensor) -> dict[str, Pass]:
    """The kernel's passes in our models, each with the bytes it reads and writes at the least."""
    B, N, _, nh, D = qkv.shape
    act = B * N * nh * D * qkv.element_size()  # one of q, k, v
    table = cos.numel() * cos.element_size() * 2
    rows = {
        "infer_in_place": Pass(conj=False, copy_v=False, table_grad=False, inplace=True, moved=4 * act + table),
        "train_forward": Pass(conj=False, copy_v=True, table_grad=False, inplace=False, moved=6 * act + table),
        "backward": Pass(conj=True, copy_v=True, table_grad=False, inplace=False, moved=6 * act + table),
    }
    if kind == "mixed":  # learned tables: the backward also reads y (q, k) and writes the fp32 table gradients
        grads = 2 * B * nh * N * (D // 2) * 4
        rows["backward_table_grad"] = Pass(conj=True, copy_v=True, table_grad=True, inplace=False,
                                           moved=8 * act + table + grads)
    return rows


def reference(spec: Pass, qkv: Tensor, y: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, tuple[Tensor, ...] | None]:
    """The default launch, ``triton_rope._launch`` itself with its own block sizes: what every config must match."""
    src = qkv.clone()
    dst = src if spec.inplace else torch.empty_like(src)
    grads = triton_rope._launch(src, dst, cos, sin, conj=spec.conj, copy_v=spec.copy_v,
                                out=y if spec.table_grad else None)
    return dst, grads


def matches(got: tuple[Tensor, tuple[Tensor, ...] | None], want: tuple[Tensor, tuple[Tensor, ...] | None]) -> bool:
    """Bitwise equal outputs and table gradients within 1e-5 (fp32 sums whose order depends on the tile)."""
    if not torch.equal(got[0], want[0]):
        return False
    return want[1] is None or all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got[1], want[1],
                                                                                              strict=True))


def sweep(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One row per (kind, size, pass, config); per (kind, size, pass) on CUDA, the best config against the default."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    configs = [(block_t, warps) for block_t in args.block_t for warps in args.num_warps]
    default = default_config(args.head_dim)
    B, nh, D = args.batch_size, args.num_heads, args.head_dim
    rows, summary = [], []
    torch.manual_seed(0)

    def bench(fn: Any) -> float:  # microseconds, median
        return triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median") * 1e3

    for kind in args.kinds:
        for size in args.img_sizes:
            side = size // 16
            N = side * side + 1
            rope = RoPE2D(D, nh, kind).to(device)
            with torch.no_grad():
                cos, sin = rope(grid_positions(side, side, device=device), num_prefix_tokens=1)
            base_qkv = torch.randn(B, N, 3, nh, D, device=device, dtype=dtype)
            y = torch.randn_like(base_qkv)  # the forward output a table-gradient backward reads
            copy_dst = torch.empty_like(base_qkv)
            copy_gb_s = 2 * base_qkv.nbytes / bench(lambda: copy_dst.copy_(base_qkv)) / 1e3 if cuda else None  # noqa: B023
            for name, spec in passes(kind, base_qkv, cos).items():
                want = reference(spec, base_qkv, y, cos, sin)
                timings = {}
                for block_t, warps in configs:
                    qkv = base_qkv.clone()
                    dst = qkv if spec.inplace else torch.empty_like(qkv)
                    ok = matches((dst, launch(qkv, dst, cos, sin, spec, y, block_t, warps)), want)
                    us = None
                    if cuda:  # in place: the input changes between calls, which the kernel's time does not see
                        us = timings[(block_t, warps)] = bench(
                            lambda: launch(qkv, dst, cos, sin, spec, y, block_t, warps))  # noqa: B023
                    gb_s = None if us is None else spec.moved / us / 1e3
                    rows.append({"kind": kind, "img_size": size, "batch": B, "pass": name, "block_t": block_t,
                                 "num_warps": warps, "us": us, "gb_s": gb_s, "copy_gb_s": copy_gb_s,
                                 "of_copy": None if gb_s is None else gb_s / copy_gb_s, "matches_default": ok})
                    if not ok:
                        print(f"MISMATCH {kind} {size} {name} BLOCK_T={block_t} num_warps={warps}", flush=True)
                if timings:
                    best = min(timings, key=timings.get)
                    base_us = timings.get(default)
                    summary.append({"kind": kind, "img_size": size, "pass": name, "default": list(default),
                                    "default_us": base_us, "best": list(best), "best_us": timings[best],
                                    "speedup": None if base_us is None else base_us / timings[best],
                                    "best_of_copy": spec.moved / timings[best] / 1e3 / copy_gb_s})
    return rows, summary


def table(summary: list[dict[str, Any]]) -> str:
    """Markdown: per pass, the default config's time against the best config's."""
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    return report.table(
        ["kind", "size", "pass", "default (BLOCK_T, warps) us", "best (BLOCK_T, warps)", "best us", "speedup",
         "best of copy GB/s"],
        [(s["kind"], s["img_size"], s["pass"], f"{tuple(s['default'])} {num(s['default_us'], '.1f')}",
          tuple(s["best"]), f"{s['best_us']:.1f}", num(s["speedup"], ".2f"), f"{s['best_of_copy']:.2f}")
         for s in summary])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda: time and check; cpu: check only, through Triton's interpreter")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--kinds", nargs="+", choices=("axial", "mixed"), default=["axial", "mixed"],
                        help="shared or per-head tables")
    parser.add_argument("--img-sizes", type=int, nargs="+", help="16 px patches (default: 224 384 on CUDA, 32 on CPU)")
    parser.add_argument("--batch-size", type=int, help="default: 128 on CUDA, 1 on CPU")
    parser.add_argument("--num-heads", type=int, help="default: 6 on CUDA, 2 on CPU")
    parser.add_argument("--head-dim", type=int, help="default: 64 on CUDA, 8 on CPU")
    parser.add_argument("--block-t", type=int, nargs="+",
                        help="tokens per program (default: 8 16 32 64 128 on CUDA, 4 8 on CPU)")
    parser.add_argument("--num-warps", type=int, nargs="+", help="default: 1 2 4 8 on CUDA, 4 on CPU")
    parser.add_argument("--warmup-ms", type=int, default=10, help="do_bench warm-up per config")
    parser.add_argument("--rep-ms", type=int, default=50, help="do_bench timed repetitions per config")
    parser.add_argument("--json", help="also write the rows, the summary and the machine to this file")
    args = parser.parse_args(argv)
    if not triton_rope.AVAILABLE:
        parser.error("triton is not installed: CUDA builds of torch bring it, else pip install triton")
    defaults = DEFAULTS["cuda" if torch.device(args.device).type == "cuda" else "cpu"]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    machine = {**describe_machine(),
               "command": " ".join(sys.argv) if argv is None else " ".join(["benchmarks/tune_rope_kernel.py", *argv])}
    print(f"# {machine}", flush=True)
    rows, summary = sweep(args)
    if summary:
        print(table(summary))
    bad = [row for row in rows if not row["matches_default"]]
    print(f"{len(rows)} configs run on {args.device}, {len(bad)} differ from the default launch "
          f"{default_config(args.head_dim)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "args": vars(args), "default": list(
            default_config(args.head_dim)), "summary": summary, "rows": rows}, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
