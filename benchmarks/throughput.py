"""Images/s and memory of RoPE ViTs against the same ViT without RoPE, measured in one run.

    python benchmarks/throughput.py                                   # ViT-S, 224 and 384, infer + train, CPU
    python benchmarks/throughput.py --family base --device cuda --amp --compile both --json out.json
    python benchmarks/throughput.py --family dinov3 --img-sizes 224 512   # DINOv3 ViT-S/16: ours against timm's port
    python benchmarks/throughput.py --family kinds --img-sizes 224 448 --batch-sizes 8 2   # encodings against axial
    python benchmarks/throughput.py --family fused --img-sizes 224   # the fused rotation against the reference one

Each round runs every model in turn (a new random order per round) for ``--steps`` timed steps after its warm-up, so
that the models share the machine's drifts and bursts; a model's figure is the median of its per-round images/s, and
its ratio to the baseline is the median of the per-round ratios (paired within a round). Memory is the peak of a
training step: CUDA's allocator peak on GPUs, and everywhere the bytes of the distinct tensors autograd saves for
backward (activation memory; weights, gradients and optimizer state are the same across models). A family with
targets (``TARGETS``: the position-encoding kinds against axial RoPE) prints PASS or MISS per row and
saves the targets with the rows. A model named ``NAME@reference`` is ``NAME`` with q and k rotated by the reference
``apply_rope`` (autograd through plain ops, as under a graph capture): the fused rotation and its autograd Function
left out, so that one run measures what they buy.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import vit_rope  # noqa: E402,F401  (registers the vit_rope_* models)
from benchmarks.machine import describe_machine  # noqa: E402
from vit_rope.encodings.rope.rotary_encoding import CayleyString  # noqa: E402
from vit_rope.eval import report  # noqa: E402
from vit_rope.layers import attention  # noqa: E402
from vit_rope.layers.fused import reference_projection  # noqa: E402
from vit_rope.train.distributed import flushed_subnormals  # noqa: E402

REFERENCE = "@reference"
CLEAR_REFS = Path("/proc/self/clear_refs")
try:
    LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc: no trimming of freed heap before a step
    LIBC = None

FAMILIES = {  # baseline first: the same ViT (DeiT-III: LayerScale, class token, qkv bias) without RoPE
    "small": ["deit3_small_patch16_224", "vit_rope_small_patch16_axial_224", "vit_rope_small_patch16_mixed_224",
              "vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224"],
    "base": ["deit3_base_patch16_224", "vit_rope_base_patch16_axial_224", "vit_rope_base_patch16_mixed_224",
             "vit_base_patch16_rope_224", "vit_base_patch16_rope_mixed_224"],
    # DINOv3 ViT-S/16: timm's port (eva.py) is the baseline here, ours the same backbone with the fused rotation
    "dinov3": ["vit_small_patch16_dinov3", "vit_rope_small_patch16_dinov3"],
    # the fused rotation (in place; its autograd Function in training) against the reference rotation it replaces
    "fused": ["deit3_small_patch16_224", *(f"vit_rope_small_patch16_{kind}_224{variant}" for kind in ("axial", "mixed")
                                           for variant in ("", "@reference")),
              "vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224"],
    # position-encoding kinds against axial RoPE of the same size; STRING is over axial, then over mixed
    "kinds": ["vit_rope_small_patch16_axial_224", *(f"vit_rope_small_patch16_{kind}_224" for kind in
                                                    ("golden", "string", "string_mixed", "lookhere", "alibi",
                                                     "comrope_ap", "comrope_ld", "liere", "pape", "pape_ri"))],
}
_STRING = ("vit_rope_small_patch16_string_224", "vit_rope_small_patch16_string_mixed_224")
# Least ratio to the family's baseline: (model, mode or None for both, img size or None for any, target). STRING's
# inference runs in eval(), where each block's basis is folded into its qkv weights once and reused (checked per row)
TARGETS: dict[str, list[tuple[str, str | None, int | None, float]]] = {
    "kinds": [("vit_rope_small_patch16_golden_224", None, None, 0.95),
              *((name, mode, None, target) for name in _STRING for mode, target in (("train", 0.90), ("infer", 0.95))),
              *((f"vit_rope_small_patch16_{kind}_224", None, size, target) for kind in ("lookhere", "alibi")
                for size, target in ((224, 0.95), (448, 0.85))),
              # ComRoPE's tables exponentiated once per grid in eval, LieRE's one set for every block
              *((f"vit_rope_small_patch16_{kind}_224", mode, None, target) for kind in ("comrope_ap", "comrope_ld")
                for mode, target in (("train", 0.85), ("infer", 0.95))),
              *(("vit_rope_small_patch16_liere_224", mode, None, target) for mode, target in (("train", 0.80),
                                                                                              ("infer", 0.90))),
              # PaPE projects 2 x 300 more per token (50 parabolas) and sums them into q.k 64 + 5 wide (padded to
              # 72); PaPE-RI's q.k is 64 + 3 (padded to 68) and it projects 6 more. 448 first: the first row that
              # matches sets the target
              *((f"vit_rope_small_patch16_{kind}_224", mode, size, target)
                for kind, targets in (("pape", (0.65, 0.80, 0.75)), ("pape_ri", (0.90, 0.95, 0.90)))
                for mode, size, target in zip((None, "infer", "train"), (448, 224, 224), targets, strict=True))],
}


def against(value: float, target: float, at_most: bool = False) -> dict[str, Any]:
    """A measured ratio's target, its sense (speed: at least, memory: at most) and whether the value meets it."""
    return {"target": target, "sense": "<=" if at_most else ">=",
            "pass": value <= target if at_most else value >= target}


