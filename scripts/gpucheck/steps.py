"""The steps of ``make gpu-check`` and ``make gpu-bench``: each one command line (or a few) of the project's own
entry points, with its time limit on one H100 (an estimate, not a measurement: docs/gpu.md) and how its outputs are
judged against its targets. On ``--device cpu`` every command takes tiny sizes, so that a test runs the
whole of either suite on a CPU in about a minute.

The order is by risk: what could make every GPU figure meaningless (the CUDA tests, the families' logits, a real
training run and its evaluation, the rotation's bandwidth) is ``check``; the timings that only compare (eager and
compiled throughput against DeiT-III and timm's ports, the kernel's block-size sweep, data feeding against the step
alone) are ``bench``, which ``torch.compile``'s minutes dominate.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.throughput import paired_ratio

POLICIES = ("extrapolate", "interpolate", "ntk", "yarn", "normalized")  # every RoPE policy of the trained model
Target = dict[str, Any]  # {"target": what, "value": measured, "want": ">= 0.97" or None, "pass": bool | None}


@dataclass(frozen=True)
class Run:
    """Where and how big: the interpreter, the device, the data folder and this suite's output folder."""

    python: str
    device: str
    data: Path
    out: Path

    @property
    def tiny(self) -> bool:
        return self.device == "cpu"

    def json(self, name: str) -> str:
        """An output file's path, named as results/performance names the same benchmark's file."""
        return str(self.out / name.format(device=self.device))


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    seconds: int  # time limit on the device; estimates in docs/gpu.md
    commands: Callable[[Run], list[list[str]]]
    judge: Callable[[Run], list[Target]]


# torch.compile at tiny sizes (the environment of every command): dynamo and AOT autograd trace as on the GPU (graph
# breaks, guards, the backward), but no C++ is generated and built, which takes minutes on a small CPU (a debug setting
# of torch 2.14, ignored where absent)
TRACE_ONLY = {"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"}


def target(what: str, value: float | None, want: float | None, at_most: bool = False) -> Target:
    """A measured value against its bound (``pass`` None: nothing measured, e.g. no Triton on a CPU)."""
    ok = None if value is None or want is None else (value <= want if at_most else value >= want)
    return {"target": what, "value": value, "want": None if want is None else f"{'<=' if at_most else '>='} {want}",
            "pass": ok}


