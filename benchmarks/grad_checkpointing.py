"""What gradient checkpointing (``grad_checkpointing`` in a training config) costs and saves: a training step of the
same model with every block checkpointed, every second block, and none, in one interleaved run.

    python benchmarks/grad_checkpointing.py --json results/performance/grad_checkpointing_cpu.json   # ViT-B, 448 px

Each model's images/s is the median over rounds (every model once per round, in a new random order, as
``benchmarks/throughput.py``), its ratio to the model without checkpointing the median of per-round ratios. Memory is
the step's peak: CUDA's allocator peak, or on Linux CPUs the process's resident peak (VmHWM, reset before the step)
above what it held before, with the activations autograd saves for backward beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import timm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import vit_rope  # noqa: E402,F401  (registers the models)
from benchmarks.throughput import (  # noqa: E402
    activation_bytes,
    interleaved_speeds,
    paired_ratio,
    peak_bytes,
    prepare,
    run_step,
    setup_machine,
)
from vit_rope.eval.report import table  # noqa: E402
from vit_rope.train.model import set_checkpointing  # noqa: E402

SETTINGS = {"none": False, "every 2nd block": 2, "every block": True}  # name -> grad_checkpointing
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_rope_base_patch16_mixed_224")
    parser.add_argument("--img-size", type=int, default=448)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--model-kwargs", type=json.loads, default={}, help='JSON, e.g. \'{"depth": 2}\' (tests)')
    parser.add_argument("--json", help="also write the rows and machine to this file")
    args = parser.parse_args(argv)
    machine = setup_machine(args.threads, batch_size=args.batch_size, rounds=args.rounds, model=args.model,
                            img_size=args.img_size)
    print(f"# {machine}", flush=True)
    device = torch.device(args.device)
    models = {}
    for name, every in SETTINGS.items():
        torch.manual_seed(0)
        models[name] = timm.create_model(args.model, img_size=args.img_size, drop_path_rate=0.0,
                                         **args.model_kwargs).to(device)
        set_checkpointing(models[name], every, args.model)
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    steps = prepare(models, images, "train", device.type == "cuda", warmup=1)
    speeds = interleaved_speeds(steps, models, "train", args.batch_size, args.rounds, 1, device)
    rows = []
    for name, model in models.items():
        peak = peak_bytes(lambda name=name, model=model: run_step(steps[name], model, "train"), device)
        rows.append({"grad_checkpointing": SETTINGS[name], "setting": name,
                     "images_per_s": statistics.median(speeds[name]),
                     "ratio": paired_ratio(speeds[name], speeds["none"]), "rounds": speeds[name],
                     "activation_mib": activation_bytes(model, steps[name]) / 2**20,
                     "peak_mib": None if peak is None else peak / 2**20})
        model.zero_grad(set_to_none=True)
    base = rows[0]
    print(table(["checkpointing", "images/s", "ratio to none", "peak MiB", "ratio to none", "activation MiB"],
                [(row["setting"], f"{row['images_per_s']:.2f}", f"{row['ratio']:.2f}",
                  "" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}",
                  "" if row["peak_mib"] is None else f"{row['peak_mib'] / base['peak_mib']:.2f}",
                  f"{row['activation_mib']:.0f}") for row in rows]), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
