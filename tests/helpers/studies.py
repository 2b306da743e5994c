"""Study folders as scripts/imagenette_study.py leaves them: runs, their metrics, evaluations and the machine."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def result(model: str, policy: str | None, size: int, top1: float) -> dict:
    return {"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1, "top5": 90.0,
            "loss": 1.0, "images_per_s": 100.0}


def write_runs(root: Path, runs: list[dict], evaluations: dict[str, list[dict]], evaluate_s: object = 120) -> Path:
    """A study folder: ``runs.json``, per-run ``metrics.csv`` (final top-1 40 + 2 x seed), one results.json per key
    of ``evaluations`` (``""`` is v1's single file), ``machine.json``."""
    for run in runs:
        metrics = root / "runs" / run["name"] / "metrics.csv"
        metrics.parent.mkdir(parents=True)
        with open(metrics, "w", newline="") as f:
            writer = csv.DictWriter(f, ["epoch", "top1", "seconds"])
            writer.writeheader()
            writer.writerows([{"epoch": 1, "top1": 20.0, "seconds": 60.0},
                              {"epoch": 2, "top1": 40.0 + 2 * run["seed"], "seconds": 60.0}])
    for name, rows in evaluations.items():
        (root / "eval" / name).mkdir(parents=True, exist_ok=True)
        (root / "eval" / name / "results.json").write_text(json.dumps({"protocol": "crop 1.0", "results": rows}))
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "machine.json").write_text(json.dumps({"cpu": "test cpu", "cores": 2, "gpu": None, "torch": "2",
                                                   "timm": "1", "date": "today", "evaluate_s": evaluate_s}))
    return root


def make_v2(root: Path, seeds: tuple[int, ...] = (0, 1)) -> Path:
    """v2's layout: one eval folder per arm and a baseline per RoPE arm. ``holds`` keeps its training-size top-1 at
    128 px and beats APE with both seeds; ``drops`` loses 5 points; ``close`` holds but its seeds overlap APE's;
    ``under`` falls below APE with every seed."""
    top1 = {  # arm -> (64 px, 128 px, 160 px) for seed 0; seed 1 adds ``bump`` points
        "ape": ((50.0, 45.0, 40.0), 1.0), "holds": ((55.0, 54.5, 52.0), 1.0),
        "drops": ((55.0, 50.0, 45.0), 1.0), "close": ((50.0, 49.5, 40.5), 2.0), "under": ((52.0, 40.0, 35.0), 1.0)}
    runs, evaluations = [], {}
    for arm, (values, bump) in top1.items():
        for seed in seeds:
            run = {"name": f"{arm}_s{seed}", "model": arm, "label": arm.upper(), "seed": seed,
                   "baseline": None if arm == "ape" else "ape", "output": f"output/study/v2/{arm}_s{seed}"}
            runs.append(run)
            label = f"m ({run['output']}/last.pth)"
            evaluations.setdefault(arm, []).extend(
                result(label, None if arm == "ape" else "extrapolate", size, value + seed * bump)
                for size, value in zip((64, 128, 160), values, strict=True))
            if arm != "ape":
                evaluations[arm].append(result(label, "interpolate", 160, 60.0))
    return write_runs(root, runs, evaluations, evaluate_s=dict.fromkeys(top1, 60))