def read(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


# ---- check ------------------------------------------------------------------------------------------------------
def tests(run: Run) -> list[list[str]]:
    """Every CUDA test; tiny: the fused rotation's file only (its CUDA tests skip on a CPU: what is checked is the
    command, and make test collects the whole suite anyway)."""
    return [[run.python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
             "tests/layers/test_fused.py" if run.tiny else "tests"]]


def parity(run: Run) -> list[list[str]]:
    return [[run.python, "-m", "gpucheck.parity", "--device", run.device, "--json", run.json("parity_{device}.json"),
             *(["--tiny"] if run.tiny else [])]]


def judge_parity(run: Run) -> list[Target]:
    result = read(run.json("parity_{device}.json"))
    worst = max(result["rows"], key=lambda row: row["rel_error"])
    return [target(f"bf16 logits vs fp32 CPU, {len(result['rows'])} families, worst {worst['model']} "
                   "(relative error)", worst["rel_error"], result["tolerance"], at_most=True)]


def train(run: Run) -> list[list[str]]:
    """train.py under torchrun (one process, so DDP's set-up runs too), bf16, channels-last, compiled."""
    size = (["--model", "vit_rope_tiny_patch16_mixed_224", "model_kwargs.depth=1", "--img-size", "32", "--epochs",
             "2", "--batch-size", "8", "workers=0", "compile=false", "cache_size=40", "auto_augment=null", "mixup=0",
             "cutmix=0", "warmup_epochs=0", "lr=2e-3"] if run.tiny else
            ["--epochs", "4", "warmup_epochs=1", "compile=true", "workers=12"])
    return [[run.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "train.py", "-c",
             "configs/imagenette_gpu.yaml", "--data-dir", str(run.data), "--output", str(run.out / "train"), "--device",
             run.device, "amp=true", "amp_dtype=bfloat16", "channels_last=true", "log_interval=0",
             f"cache_dir={run.out / 'cache'}", *size]]


def judge_train(run: Run) -> list[Target]:
    with open(run.out / "train" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    first, last = float(rows[0]["train_loss"]), float(rows[-1]["train_loss"])
    return [target(f"train loss falls over {len(rows)} epochs (last / first)", last / first, 1.0, at_most=True),
            target("val top-1 of the last epoch (%), for the record", float(rows[-1]["top1"]), None),
            target("images/s of the whole run, last epoch, for the record", float(rows[-1]["images_per_s"]), None)]


EVAL_SIZES = ([32, 48, 64, 80, 96], [96, 128, 160, 192, 224])  # tiny (trained at 32), full (trained at 128)


def evaluate(run: Run) -> list[list[str]]:
    size = ["--workers", "0", "--batch-size", "16"] if run.tiny else ["--limit", "1000", "--workers", "8"]
    return [[run.python, "-m", "vit_rope.evaluate", "--checkpoint", str(run.out / "train" / "last.pth"), "--data-dir",
             str(run.data), "--device", run.device, "--img-sizes", *map(str, EVAL_SIZES[not run.tiny]), "--policy",
             *POLICIES, "--output", str(run.out / "evaluate"), *size]]


def judge_evaluate(run: Run) -> list[Target]:
    results = read(str(run.out / "evaluate" / "results.json"))["results"]
    return [target("evaluations run (5 sizes x 5 policies)", len(results), len(EVAL_SIZES[0]) * len(POLICIES))]


def rope_kernel(run: Run) -> list[list[str]]:
    size = ["--batch-size", "1", "--img-size", "32", "--rounds", "1", "--iters", "1"] if run.tiny else [
        "--batch-size", "128", "--rounds", "5"]
    return [[run.python, "benchmarks/rope_kernel.py", "--device", run.device, "--dtype", "bfloat16", "--kind", kind,
             "--json", run.json(f"rope_kernel_{{device}}_bf16_{kind}.json"), *size] for kind in ("axial", "mixed")]


def judge_rope_kernel(run: Run) -> list[Target]:
    """The Triton kernel's share of the copy bandwidth, and whether ``backend="auto"`` (Triton on CUDA) is faster than
    the PyTorch path it replaces, in place (inference) and recording autograd."""
    targets = []
    for kind in ("axial", "mixed"):
        rows = {row["impl"]: row for row in read(run.json(f"rope_kernel_{{device}}_bf16_{kind}.json"))["rows"]}
        triton = rows.get("ours_triton_in_place")
        targets.append(target(f"{kind}: Triton in place, fraction of copy bandwidth",
                              triton and triton["of_copy"], 0.75))
        for mode in ("in_place", "autograd"):
            fast = rows.get(f"ours_triton_{mode}")
            targets.append(target(f"{kind} {mode}: auto's Triton over PyTorch (speed-up)",
                                  fast and rows[f"ours_{mode}"]["us"] / fast["us"], 1.0))
    return targets


def scaling(run: Run) -> list[list[str]]:
    """The kinds meant for high resolution against axial at 1024 and 2048 px, bf16 inference, batch 1: the biases
    through FlexAttention (never a dense ``[H, N, N]``), the generators' rotations per token."""
    # tiny: the full command's flags at 32 px with one kind (benchmarks/scaling.py --smoke is its own test's)
    sizes, rounds, kinds = (["32"], "1", ["lookhere"]) if run.tiny else (
        ["1024", "2048"], "2", ["lookhere", "alibi", "fire", "liere", "comrope_ld", "mixed"])
    size = ["--img-sizes", *sizes, "--train-sizes", "--rounds", rounds, "--kinds", *kinds]
    return [[run.python, "benchmarks/scaling.py", "--device", run.device, "--amp",
             "--json", run.json("scaling_{device}_bf16_vit_s.json"), *size]]


def judge_scaling(run: Run) -> list[Target]:
    rows = read(run.json("scaling_{device}_bf16_vit_s.json"))["rows"]
    return [target(f"{row['kind']} at {row['img_size']} px: time over axial", row.get("time_ratio"),
                   1.5 if row["img_size"] >= 2048 else 1.3, at_most=True)
            for row in rows if row["kind"] != "axial" and row["mode"] == "infer"]


# ---- bench ------------------------------------------------------------------------------------------------------
def throughput(compiled: bool) -> Callable[[Run], list[list[str]]]:
    """ViT-S at 224 px, batch 128, bf16, training and inference, all five models interleaved in one run."""
    def commands(run: Run) -> list[list[str]]:
        full = ["--img-sizes", "224", "--batch-size", "128", "--rounds", "5", "--steps", "5", "--warmup", "3"]
        tiny = ["--img-sizes", "32", "--batch-size", "2", "--depth", "1", "--rounds", "1", "--steps", "1",
                "--warmup", "1", *(["--modes", "train"] if compiled else [])]  # compiled: the backward's trace
        size = tiny if run.tiny else full
        mode = "compiled" if compiled else "eager"
        return [[run.python, "benchmarks/throughput.py", "--family", "small", "--device", run.device, "--amp",
                 "--compile", mode, "--json", run.json(f"throughput_{{device}}_bf16_vit_s_{mode}.json"), *size]]
    return commands


PORTS = {"vit_rope_small_patch16_axial_224": "vit_small_patch16_rope_224",
         "vit_rope_small_patch16_mixed_224": "vit_small_patch16_rope_mixed_224"}
AGAINST_DEIT = {"vit_rope_small_patch16_axial_224": 0.97, "vit_rope_small_patch16_mixed_224": 0.95}


def judge_throughput(compiled: bool) -> Callable[[Run], list[Target]]:
    def judge(run: Run) -> list[Target]:
        mode = "compiled" if compiled else "eager"
        result = read(run.json(f"throughput_{{device}}_bf16_vit_s_{mode}.json"))
        targets = [] if result["complete"] else [target("every setting finished in the time limit", 0, 1)]
        settings = sorted({row["mode"] for row in result["rows"]})
        for setting in settings:
            rows = {row["model"]: row for row in result["rows"] if row["mode"] == setting}
            for ours, port in PORTS.items():
                short = f"{mode} {setting} {ours.split('_')[-2]}"
                targets.append(target(f"{short}: over DeiT-III-S", rows[ours]["ratio"], AGAINST_DEIT[ours]))
                targets.append(target(f"{short}: over timm's port",
                                      paired_ratio(rows[ours]["rounds"], rows[port]["rounds"]), 1.05))
                if setting == "train":
                    targets.append(target(f"{short}: activation memory over timm's port",
                                          rows[ours]["activation_mib"] / rows[port]["activation_mib"], 1.0,
                                          at_most=True))
        return targets
    return judge


def tune(run: Run) -> list[list[str]]:
    """A short block-size x warps sweep (the full one is ``make bench-cuda``): ViT-S at 224 px only."""
    size = [] if run.tiny else ["--img-sizes", "224", "--block-t", "16", "32", "64", "--num-warps", "2", "4", "8",
                                "--rep-ms", "25"]
    return [[run.python, "benchmarks/tune_rope_kernel.py", "--device", run.device,
             "--json", run.json("tune_rope_kernel_{device}.json"), *size]]


def judge_tune(run: Run) -> list[Target]:
    summary = read(run.json("tune_rope_kernel_{device}.json"))["summary"]
    best = [row["speedup"] for row in summary if row["speedup"] is not None]
    return [target("best setting over the default launch (largest speed-up; > 1.05 is worth a patch)",
                   max(best) if best else None, None)]


def pipeline(run: Run) -> list[list[str]]:
    """The data feeding of the train step's run (timm's per-image pipeline for this config) against the step alone."""
    size = ["--rounds", "1", "--steps", "1", "model=vit_rope_tiny_patch16_mixed_224", "model_kwargs.depth=1",
            "img_size=32", "batch_size=8", "workers=1", "cache_size=40"] if run.tiny else [
        "--rounds", "3", "--steps", "10", "workers=12"]
    return [[run.python, "benchmarks/pipeline.py", "-c", "configs/imagenette_gpu.yaml", "--pipeline", "timm",
             "--json", run.json("pipeline_{device}_imagenette.json"), f"data_dir={run.data}", f"device={run.device}",
             f"cache_dir={run.out / 'cache'}", *size]]


def judge_pipeline(run: Run) -> list[Target]:
    rows = {row["mode"]: row for row in read(run.json("pipeline_{device}_imagenette.json"))["rows"]}
    return [target("train.py's pipeline over the step alone (tokens/s)", rows["timm"]["of_step"], 0.9)]


CHECK = [
    Step("tests", "pytest -m cuda: fused rotation fp32/bf16/fp16, GPU pipeline = CPU, NaFlex = CPU, resume", 130,
         tests, lambda run: []),
    Step("parity", "every family: bf16 logits on the device against fp32 on the CPU", 60, parity, judge_parity),
    Step("train", "train.py on Imagenette 160 px under torchrun: bf16, channels-last, compiled", 180, train,
         judge_train),
    Step("evaluate", "its checkpoint at five sizes under every policy", 60, evaluate, judge_evaluate),
    Step("rope_kernel", "the rotation alone against the copy bandwidth, axial and mixed, bf16", 40, rope_kernel,
         judge_rope_kernel),
]
BENCH = [
    Step("throughput_eager", "ViT-S 224 px bf16 batch 128, eager: ours against DeiT-III-S and timm's ports", 60,
         throughput(False), judge_throughput(False)),
    Step("tune", "the Triton kernel's block-size x warps sweep, 224 px", 45, tune, judge_tune),
    Step("pipeline", "train.py's data feeding against the step alone", 60, pipeline, judge_pipeline),
    Step("scaling", "the high-resolution kinds against axial at 1024 and 2048 px, bf16 inference", 120, scaling,
         judge_scaling),
    Step("throughput_compiled", "the same, torch.compile'd (5 models x 2 modes of compiles)", 300,
         throughput(True), judge_throughput(True)),
]
SUITES = {"check": CHECK, "bench": BENCH}
