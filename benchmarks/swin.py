"""Images/s and memory of RoPE-Swin-T against timm's Swin-T (relative position bias) and RoPE-ViT's official RoPE-Swin
code on the same weights, measured in one interleaved run.

    python benchmarks/swin.py --json results/performance/swin_cpu.json     # 224 px, batch 8, infer + train, CPU

Models (Swin-T widths, 224 px, window 7): timm's ``swin_tiny_patch4_window7_224`` (the baseline), ours
``swin_rope_{axial,mixed}_tiny_patch4_window7_224`` and the official ``RoPESwinTransformer`` of each kind (the copy of
its code at a pinned commit in ``tests/helpers/rope_swin_official.py``) with our model's weights converted into it,
checked equal in logits before timing (``TOLERANCE``), and, as a bound, the official mixed model with its attention
taken out (``NoAttention``: the same projections, the values passed through), which no way of computing the attention
can beat: its ratio to the official model is the largest speed-up over the official code that a faster attention
could give. Drop-path off everywhere. Timing as ``benchmarks/throughput.py``
(every model in each round in a new random order, medians of per-round images/s, ratios as medians of per-round
ratios); memory is the bytes autograd saves in a training step (``activation_bytes``). Targets (``TARGETS``): ours
>= 0.95x timm's Swin-T and >= 1.2x the official code in both modes, activation memory <= timm's.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import vit_rope  # noqa: E402,F401  (registers the models)
from benchmarks.throughput import (  # noqa: E402
    activation_bytes,
    against,
    interleaved_speeds,
    paired_ratio,
    prepare,
    setup_machine,
    table,
)
from helpers import rope_swin_official as official  # noqa: E402
from vit_rope.train.distributed import flushed_subnormals  # noqa: E402

BASELINE = "swin_tiny_patch4_window7_224"
KINDS = ("axial", "mixed")
TARGETS = {"timm": 0.95, "official": 1.2}  # least ratio of ours to each, in both modes
TOLERANCE = 1e-4


BOUND = "official_mixed_no_attention"


class NoAttention(nn.Module):
    """An official window attention without the attention: its qkv and output projections, the values passed through
    (no rotation, scores, mask or softmax). A model of these is the bound on any attention's speed."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.qkv, self.proj = attention.qkv, attention.proj

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(self.qkv(x).unflatten(-1, (3, -1))[:, :, 2])  # [nW B, N, C]: the values


def build(img_size: int, smoke: bool) -> dict[str, nn.Module]:
    """timm's Swin-T, ours of each kind, the official model of each kind holding our weights, and the bound."""
    shape = dict(embed_dim=32, depths=(2, 2), num_heads=(1, 2)) if smoke else {}
    torch.manual_seed(0)
    models = {BASELINE: timm.create_model(BASELINE, img_size=img_size, drop_path_rate=0.0, **shape)}
    for kind in KINDS:
        ours = timm.create_model(f"swin_rope_{kind}_tiny_patch4_window7_224", img_size=img_size, drop_path_rate=0.0,
                                 **shape)
        theirs = official.RoPESwinTransformer(
            img_size=img_size, drop_path_rate=0.0, rope_theta=ours.layers[0].blocks[0].attn.rope.theta,
            rope_mixed=kind == "mixed", **{"embed_dim": 96, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
                                           **{k: list(v) if isinstance(v, tuple) else v for k, v in shape.items()}})
        theirs.load_state_dict(official_state(ours), strict=False)
        check_equal(ours, theirs, img_size)
        models[f"swin_rope_{kind}_tiny"] = ours
        models[f"official_{kind}_tiny"] = theirs
    bound = copy.deepcopy(models["official_mixed_tiny"])
    for stage in bound.layers:
        for block in stage.blocks:
            block.attn = NoAttention(block.attn)
    models[BOUND] = bound
    return models


def official_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our RoPE-Swin's weights in the official layout: downsampling at the end of the previous stage, ``head``,
    mixed frequencies at ``attn.rope_freqs`` (axial ones are the official model's own buffer)."""
    out = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if parts[0] == "layers" and parts[2] == "downsample":
            key = ".".join(["layers", str(int(parts[1]) - 1), *parts[2:]])
        key = key.replace("head.fc.", "head.").replace("attn.rope.freqs", "attn.rope_freqs")
        out[key] = value
    return out


def check_equal(ours: nn.Module, theirs: nn.Module, img_size: int) -> None:
    images = torch.randn(2, 3, img_size, img_size)
    with torch.no_grad():
        diff = (ours.eval()(images) - theirs.eval()(images)).abs().max().item()
    if diff > TOLERANCE:
        raise SystemExit(f"error: our RoPE-Swin and the official one differ by {diff:.2e} on the same weights")


def benchmark(args: argparse.Namespace) -> list[dict[str, Any]]:
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    models = build(args.img_size, args.smoke)
    rows = []
    for mode in args.modes:
        steps = prepare(models, images, mode, False, args.warmup)
        speeds = interleaved_speeds(steps, models, mode, args.batch_size, args.rounds, args.steps,
                                    torch.device("cpu"))
        memory = {name: activation_bytes(model, steps[name]) / 2**20 for name, model in models.items()
                  if mode == "train"}
        for name in models:
            row = {"model": name, "img_size": args.img_size, "batch_size": args.batch_size, "mode": mode,
                   "compiled": False, "images_per_s": statistics.median(speeds[name]),
                   "ratio": paired_ratio(speeds[name], speeds[BASELINE]), "rounds": speeds[name]}
            if name in memory:
                row["activation_mib"] = memory[name]
            if name.startswith("swin_rope_"):
                kind = name.split("_")[2]
                row["ratio_to_official"] = paired_ratio(speeds[name], speeds[f"official_{kind}_tiny"])
                row.update(against(row["ratio"], TARGETS["timm"]))
                row["official"] = against(row["ratio_to_official"], TARGETS["official"])
                if name in memory:
                    row["memory"] = against(memory[name] / memory[BASELINE], 1.0, at_most=True)
            rows.append(row)
        print(table([r for r in rows if r["mode"] == mode]), flush=True)
        bound = paired_ratio(speeds[BOUND], speeds["official_mixed_tiny"])
        for row in rows:
            if row["mode"] == mode and "official" in row:
                print(f"{row['model']} {mode}: {row['ratio_to_official']:.2f}x the official code "
                      f"({'PASS' if row['official']['pass'] else 'MISS'} >= {TARGETS['official']})", flush=True)
            if row["mode"] == mode and row["model"] == BOUND:
                row["ratio_to_official"] = bound
        print(f"without any attention the official mixed model runs {bound:.2f}x as fast ({mode}): no attention can "
              "make a model faster than that", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--modes", nargs="+", choices=("infer", "train"), default=["infer", "train"])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per model before the rounds")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true", help="two small stages instead of Swin-T, for a test")
    parser.add_argument("--json", help="also write the rows, targets and machine to this file")
    args = parser.parse_args(argv)
    machine = setup_machine(args.threads, batch_size=args.batch_size, rounds=args.rounds, steps=args.steps)
    print(f"# {machine}", flush=True)
    with flushed_subnormals():
        rows = benchmark(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine, "targets": TARGETS, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
