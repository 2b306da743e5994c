"""Training cost of candidate study models on this machine: tokens/s of a training step and minutes per epoch.

    python benchmarks/study_budget.py                      # the study v3 candidates: 14x14 grid (patch 8 at 112 px)
    python benchmarks/study_budget.py --widths 192 --depths 4 6 --json results/imagenette/v3/budget.json

A study has to fit a CPU-hour budget before it starts, so this measures what decides its model: one AdamW training
step (forward, backward, update) of a RoPE-Mixed ViT (the costliest arm: per-block tables with gradients) on random
images, for every width x depth, in rounds that visit the candidates in a new random order (shared drifts). An epoch
is projected as ``train_images / images_per_s`` plus one validation pass at a third of the training cost per image;
the study hours as ``runs x epochs x minutes``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import vit_rope  # noqa: E402,F401  (registers the vit_rope_* models)
from benchmarks.machine import describe_machine  # noqa: E402
from vit_rope.eval import report  # noqa: E402
from vit_rope.train.distributed import set_cpu_threads  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 192], help="embed dims (head dim 64)")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--img-size", type=int, default=112)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per candidate and round")
    parser.add_argument("--train-images", type=int, default=9469, help="images per epoch (Imagenette's train split)")
    parser.add_argument("--val-images", type=int, default=3925)
    parser.add_argument("--epochs", type=int, nargs="+", default=[20, 30, 40], help="epochs to project hours for")
    parser.add_argument("--runs", type=int, default=6, help="training runs in the study (arms x seeds)")
    parser.add_argument("--json", type=Path, help="write the measurement here")
    args = parser.parse_args(argv)
    for width in args.widths:
        if width % 64:
            parser.error(f"--widths {width}: the width must be a multiple of the head dim 64 (e.g. 128, 192)")
    set_cpu_threads(0, workers=0)
    torch.manual_seed(0)
    size, batch = args.img_size, args.batch_size
    images = torch.randn(batch, 3, size, size)
    targets = torch.randint(0, 10, (batch,))
    candidates = {}
    for width in args.widths:
        for depth in args.depths:
            model = timm.create_model("vit_rope_tiny_patch16_mixed_224", num_classes=10, img_size=size,
                                      patch_size=args.patch_size, embed_dim=width, num_heads=width // 64, depth=depth)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            candidates[(width, depth)] = (model.train(), optimizer)

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        loss = torch.nn.functional.cross_entropy(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for model, optimizer in candidates.values():  # warm-up
        step(model, optimizer)
    per_round: dict[tuple[int, int], list[float]] = {key: [] for key in candidates}
    for _ in range(args.rounds):
        for key in random.sample(list(candidates), len(candidates)):
            start = time.perf_counter()
            for _ in range(args.steps):
                step(*candidates[key])
            per_round[key].append(args.steps * batch / (time.perf_counter() - start))

    tokens = (size // args.patch_size) ** 2 + 1
    rows = []
    for (width, depth), rates in per_round.items():
        ips = statistics.median(rates)
        minutes = (args.train_images / ips + args.val_images / (3 * ips)) / 60
        rows.append(dict(width=width, depth=depth, images_per_s=round(ips, 1), tokens_per_s=round(ips * tokens),
                         minutes_per_epoch=round(minutes, 2),
                         study_hours={str(e): round(args.runs * e * minutes / 60, 1) for e in args.epochs}))
    header = ["width", "depth", "images/s", "tokens/s", "min/epoch", *(f"h ({args.runs}x{e} ep)" for e in args.epochs)]
    print(report.table(header, [[r["width"], r["depth"], r["images_per_s"], r["tokens_per_s"], r["minutes_per_epoch"],
                                 *r["study_hours"].values()] for r in rows]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        setup = {key: getattr(args, key) for key in ("img_size", "patch_size", "batch_size", "rounds", "steps",
                                                      "train_images", "val_images", "runs")}
        args.json.write_text(json.dumps({"machine": describe_machine(), "setup": setup, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
