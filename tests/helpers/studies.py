"""Study folders as scripts/imagenette_study.py leaves them: runs, their metrics, evaluations and the machine."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def write_results(folder: Path, rows: list[dict], protocol: str = "crop 1.0") -> None:
    """``folder/results.json`` as vit_rope.evaluate writes it: its protocol and rows."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"protocol": protocol, "results": rows}))


def set_protocol(paths: object, protocol: str) -> None:
    """Each results.json file of ``paths`` marked as evaluated under ``protocol``."""
    for path in paths:
        path.write_text(json.dumps({**json.loads(path.read_text()), "protocol": protocol}))


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
        write_results(root / "eval" / name, rows)
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "machine.json").write_text(json.dumps({"cpu": "test cpu", "cores": 2, "gpu": None, "torch": "2",
                                                   "timm": "1", "date": "today", "evaluate_s": evaluate_s}))
    return root


def arm_runs(top1: dict[str, tuple[float, ...]], sizes: tuple[int, ...], folder: str, seeds: tuple[int, ...] = (0, 1),
             bump: dict[str, float] | float = 1.0, **fields: object) -> tuple[list[dict], dict[str, list[dict]]]:
    """The runs and each arm's results of arms ``top1`` (arm -> top-1 at each of ``sizes`` for seed 0; seed s adds s x
    ``bump``, or the arm's own): ``ape`` is APE and every other arm's baseline, a RoPE arm is evaluated as trained
    (extrapolate); ``fields`` go into every result."""
    runs, evaluations = [], {}
    for arm, values in top1.items():
        step = bump[arm] if isinstance(bump, dict) else bump
        for seed in seeds:
            run = {"name": f"{arm}_s{seed}", "model": arm, "label": arm.upper(), "seed": seed,
                   "baseline": None if arm == "ape" else "ape", "output": f"{folder}/{arm}_s{seed}"}
            runs.append(run)
            policy = None if arm == "ape" else "extrapolate"
            evaluations.setdefault(arm, []).extend(
                {**result(f"m ({run['output']}/last.pth)", policy, size, value + seed * step), **fields}
                for size, value in zip(sizes, values, strict=True))
    return runs, evaluations


def make_v2(root: Path, seeds: tuple[int, ...] = (0, 1)) -> Path:
    """v2's layout: one eval folder per arm and a baseline per RoPE arm. ``holds`` keeps its training-size top-1 at
    128 px and beats APE with both seeds; ``drops`` loses 5 points; ``close`` holds but its seeds overlap APE's (its
    seed 1 two points up, the others' one); ``under`` falls below APE with every seed; all score 60 at 160 px under
    interpolate."""
    top1 = {"ape": (50.0, 45.0, 40.0), "holds": (55.0, 54.5, 52.0), "drops": (55.0, 50.0, 45.0),
            "close": (50.0, 49.5, 40.5), "under": (52.0, 40.0, 35.0)}  # at 64, 128 and 160 px
    runs, evaluations = arm_runs(top1, (64, 128, 160), "output/study/v2", seeds, {**dict.fromkeys(top1, 1.0),
                                                                                   "close": 2.0})
    for run in runs[len(seeds):]:  # the RoPE arms' runs, after APE's
        evaluations[run["model"]].append(result(f"m ({run['output']}/last.pth)", "interpolate", 160, 60.0))
    return write_runs(root, runs, evaluations, evaluate_s=dict.fromkeys(top1, 60))