def verdict(row: dict) -> tuple[str, str]:
    """The target and PASS or MISS of a row that ``against`` judged, as table cells; empty for a row without one."""
    if row.get("target") is None:
        return "", ""
    return f"{row['sense']} {row['target']:.2f}", "PASS" if row["pass"] else "MISS"


def target(family: str | None, model: str, size: int, mode: str) -> float | None:
    """The least ratio to the baseline that ``TARGETS`` sets for this row, or ``None`` (no target)."""
    return next((least for name, on_mode, on_size, least in TARGETS.get(family or "", [])
                 if name == model and on_mode in (None, mode) and on_size in (None, size)), None)


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


def peak_bytes(call: Callable[[], object], device: torch.device) -> int | None:
    """Memory ``call()`` adds at its peak: CUDA's allocator peak above what it held, or on Linux CPUs the resident
    peak (VmHWM, reset through /proc/self/clear_refs just before, freed heap trimmed first so that reusing it counts)
    above VmRSS; None on a CPU without /proc/self/clear_refs."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        return torch.cuda.max_memory_allocated(device) - before
    if not CLEAR_REFS.exists():
        return None

    def kib(key: str) -> int:
        return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith(key))

    if LIBC is not None:
        LIBC.malloc_trim(0)
    CLEAR_REFS.write_text("5")  # VmHWM := VmRSS
    before = kib("VmRSS")
    call()
    return (kib("VmHWM") - before) * 1024


@contextmanager
def reference_rotation(on: bool) -> Iterator[None]:
    """With ``on``, attention rotates q and k by the reference ``apply_rope`` with autograd through plain ops, as
    under a graph capture: the fused in-place rotation and its autograd Function left out (a ``NAME@reference``
    model, to measure in one run what they buy)."""
    if not on:
        yield
        return
    fused = attention.rotated_projection
    attention.rotated_projection = reference_projection
    try:
        yield
    finally:
        attention.rotated_projection = fused


def make_step(model: nn.Module, images: torch.Tensor, mode: str, amp: bool, reference: bool = False
              ) -> Callable[[], torch.Tensor]:
    """One inference forward, or one training forward returning the loss (backward is the caller's)."""
    autocast = torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp)
    targets = torch.zeros(images.shape[0], dtype=torch.long, device=images.device)

    def infer() -> torch.Tensor:
        with torch.inference_mode(), autocast, reference_rotation(reference):
            return model(images)

    def train() -> torch.Tensor:
        with autocast, reference_rotation(reference):  # the backward replays the forward's nodes, set by then
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


