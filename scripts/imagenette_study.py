"""Resolution-extrapolation study on Imagenette: APE vs RoPE-Axial vs RoPE-Mixed (and their +APE variants).

    python scripts/imagenette_study.py            # train every model x seed, evaluate them all, write the report
    python scripts/imagenette_study.py --report   # only rebuild the report and README table from results/imagenette

Trains ``configs/imagenette_study/{model}.yaml`` once per seed with ``train.py`` (same recipe for every model; a run
whose ``last.pth`` already holds the final epoch is kept, an unfinished one resumes), evaluates every final checkpoint
(``last.pth``: no selection on the val images) with ``vit_rope.evaluate`` at 0.75x-2.5x the training size under every
RoPE policy, then copies into ``results/imagenette/`` the configs, commands, ``metrics.csv`` of each run, the evaluation
(``eval/results.{json,md}``, plot) and the machine, and regenerates the seed-averaged table (``summary.md``,
``summary.png``) and the README section from those files (``vit_rope.report.write_study``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vit_rope.config import build_config  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope.engine import load_checkpoint  # noqa: E402
from vit_rope.policies import POLICIES  # noqa: E402
from vit_rope.report import machine, write_study  # noqa: E402

MODELS = ("ape", "axial", "mixed", "axial_ape", "mixed_ape")


def run(command: list[str]) -> float:
    """Run a command from the repository root; returns its wall time in seconds."""
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def finished(path: Path, epochs: int) -> bool:
    """Whether ``path`` is a checkpoint of a run that completed all its epochs (it stores the epochs done)."""
    return path.exists() and load_checkpoint(path).get("epoch") == epochs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--img-sizes", type=int, nargs="+", default=[48, 64, 80, 96, 128, 160],
                        help="evaluation sizes (default 0.75x-2.5x of the 64 px training size)")
    parser.add_argument("--limit", type=int, default=1500, help="val images to evaluate, spread over the classes")
    parser.add_argument("--runs", default="output/study", help="training outputs (checkpoints; not committed)")
    parser.add_argument("--results", default="results/imagenette", help="what is committed")
    parser.add_argument("--report", action="store_true", help="only rebuild the report from --results")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    results, runs = Path(args.results), Path(args.runs)
    results.mkdir(parents=True, exist_ok=True)
    study = [{"name": f"{model}_s{seed}", "model": model, "seed": seed,
              "config": f"configs/imagenette_study/{model}.yaml", "output": str(runs / f"{model}_s{seed}")}
             for model in args.models for seed in args.seeds]
    train = [["python", "train.py", "-c", entry["config"], "--output", entry["output"], f"seed={entry['seed']}"]
             for entry in study]
    evaluate = ["python", "-m", "vit_rope.evaluate", "--checkpoint", *(f"{e['output']}/last.pth" for e in study),
                "--img-sizes", *map(str, args.img_sizes), "--policy", *POLICIES, "--limit", str(args.limit),
                "--workers", "0", "--output", str(results / "eval")]  # both cores compute; decoding is once per size
    if not args.report:
        for entry, command in zip(study, train, strict=True):
            out = Path(entry["output"])
            if not finished(out / "last.pth", build_config(entry["config"], [f"seed={entry['seed']}"]).epochs):
                resume = [f"resume={out / 'last.pth'}"] if (out / "last.pth").exists() else []
                run([sys.executable, *command[1:], *resume])
            (results / "runs" / entry["name"]).mkdir(parents=True, exist_ok=True)
            for file in ("config.yaml", "metrics.csv"):
                shutil.copy(out / file, results / "runs" / entry["name"] / file)
        seconds = run([sys.executable, *evaluate[1:]])
        (results / "runs.json").write_text(json.dumps(study, indent=2) + "\n")
        (results / "machine.json").write_text(json.dumps({**machine(), "evaluate_s": round(seconds)}, indent=2) + "\n")
        (results / "commands.sh").write_text("# the study's commands, as scripts/imagenette_study.py runs them\n"
                                             + "\n".join(shlex.join(command) for command in [*train, evaluate]) + "\n")
    print(write_study(results, Path("README.md")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
