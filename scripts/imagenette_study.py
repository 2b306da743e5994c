"""Resolution-extrapolation studies on Imagenette: which models and training recipes hold accuracy above 64 px.

    python scripts/imagenette_study.py                 # v2: train every arm x seed, evaluating each arm when done
    python scripts/imagenette_study.py --study v1      # v1: APE vs RoPE-Axial vs RoPE-Mixed (and +APE), one recipe
    python scripts/imagenette_study.py --report        # only rebuild the report and README section from the files
    python scripts/imagenette_study.py --arms mixed_p8 ape_p8 --seeds 0 1 2   # a subset, or more seeds

v1 trains five models with one recipe (``configs/imagenette_study/``). v2 (``configs/imagenette_study/v2/``) holds the
model fixed and changes the training: coordinate augmentation, variable resolution (``train_sizes``) and an 8x8
patch grid, each with the APE model trained the same way as its baseline.

Each run is ``train.py`` on the arm's config with ``seed=S``; a run whose ``last.pth`` holds the final epoch is kept
and an unfinished one resumes, so an interrupted study goes on where it stopped. As soon as every seed of an arm has
finished, its final checkpoints (``last.pth``: nothing is selected on the val images) are evaluated with
``vit_rope.evaluate`` at 0.75x-2.5x the training size under every RoPE policy into ``eval/<arm>/``, the configs and
``metrics.csv`` are copied into ``runs/``, and the report (``summary.md``, plots, the README section) is rebuilt from
the files by ``vit_rope.study.write_study``. A partial study is therefore always a consistent one.
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
from vit_rope.policies import POLICIES  # noqa: E402
from vit_rope.report import machine  # noqa: E402
from vit_rope.study import is_run, write_study  # noqa: E402
from vit_rope.train_state import load_checkpoint  # noqa: E402

# study -> (config folder, results folder, training outputs, {arm: (label, arm of the same-recipe APE baseline)}),
# arms in the order they run: the cheap, most asked-for ones first.
STUDIES = {
    "v1": ("configs/imagenette_study", "results/imagenette", "output/study", {
        "ape": ("APE (timm ViT)", None), "axial": ("RoPE-Axial", None), "mixed": ("RoPE-Mixed", None),
        "axial_ape": ("RoPE-Axial + APE", None), "mixed_ape": ("RoPE-Mixed + APE", None)}),
    "v2": ("configs/imagenette_study/v2", "results/imagenette/v2", "output/study/v2", {
        "mixed": ("RoPE-Mixed", "ape"), "ape": ("APE", None),
        "mixed_coord": ("RoPE-Mixed + coord aug", "ape"),
        "mixed_sizes": ("RoPE-Mixed + sizes 48-96", "ape_sizes"), "ape_sizes": ("APE + sizes 48-96", None),
        "mixed_p8": ("RoPE-Mixed, patch 8", "ape_p8"), "ape_p8": ("APE, patch 8", None),
        "axial_p8": ("RoPE-Axial, patch 8", "ape_p8"),
        "mixed_coord_sizes": ("RoPE-Mixed + coord aug + sizes", "ape_sizes"),
        "axial": ("RoPE-Axial", "ape"), "axial_sizes": ("RoPE-Axial + sizes 48-96", "ape_sizes"),
        "axial_coord": ("RoPE-Axial + coord aug", "ape")}),
}


def run(command: list[str]) -> float:
    """Run a command from the repository root with this interpreter; returns its wall time in seconds."""
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, *command[1:]], check=True)
    return time.perf_counter() - start


def finished(path: Path, epochs: int) -> bool:
    """Whether ``path`` is a checkpoint of a run that completed all its epochs (it stores the epochs done)."""
    return path.exists() and load_checkpoint(path).get("epoch") == epochs


def same_machine(one: dict, other: dict) -> bool:
    """Whether two ``vit_rope.report.machine`` records describe the same hardware and software (dates aside)."""
    return all(one.get(key) == other.get(key) for key in ("cpu", "cores", "gpu", "torch", "timm"))


def evaluated(folder: Path, runs: list[dict]) -> bool:
    """Whether the ``results.json`` files under ``folder`` hold every one of ``runs`` (a new seed makes its arm
    evaluate again)."""
    labels = {row["model"] for path in folder.rglob("results.json") for row in json.loads(path.read_text())["results"]}
    return all(any(is_run(label, entry) for label in labels) for entry in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=STUDIES, default="v2")
    parser.add_argument("--arms", nargs="+", help="arms to run, in this order (default: all of the study's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--img-sizes", type=int, nargs="+", default=[48, 64, 80, 96, 128, 160],
                        help="evaluation sizes (default 0.75x-2.5x of the 64 px training size)")
    parser.add_argument("--limit", type=int, default=1500, help="val images to evaluate, spread over the classes")
    parser.add_argument("--results", help="what is committed (default: the study's folder under results/)")
    parser.add_argument("--runs", help="training outputs, checkpoints (default: the study's folder under output/)")
    parser.add_argument("--readme", default="README.md", help="the README whose study section is rewritten")
    parser.add_argument("--report", action="store_true", help="only rebuild the report from the study's results")
    args = parser.parse_args(argv)
    configs, results, outputs, arms = STUDIES[args.study]
    results, outputs = Path(args.results or results), Path(args.runs or outputs)
    unknown = sorted(set(args.arms or ()) - set(arms))
    if unknown:
        parser.error(f"study {args.study} has no arm {', '.join(unknown)}; its arms are {', '.join(arms)}")
    os.chdir(ROOT)
    if args.report:
        print(write_study(results, Path(args.readme)))
        return 0
    results.mkdir(parents=True, exist_ok=True)
    study = json.loads((results / "runs.json").read_text()) if (results / "runs.json").exists() else []
    host = json.loads((results / "machine.json").read_text()) if (results / "machine.json").exists() else {}
    here, machines = machine(), host.pop("machines", {})
    home = {key: value for key, value in host.items() if key != "evaluate_s"} or here  # where the study began
    seconds = host.get("evaluate_s", {})
    seconds = seconds if isinstance(seconds, dict) else {"all arms": seconds}  # v1 evaluated every run at once
    commands = (results / "commands.sh").read_text().splitlines()[1:] if (results / "commands.sh").exists() else []
    for arm in args.arms or arms:
        label, baseline = arms[arm]
        config = f"{configs}/{arm}.yaml"
        entries = [{"name": f"{arm}_s{seed}", "model": arm, "label": label, "baseline": baseline, "seed": seed,
                    "config": config, "output": str(outputs / f"{arm}_s{seed}")} for seed in args.seeds]
        train = [["python", "train.py", "-c", config, "--output", entry["output"], f"seed={entry['seed']}"]
                 for entry in entries]
        ran = False  # whether this machine trained or evaluated any of the arm
        for entry, command in zip(entries, train, strict=True):
            out = Path(entry["output"])
            if not finished(out / "last.pth", build_config(config, [f"seed={entry['seed']}"]).epochs):
                run([*command, *([f"resume={out / 'last.pth'}"] if (out / "last.pth").exists() else [])])
                ran = True
            (results / "runs" / entry["name"]).mkdir(parents=True, exist_ok=True)
            for file in ("config.yaml", "metrics.csv"):
                shutil.copy(out / file, results / "runs" / entry["name"] / file)
        evaluate = ["python", "-m", "vit_rope.evaluate", "--checkpoint", *(f"{e['output']}/last.pth" for e in entries),
                    "--img-sizes", *map(str, args.img_sizes), "--policy", *POLICIES, "--limit", str(args.limit),
                    "--workers", "0", "--output", str(results / "eval" / arm)]  # both cores compute
        if not evaluated(results / "eval", entries):
            seconds[arm], ran = round(run(evaluate)), True
        if ran:
            machines.pop(arm, None)
            if not same_machine(here, home):
                machines[arm] = here
        study = [entry for entry in study if entry["name"] not in {e["name"] for e in entries}] + entries
        commands = [line for line in commands if f" {config} " not in line and not line.endswith(f"/eval/{arm}")]
        commands += [shlex.join(command) for command in [*train, evaluate]]
        (results / "runs.json").write_text(json.dumps(study, indent=2) + "\n")
        (results / "machine.json").write_text(json.dumps(
            {**home, "evaluate_s": seconds, **({"machines": machines} if machines else {})}, indent=2) + "\n")
        (results / "commands.sh").write_text("# the study's commands, as scripts/imagenette_study.py runs them\n"
                                             + "\n".join(commands) + "\n")
        print(write_study(results, Path(args.readme)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