def prepare(models: dict[str, nn.Module], images: torch.Tensor, mode: str, amp: bool, warmup: int,
            compiled: bool = False) -> dict[str, Callable[[], torch.Tensor]]:
    """Each model's step in ``mode`` (train() or eval()), compiled or not, after ``warmup`` untimed steps."""
    steps = {}
    for name, model in models.items():
        model.train(mode == "train")
        runner = torch.compile(model, dynamic=False) if compiled else model
        steps[name] = make_step(runner, images, mode, amp, str(name).endswith(REFERENCE))
        for _ in range(warmup):
            run_step(steps[name], model, mode)
    return steps


def interleaved_seconds(calls: Mapping[Hashable, Callable[[], object]], rounds: int, device: torch.device
                        ) -> dict[Hashable, list[float]]:
    """Seconds of each call in every round; each round runs the calls in a new random order, so that they share the
    machine's drifts and bursts and a per-round ratio compares like with like."""
    seconds: dict[Hashable, list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for key in random.sample(list(calls), len(calls)):
            sync(device)
            start = time.perf_counter()
            calls[key]()
            sync(device)
            seconds[key].append(time.perf_counter() - start)
    return seconds


def interleaved_speeds(steps: dict[str, Callable[[], torch.Tensor]], models: dict[str, nn.Module], mode: str,
                       batch_size: int, rounds: int, steps_per_round: int, device: torch.device
                       ) -> dict[str, list[float]]:
    """Images/s of each model in every round of ``interleaved_seconds``, ``steps_per_round`` steps a round."""
    def calls(name: str) -> Callable[[], None]:
        def call() -> None:
            for _ in range(steps_per_round):
                run_step(steps[name], models[name], mode)
        return call

    seconds = interleaved_seconds({name: calls(name) for name in steps}, rounds, device)
    return {name: [steps_per_round * batch_size / t for t in times] for name, times in seconds.items()}


def paired_ratio(speeds: list[float], baseline: list[float]) -> float:
    """Median of the per-round ratios: paired within a round, so a burst that slows one round cancels out."""
    return statistics.median(s / b for s, b in zip(speeds, baseline, strict=True))


def string_fold_reused(model: nn.Module, step: Callable[[], torch.Tensor]) -> dict[str, bool]:
    """For a STRING model in eval(): whether one more inference call reuses every block's folded qkv weights
    (``CayleyString``'s cache) rather than folding ``P`` again, i.e. whether the timed calls cost what the base
    kind costs. Empty for other models."""
    strings = [module for module in model.modules() if isinstance(module, CayleyString)]
    if not strings:
        return {}
    before = [module._fold._kept for module in strings]
    step()
    return {"string_fold_reused": all(kept is not None and module._fold._kept is kept
                                      for module, kept in zip(strings, before, strict=True))}


def benchmark(args: argparse.Namespace, save: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every (size, mode, compiled) setting: all models interleaved over ``args.rounds`` rounds.

    ``save`` gets the rows after each setting, so a run stopped by a time limit keeps the settings it finished.
    Compiled settings start from a reset dynamo cache with static shapes: the ViTs share one ``forward`` code
    object, so settings compiled in one process would otherwise meet dynamo's recompile limit (falling back to eager
    unseen) and, at a second size, compile dynamic-shape graphs.
    """
    device = torch.device(args.device)
    names = args.models or FAMILIES[args.family]
    family = None if args.models else args.family
    depth = {"depth": args.depth} if args.depth else {}
    rows = []
    for size, batch_size in zip(args.img_sizes, args.batch_sizes, strict=True):
        images = torch.randn(batch_size, 3, size, size, device=device)
        for compiled in {"eager": [False], "compiled": [True], "both": [False, True]}[args.compile]:
            for mode in args.modes:
                torch._dynamo.reset()
                torch.manual_seed(0)
                models = {name: timm.create_model(name.removesuffix(REFERENCE), img_size=size, num_classes=1000,
                                                  **depth).to(device) for name in names}
                steps = prepare(models, images, mode, args.amp, args.warmup, compiled)
                speeds = interleaved_speeds(steps, models, mode, batch_size, args.rounds, args.steps, device)
                for name in names:
                    row = {"model": name, "img_size": size, "batch_size": batch_size, "mode": mode,
                           "compiled": compiled, "images_per_s": statistics.median(speeds[name]),
                           "ratio": paired_ratio(speeds[name], speeds[names[0]]), "rounds": speeds[name]}
                    row.update(memory(models[name], steps[name], device) if mode == "train" else
                               string_fold_reused(models[name], steps[name]))
                    least = target(family, name, size, mode)
                    if least is not None:
                        row.update(against(row["ratio"], least))
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


def setup_machine(threads: int | None, **settings: Any) -> dict[str, Any]:
    """Set torch's CPU threads when given; the machine, thread count, ``settings`` and command line, which every
    result file carries so that a figure can be traced to where and how it was measured."""
    if threads:
        torch.set_num_threads(threads)
    return {**describe_machine(), "threads": torch.get_num_threads(), **settings, "command": " ".join(sys.argv)}


def table(rows: list[dict]) -> str:
    """Markdown table of a set of rows; ratios and memory relative to the first (baseline) model of each setting."""
    def mib(value: float | None) -> str:
        return "" if value is None else f"{value:.0f}"

    return report.table(
        ["model", "size", "batch", "mode", "compiled", "images/s", "ratio to baseline", "target", "result",
         "activation MiB", "peak MiB"],
        [(r["model"], r["img_size"], r["batch_size"], r["mode"], "yes" if r["compiled"] else "no",
          f"{r['images_per_s']:.1f}", f"{r['ratio']:.3f}", *verdict(r), mib(r.get("activation_mib")),
          mib(r.get("peak_mib"))) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="small", help="model set (baseline first)")
    parser.add_argument("--models", nargs="+", help="timm names instead of --family; the first is the baseline")
    parser.add_argument("--img-sizes", type=int, nargs="+", default=[224, 384])
    parser.add_argument("--batch-size", type=int, default=8, help="batch at every size (unless --batch-sizes)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="one batch per --img-sizes entry, in its order")
    parser.add_argument("--depth", type=int, help="blocks of every model (default: each model's; fewer for smoke runs)")
    parser.add_argument("--modes", nargs="+", choices=("infer", "train"), default=["infer", "train"])
    parser.add_argument("--compile", choices=("eager", "compiled", "both"), default="eager")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model before the rounds")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", help="also write the rows and the machine to this file")
    parser.add_argument("--keep-subnormals", action="store_true",
                        help="compute with subnormal floats as they are (train.py and vit_rope.evaluate flush them)")
    args = parser.parse_args(argv)
    args.batch_sizes = args.batch_sizes or [args.batch_size] * len(args.img_sizes)
    if len(args.batch_sizes) != len(args.img_sizes):
        parser.error(f"--batch-sizes {args.batch_sizes} needs one batch per --img-sizes {args.img_sizes}")
    machine = setup_machine(args.threads, batch_sizes=args.batch_sizes, depth=args.depth, amp=args.amp,
                            rounds=args.rounds, steps=args.steps, subnormals_flushed=not args.keep_subnormals)
    targets = [dict(zip(("model", "mode", "img_size", "target"), row, strict=True))
               for row in ([] if args.models else TARGETS.get(args.family, []))]
    print(f"# {machine}", flush=True)

    def save(rows: list[dict], complete: bool = False) -> None:
        if args.json:
            result = {"machine": machine, "complete": complete, "targets": targets, "rows": rows}
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    with contextlib.nullcontext() if args.keep_subnormals else flushed_subnormals():  # as train.py and evaluate run
        rows = benchmark(args, save)
    print("\n" + table(rows))
    save(rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
