"""What feeding the data costs a training run: the step alone against loader + step, for a train.py config.

    python benchmarks/pipeline.py -c configs/imagenette_cpu.yaml                 # tensor and timm pipelines
    python benchmarks/pipeline.py -c configs/imagenette_gpu.yaml --pipeline tensor --json out.json [key=value ...]
    python benchmarks/pipeline.py -c configs/imagenette_cpu.yaml --pipeline timm "train_sizes=[48, 64, 80, 96]"
    python benchmarks/pipeline.py -c configs/imagenette_cpu.yaml --pipeline timm --source wds/imagenette=SHARDS_DIR

The config's model, batch, optimizer and loss take ``--steps`` training steps per round in three ways, interleaved
in random order each round:

- ``step``: the training step alone, on one batch fetched beforehand, with every CPU thread of the machine: what
  the model can do, the reference of every ratio;
- ``tensor``: the batched tensor pipeline (``vit_rope.data.pipeline``) feeding the step, with the threads train.py
gives;
- ``timm``: timm's per-image transforms in ``workers`` DataLoader processes feeding the step, with the threads train.py
  leaves after the workers.

Each loader is one stream over epochs that lives across rounds, as in training. Figures are medians over rounds of
images/s and patch tokens/s; the ratio is the median of per-round tokens/s ratios to ``step`` (the images/s ratio
when every step has one size). With ``train_sizes=[...]`` each pipeline draws a size per step and runs a second time
as ``<pipeline>_one_size`` at ``img_size`` (its baseline: the same pipeline, augmentations and workers), and a last
line gives each pipeline's tokens/s with ``train_sizes`` over its baseline, pooled over all rounds (tokens over
seconds: one round's few steps draw a random mix of sizes, whose batches load at different speeds); ``step`` always
takes a batch at ``img_size``. Each ``--source DATASET=DIR`` (shards, a dataset on disk: ``train.py``'s ``dataset`` and
``data_dir``) adds timm's pipeline on that copy of the data, ``timm <dataset>``, and a line of its images/s over the
config's own data through the same pipeline (the median of per-round ratios), then each source's reading of the
encoded images alone (``read_rates``).
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
from vit_rope.data import folders, splits  # noqa: E402
from vit_rope.eval.report import table  # noqa: E402
from vit_rope.models.registry import create_model  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope.train import distributed, engine, loaders  # noqa: E402
from vit_rope.train.command_line import build_config  # noqa: E402


def stream(loader: loaders.Loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of one epoch after another, as a training run draws them."""
    epoch = 0
    while True:
        loaders.set_epoch(loader, epoch)
        for images, targets, _ in loader:
            yield images, targets
        epoch += 1


