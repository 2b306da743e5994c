"""What feeding the data costs a training run: the step alone against loader + step, for a train.py config.

    python benchmarks/pipeline.py -c configs/imagenette_cpu.yaml                 # tensor and timm pipelines
    python benchmarks/pipeline.py -c configs/imagenette_gpu.yaml --pipeline tensor --json out.json [key=value ...]

The config's model, batch, optimizer and loss take ``--steps`` training steps per round in three ways, interleaved
in random order each round:

- ``step``: the training step alone, on one batch fetched beforehand, with every CPU thread of the machine: what
  the model can do, the reference of every ratio;
- ``tensor``: the batched tensor pipeline (``vit_rope.pipeline``) feeding the step, with the threads train.py gives;
- ``timm``: timm's per-image transforms in ``workers`` DataLoader processes feeding the step, with the threads train.py
  leaves after the workers.

Each loader is one stream over epochs that lives across rounds, as in training. Figures are medians over rounds of
images/s, and the ratio is the median of per-round ratios to ``step``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from timm.data import resolve_data_config
from timm.optim import create_optimizer_v2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope import data, engine  # noqa: E402
from vit_rope.config import build_config  # noqa: E402


def stream(loader, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of one epoch after another, as a training run draws them."""
    epoch = 0
    while True:
        data.set_epoch(loader, epoch, seed, 0)
        for images, targets, _ in loader:
            yield images, targets
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="train.py YAML config")
    parser.add_argument("--pipeline", nargs="+", choices=("tensor", "timm"), default=["tensor", "timm"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="training steps per mode per round")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for train.py")
    args = parser.parse_args(argv)
    cfg = build_config(args.config, args.overrides)
    env = engine.init_distributed(cfg.device)
    data_dir = data.resolve_data_dir(cfg.data_dir, cfg.download_size)
    train_samples, classes = data.find_images(data_dir / "train")
    val_samples, _ = data.find_images(data_dir / cfg.val_split, classes, split_key="val_split")
    torch.manual_seed(cfg.seed)
    model, _ = train.create_model(cfg.model, {"num_classes": len(classes), "img_size": cfg.img_size,
                                              "drop_path_rate": cfg.drop_path, **cfg.model_kwargs})
    model.to(env.device).train()
    data_config = resolve_data_config({"input_size": (3, cfg.img_size, cfg.img_size), "crop_pct": cfg.crop_pct,
                                       "interpolation": cfg.interpolation}, model=model)
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.smoothing)

    def step(images: torch.Tensor, targets: torch.Tensor) -> None:
        images, targets = engine._to_device(images, targets, cfg, env.device)
        with engine.autocast(cfg, env.device):
            loss = loss_fn(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if env.device.type == "cuda":
            torch.cuda.synchronize()

    cores = os.cpu_count() or 1
    modes: dict[str, tuple[int, Callable[[], tuple[torch.Tensor, torch.Tensor]]]] = {}
    for name in args.pipeline:
        run_cfg = dataclasses.replace(cfg, pipeline=name, decoded_cache=cfg.decoded_cache or name == "tensor")
        loader, _ = data.build_loaders(run_cfg, train_samples, val_samples, data_config, device=env.device)
        batches = stream(loader, cfg.seed)
        threads = engine.set_cpu_threads(cfg.threads, cfg.workers if name == "timm" else 0)
        modes[name] = (threads, batches.__next__)
    fixed = next(iter(modes.values()))[1]()
    modes = {"step": (cores, lambda: fixed), **modes}

    times: dict[str, list[float]] = {name: [] for name in modes}
    for threads, fetch in modes.values():  # warm-up: first batches, allocator, worker start
        torch.set_num_threads(threads)
        step(*fetch())
    for _ in range(args.rounds):
        for name in random.sample(list(modes), len(modes)):
            threads, fetch = modes[name]
            torch.set_num_threads(threads)
            start = time.perf_counter()
            for _ in range(args.steps):
                step(*fetch())
            times[name].append(args.steps * cfg.batch_size / (time.perf_counter() - start))
    rows = [{"mode": name, "threads": modes[name][0], "images_per_s": statistics.median(values),
             "of_step": statistics.median(v / s for v, s in zip(values, times["step"], strict=True))}
            for name, values in times.items()]
    print(f"# {args.config} {' '.join(args.overrides)}: {cfg.model} at {cfg.img_size} px, batch {cfg.batch_size}, "
          f"{env.device}, {cores} cores; median of {args.rounds} interleaved rounds x {args.steps} steps")
    print("| mode | threads | images/s | ratio to the step alone |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['threads']} | {row['images_per_s']:.1f} | {row['of_step']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
