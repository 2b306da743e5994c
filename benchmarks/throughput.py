"""Images/s and memory of RoPE ViTs against the same ViT without RoPE, measured in one run.

    python benchmarks/throughput.py                                   # ViT-S, 224 and 384, infer + train, CPU
    python benchmarks/throughput.py --family base --device cuda --amp --compile both --json out.json
    python benchmarks/throughput.py --family dinov3 --img-sizes 224 512   # DINOv3 ViT-S/16: ours against timm's port

Each round runs every model in turn (a new random order per round) for ``--steps`` timed steps after its warm-up, so
that the models share the machine's drifts and bursts; a model's figure is the median of its per-round images/s, and
its ratio to the baseline is the median of the per-round ratios (paired within a round). Memory is the peak of a
training step: CUDA's allocator peak on GPUs, and everywhere the bytes of the distinct tensors autograd saves for
backward (activation memory; weights, gradients and optimizer state are the same across models).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import vit_rope  # noqa: E402,F401  (registers the vit_rope_* models)
from vit_rope.eval import report  # noqa: E402

FAMILIES = {  # baseline first: the same ViT (DeiT-III: LayerScale, class token, qkv bias) without RoPE
    "small": ["deit3_small_patch16_224", "vit_rope_small_patch16_axial_224", "vit_rope_small_patch16_mixed_224",
              "vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224"],
    "base": ["deit3_base_patch16_224", "vit_rope_base_patch16_axial_224", "vit_rope_base_patch16_mixed_224",
             "vit_base_patch16_rope_224", "vit_base_patch16_rope_mixed_224"],
    # DINOv3 ViT-S/16: timm's port (eva.py) is the baseline here, ours the same backbone with the fused rotation
    "dinov3": ["vit_small_patch16_dinov3", "vit_rope_small_patch16_dinov3"],
}


def activation_bytes(model: nn.Module, step: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves during ``step()`` (a training forward), weights left out."""
    weights = {param.untyped_storage().data_ptr() for param in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step().backward()
    return sum(storages.values())


def make_step(model: nn.Module, images: torch.Tensor, mode: str, amp: bool) -> Callable[[], torch.Tensor]:
    """One inference forward, or one training forward returning the loss (backward is the caller's)."""
    autocast = torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp)
    targets = torch.zeros(images.shape[0], dtype=torch.long, device=images.device)

    def infer() -> torch.Tensor:
        with torch.inference_mode(), autocast:
            return model(images)

    def train() -> torch.Tensor:
        with autocast:
            return nn.functional.cross_entropy(model(images), targets)

    return infer if mode == "infer" else train


def run_step(step: Callable[[], torch.Tensor], model: nn.Module, mode: str) -> None:
    out = step()
    if mode == "train":
        out.backward()
        model.zero_grad(set_to_none=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def benchmark(args: argparse.Namespace, save: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every (size, mode, compiled) setting: all models interleaved over ``args.rounds`` rounds.

    ``save`` gets the rows after each setting, so a run stopped by a time limit keeps the settings it finished.
    Compiled settings start from a reset dynamo cache with static shapes: the ViTs share one ``forward`` code
    object, so settings compiled in one process would otherwise meet dynamo's recompile limit (falling back to eager
    unseen) and, at a second size, compile dynamic-shape graphs.
    """
    device = torch.device(args.device)
    names = args.models or FAMILIES[args.family]
    rows = []
    for size in args.img_sizes:
        images = torch.randn(args.batch_size, 3, size, size, device=device)
        for compiled in {"eager": [False], "compiled": [True], "both": [False, True]}[args.compile]:
            for mode in args.modes:
                torch._dynamo.reset()
                torch.manual_seed(0)
                models = {name: timm.create_model(name, img_size=size, num_classes=1000).to(device) for name in names}
                steps = {}
                for name, model in models.items():
                    model.train(mode == "train")
                    runner = torch.compile(model, dynamic=False) if compiled else model
                    steps[name] = make_step(runner, images, mode, args.amp)
                    for _ in range(args.warmup):
                        run_step(steps[name], model, mode)
                speeds: dict[str, list[float]] = {name: [] for name in names}
                for _ in range(args.rounds):
                    for name in random.sample(names, len(names)):
                        sync(device)
                        start = time.perf_counter()
                        for _ in range(args.steps):
                            run_step(steps[name], models[name], mode)
                        sync(device)
                        speeds[name].append(args.steps * args.batch_size / (time.perf_counter() - start))
                for name in names:
                    row = {"model": name, "img_size": size, "mode": mode, "compiled": compiled,
                           "images_per_s": statistics.median(speeds[name]),
                           "ratio": statistics.median(s / b for s, b in zip(speeds[name], speeds[names[0]],
                                                                                strict=True)),
                           "rounds": speeds[name]}
                    if mode == "train":
                        row.update(memory(models[name], steps[name], device))
                    rows.append(row)
                print(table([r for r in rows if (r["img_size"], r["mode"], r["compiled"]) == (size, mode, compiled)]),
                      flush=True)
                if save is not None:
                    save(rows)
                del models, steps
    return rows


def memory(model: nn.Module, step: Callable[[], torch.Tensor], device: torch.device) -> dict[str, float]:
    """Activation MiB of one training step, and on CUDA the allocator's peak MiB over it."""
    out = {}
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        run_step(step, model, "train")
        out["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    out["activation_mib"] = activation_bytes(model, step) / 2**20
    model.zero_grad(set_to_none=True)
    return out


def table(rows: list[dict]) -> str:
    """Markdown table of a set of rows; ratios and memory relative to the first (baseline) model of each setting."""
    def mib(value: float | None) -> str:
        return "" if value is None else f"{value:.0f}"

    return report.table(
        ["model", "size", "mode", "compiled", "images/s", "ratio to baseline", "activation MiB", "peak MiB"],
        [(r["model"], r["img_size"], r["mode"], "yes" if r["compiled"] else "no", f"{r['images_per_s']:.1f}",
          f"{r['ratio']:.3f}", mib(r.get("activation_mib")), mib(r.get("peak_mib"))) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="small", help="model set (baseline first)")
    parser.add_argument("--models", nargs="+", help="timm names instead of --family; the first is the baseline")
    parser.add_argument("--img-sizes", type=int, nargs="+", default=[224, 384])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--modes", nargs="+", choices=("infer", "train"), default=["infer", "train"])
    parser.add_argument("--compile", choices=("eager", "compiled", "both"), default="eager")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model before the rounds")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", help="also write the rows and the machine to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = {**report.machine(), "threads": torch.get_num_threads(), "batch_size": args.batch_size,
               "amp": args.amp, "rounds": args.rounds, "steps": args.steps, "command": " ".join(sys.argv)}
    print(f"# {machine}", flush=True)

    def save(rows: list[dict], complete: bool = False) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": machine, "complete": complete, "rows": rows}, indent=2)
                                       + "\n")

    rows = benchmark(args, save)
    print("\n" + table(rows))
    save(rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