def read_rates(sources: dict[str, list[folders.Sample]], rounds: int, count: int = 2000) -> dict[str, float]:
    """Images/s of reading each source's encoded bytes alone (no decoding), ``count`` random samples a round, the
    sources interleaved in random order: the part of loading that a source changes. Median over rounds."""
    rng, speeds = random.Random(0), {name: [] for name in sources}
    for _ in range(rounds):
        for name in rng.sample(list(sources), len(sources)):
            chosen = rng.sample(sources[name], min(count, len(sources[name])))
            start = time.perf_counter()
            for source, _ in chosen:
                if isinstance(source, str):
                    with open(source, "rb") as file:
                        file.read()
                else:
                    source.open().read()
            speeds[name].append(len(chosen) / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in speeds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="train.py YAML config")
    parser.add_argument("--pipeline", nargs="+", choices=("tensor", "timm"), default=["tensor", "timm"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="training steps per mode per round")
    parser.add_argument("--source", nargs="+", default=[], metavar="DATASET=DIR",
                        help="the same data as shards or a dataset (e.g. wds/imagenette=DIR), read by timm's pipeline")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for train.py")
    args = parser.parse_intermixed_args(argv)
    if args.source and "timm" not in args.pipeline:
        parser.error("--source compares with the timm pipeline on the config's data: keep timm in --pipeline")
    if any("=" not in item for item in args.source):
        parser.error("--source takes DATASET=DIR, e.g. wds/imagenette=output/shards/imagenette")
    cfg = build_config(args.config, args.overrides)
    env = distributed.init_distributed(cfg.device)
    data_dir = Path(cfg.data_dir).expanduser() if splits.dataset_kind(cfg.dataset) else folders.resolve_data_dir(
        cfg.data_dir, cfg.download_size)

    def data(dataset: str | None, root: Path) -> tuple[list[folders.Sample], list[str]]:
        return splits.find_split(root, dataset, cfg.train_split, None, "train_split", input_key=cfg.input_key,
                                 target_key=cfg.target_key)

    train_samples, classes = data(cfg.dataset, data_dir)
    val_samples = splits.find_split(data_dir, cfg.dataset, cfg.val_split, classes, input_key=cfg.input_key,
                                    target_key=cfg.target_key)[0]
    torch.manual_seed(cfg.seed)
    dynamic = {"dynamic_img_size": True} if cfg.train_sizes else {}  # as train.py builds it
    model, _ = create_model(cfg.model, {"num_classes": len(classes), "img_size": cfg.img_size,
                                        "drop_path_rate": cfg.drop_path, **dynamic, **cfg.model_kwargs})
    model.to(env.device).train()
    data_config = resolve_data_config({"input_size": (3, cfg.img_size, cfg.img_size), "crop_pct": cfg.crop_pct,
                                       "interpolation": cfg.interpolation}, model=model)
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.smoothing)

    patch = getattr(getattr(model, "patch_embed", None), "patch_size", (16, 16))

    def step(images: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
        """One training step; returns the images and patch tokens it took."""
        images, targets = engine._to_device(images, targets, cfg, env.device)
        with engine.autocast(cfg, env.device):
            loss = loss_fn(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        return len(images), len(images) * (images.shape[-2] // patch[0]) * (images.shape[-1] // patch[1])

    cores = os.cpu_count() or 1
    modes: dict[str, tuple[int, Callable[[], tuple[torch.Tensor, torch.Tensor]]]] = {}
    variants = {name: dict(pipeline=name, decoded_cache=cfg.decoded_cache or name == "tensor")
                for name in args.pipeline}
    if cfg.train_sizes:  # the same pipeline at img_size alone, for the tokens/s of variable resolution against one size
        variants |= {f"{name}_one_size": dict(variant, train_sizes=[]) for name, variant in variants.items()}
    sources = {name: (train_samples, val_samples) for name in variants}
    for item in args.source:  # the same images from shards or a dataset, through timm's per-image pipeline
        dataset, _, root = item.partition("=")
        variants[f"timm {dataset}"] = dict(pipeline="timm", decoded_cache=cfg.decoded_cache)
        sources[f"timm {dataset}"] = (data(dataset, Path(root))[0], val_samples)  # validation is not timed
    for name, variant in variants.items():
        run_cfg = dataclasses.replace(cfg, **variant)
        loader, _ = loaders.build_loaders(run_cfg, *sources[name], data_config, device=env.device)
        batches = stream(loader)
        threads = distributed.set_cpu_threads(cfg.threads, cfg.workers if variant["pipeline"] == "timm" else 0)
        modes[name] = (threads, batches.__next__)
    fixed = modes[args.pipeline[0] + ("_one_size" if cfg.train_sizes else "")][1]()  # a batch at img_size
    modes = {"step": (cores, lambda: fixed), **modes}

    rounds: dict[str, list[tuple[int, int, float]]] = {name: [] for name in modes}  # (images, tokens, s) per round
    for threads, fetch in modes.values():  # warm-up: first batches, allocator, worker start
        torch.set_num_threads(threads)
        step(*fetch())
    for _ in range(args.rounds):
        for name in random.sample(list(modes), len(modes)):
            threads, fetch = modes[name]
            torch.set_num_threads(threads)
            start = time.perf_counter()
            seen = [step(*fetch()) for _ in range(args.steps)]
            rounds[name].append((sum(n for n, _ in seen), sum(t for _, t in seen), time.perf_counter() - start))
    rates = {name: [(images / seconds, tokens / seconds) for images, tokens, seconds in values]
             for name, values in rounds.items()}  # (images/s, tokens/s) per round
    rows = [{"mode": name, "threads": modes[name][0], "images_per_s": statistics.median(r[0] for r in values),
             "tokens_per_s": statistics.median(r[1] for r in values),
             "of_step": statistics.median(r[1] / s[1] for r, s in zip(values, rates["step"], strict=True))}
            for name, values in rates.items()]
    print(f"# {args.config} {' '.join(args.overrides)}: {cfg.model} at {cfg.img_size} px, batch {cfg.batch_size}, "
          f"{env.device}, {cores} cores; median of {args.rounds} interleaved rounds x {args.steps} steps")
    print(table(["mode", "threads", "images/s", "tokens/s", "ratio to the step alone (tokens/s)"],
                [(r["mode"], r["threads"], f"{r['images_per_s']:.1f}", f"{r['tokens_per_s']:.0f}",
                  f"{r['of_step']:.3f}") for r in rows]))
    pooled = {name: sum(tokens for _, tokens, _ in values) / sum(seconds for _, _, seconds in values)
              for name, values in rounds.items()}  # tokens/s over all rounds
    sizes_ratio = {name: pooled[name] / pooled[f"{name}_one_size"] for name in args.pipeline if cfg.train_sizes}
    if sizes_ratio:
        print(f"train_sizes={cfg.train_sizes} against img_size {cfg.img_size} alone, tokens/s pooled over the "
              "rounds: " + ", ".join(f"{name} {ratio:.3f}" for name, ratio in sizes_ratio.items()))
    source_ratio = {name: statistics.median(r[0] / s[0] for r, s in zip(rates[name], rates["timm"], strict=True))
                    for name in rates if name.startswith("timm ")}
    reading = read_rates({name: sources[name][0] for name in ["timm", *source_ratio]}, args.rounds) \
        if source_ratio else {}
    if source_ratio:
        print("images/s over the same pipeline on the config's data, median of per-round ratios: "
              + ", ".join(f"{name} {ratio:.3f}" for name, ratio in source_ratio.items()))
        print("reading the encoded images alone, images/s (median of rounds): "
              + ", ".join(f"{name} {rate:.0f}" for name, rate in reading.items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "rounds": rounds,
                                               "train_sizes_ratio": sizes_ratio, "source_ratio": source_ratio,
                                               "read_images_per_s": reading},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
