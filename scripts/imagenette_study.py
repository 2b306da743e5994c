"""Resolution-extrapolation studies on Imagenette: which models and training recipes hold accuracy above 64 px.

    python scripts/imagenette_study.py                 # v2: train and evaluate every arm x seed, seed 0 of all first
    python scripts/imagenette_study.py --study v1      # v1: APE vs RoPE-Axial vs RoPE-Mixed (and +APE), one recipe
    python scripts/imagenette_study.py --study v3      # v3: a 14x14 training grid (RoPE-ViT's), evaluated to 2.29x
    python scripts/imagenette_study.py --study encodings --seeds 0 && \
        python scripts/imagenette_study.py --study encodings --arms golden string_mixed lookhere alibi nope --seeds 1
                                                       # position encodings on v2's 8x8 grid (controls: one seed)
    python scripts/imagenette_study.py --study encodings --arms pape comrope_ld liere pape_ri comrope_ap --seeds 0 1
                                                       # the parabolic and Lie-group kinds on the same grid
    python scripts/imagenette_study.py --study encodings --arms fire --seeds 0 1   # FIRE on the same grid
    python scripts/imagenette_study.py --study swin    # a small Swin: relative position bias, RoPE-Axial, RoPE-Mixed
    python scripts/imagenette_study.py --study vit_s   # on CUDA GPUs: ViT-S on the 14x14 grid, torchrun over all GPUs
    python scripts/imagenette_study.py --report        # only rebuild the report and its docs section from the files
    python scripts/imagenette_study.py --arms mixed_p8 ape_p8 --seeds 0 1 2   # a subset, or more seeds

v1 trains five models with one recipe (``configs/imagenette_study/``). v2 (``configs/imagenette_study/v2/``) holds the
model fixed and changes the training: coordinate augmentation, variable resolution (``train_sizes``) and an 8x8
patch grid, each with the APE model trained the same way as its baseline. v3 (``configs/imagenette_study/v3/``)
trains APE, RoPE-Axial and RoPE-Mixed on RoPE-ViT's 14x14 grid (8 px patches at 112 px) and evaluates them at
RoPE-ViT's size ratios (80-256 px), at crop 1.0 and, as trained, at crop 0.875 too. The Swin study
(``configs/imagenette_study/swin/``) evaluates with windows that scale with the image (where the policies act) and, as
trained, with the trained windows kept (``studies.catalog.EVAL_OPTIONS``, ``SECOND_EVAL``).

Runs go seed by seed: the first seed of every arm, then the second, so that a whole one-seed comparison exists as
early as possible (arms in ``LATER``, such as v3's remedy, wait until every seed of the others is done). Each run is
``train.py`` on the arm's config with ``seed=S``; a run whose ``last.pth`` holds the final epoch is kept and an
unfinished one resumes, so an interrupted study goes on where it stopped. As soon as a run has finished, its final
checkpoint (``last.pth``: nothing is selected on the val images) is evaluated with ``vit_rope.evaluate`` at the
study's sizes under every RoPE policy into ``eval/<arm>/<run>/``, its config and ``metrics.csv`` (and the list of
its train images, ``train_subset.txt``, when it trains on a ``train_fraction``) are copied into ``runs/``, and the
report (``summary.md``, plots, the docs section) is rebuilt from the files by ``studies.report.write_study``, which
merges the seeds evaluated so far, together with the table that puts every study side by side (``studies.compare``).
Checkpoints a run kept part-way (``keep_every`` in its config, as in v3) are evaluated with positions as trained into
``course/<arm>/<run>/`` for the table of accuracy over the schedule (``studies.course``). A partial study is
therefore always a consistent one.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import describe_machine  # noqa: E402
from studies.catalog import (  # noqa: E402
    COMPARED,
    CONTROLS,
    EVAL_OPTIONS,
    GOALS,
    HEADLINE,
    LATER,
    PAIRS,
    REPRODUCES,
    SECOND_EVAL,
    SIZES,
    STUDIES,
)
from studies.compare import (  # noqa: E402
    HEADLINE_END,
    REPRODUCTION_END,
    headline,
    headline_begin,
    reproduction,
    reproduction_begin,
    write_comparison,
)
from studies.course import COURSE, COURSE_END, course_begin, course_table  # noqa: E402
from studies.goal import Control, Goal  # noqa: E402
from studies.paired import Pair  # noqa: E402
from studies.report import machines_by_run, write_study  # noqa: E402
from studies.results import is_run, replace_section  # noqa: E402
from vit_rope.encodings.policies import POLICIES  # noqa: E402
from vit_rope.models.pos_encoding import resolution_encoding  # noqa: E402
from vit_rope.models.registry import create_model  # noqa: E402
from vit_rope.train.command_line import build_config  # noqa: E402  (after the path set-up, as the script runs from anywhere)
from vit_rope.train.config import load_yaml  # noqa: E402
from vit_rope.train.state import load_checkpoint  # noqa: E402


@functools.cache  # built once per config, not once per seed
def evaluation_policies(config: str) -> tuple[tuple[str, ...], str]:
    """The resolution policies that apply to a config's model (all of them for a model without an encoding to
    choose), and its own: its positions as trained (``normalized`` for DINOv3's RoPE, else ``extrapolate``)."""
    settings = build_config(config)
    model = create_model(settings.model, {**settings.model_kwargs, "img_size": settings.img_size})[0]
    encoding = resolution_encoding(model)
    return (POLICIES, "extrapolate") if encoding is None else (encoding.policies, encoding.policy.name)


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
    """Whether two ``benchmarks.machine.describe_machine`` records describe the same hardware and software (dates
    aside)."""
    return all(one.get(key) == other.get(key) for key in ("cpu", "cores", "gpu", "torch", "timm"))


def evaluated(folder: Path, runs: list[dict], checkpoints: tuple[str, ...]) -> bool:
    """Whether the ``results.json`` files under ``folder`` hold each of ``checkpoints`` of every one of ``runs``."""
    labels = {row["model"] for path in folder.rglob("results.json") for row in json.loads(path.read_text())["results"]}
    return all(any(is_run(label, entry, name) for label in labels) for entry in runs for name in checkpoints)


def write_reports(study: str, results: Path, readme: Path, plots: bool = True) -> None:
    """The study's report and docs section, the side-by-side table, and (for the committed results of the study
    the README summarises) the README's table; the plots too with ``plots`` (a study draws them once, at its end:
    an interrupted one gets them from ``--report``)."""
    controls = [Control(name, COMPARED[source], arm) for name, source, arm in CONTROLS.get(study, [])]
    pairs = [Pair(arm, Control(f"{source}'s {STUDIES[source][3][theirs][0]}", COMPARED[source], theirs))
             for arm, source, theirs in PAIRS.get(study, [])]
    print(write_study(results, readme, GOALS.get(study, Goal()), controls, pairs, plots))
    course = course_table(results, json.loads((results / "runs.json").read_text()))
    if course:  # on the page when it has the markers
        replace_section(readme, course_begin(results), COURSE_END, course)
    if study in REPRODUCES:  # on the page when it has the markers
        source, arms = REPRODUCES[study]
        replace_section(readme, reproduction_begin(results), REPRODUCTION_END,
                        reproduction(results, COMPARED[source], arms))
    write_comparison(readme, COMPARED)
    if study == HEADLINE and results.resolve() == COMPARED[study].resolve():  # the script runs from the root
        replace_section(Path("README.md"), headline_begin(results), HEADLINE_END, headline(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=STUDIES, default="v2")
    parser.add_argument("--arms", nargs="+", help="arms to run, in this order (default: all of the study's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--img-sizes", type=int, nargs="+",
                        help="evaluation sizes (default: the study's, e.g. 0.75x-2.5x of v2's 64 px training size)")
    parser.add_argument("--limit", type=int, default=1500, help="val images to evaluate, spread over the classes")
    parser.add_argument("--results", help="what is committed (default: the study's folder under results/)")
    parser.add_argument("--runs", help="training outputs, checkpoints (default: the study's folder under output/)")
    parser.add_argument("--readme", help="the page whose study section is rewritten (default: docs/studies.md)")
    parser.add_argument("--report", action="store_true", help="only rebuild the report from the study's results")
    parser.add_argument("--skip-kept", action="store_true",
                        help="do not evaluate the checkpoints a run kept part-way (keep_every), when time is short: "
                        "the schedule table then lacks the run")
    parser.add_argument("--data-dir", help="dataset root with train/ and val/ (default: the configs', i.e. "
                        "../shared/data/imagenette when it exists)")
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count(),
                        help="GPUs to train on (default: all); more than one trains with torchrun and splits each "
                        "config's batch over them, so the global batch stays the config's")
    args = parser.parse_args(argv)
    configs, results, outputs, arms = STUDIES[args.study]
    sizes = [str(size) for size in args.img_sizes or SIZES[args.study]]
    # paths given are the caller's, relative to where it runs; the defaults are the repository's (the script works
    # from its root, where the configs are)
    results, outputs = (Path(given).resolve() if given else Path(default)
                        for given, default in ((args.results, results), (args.runs, outputs)))
    readme = Path(args.readme).resolve() if args.readme else Path("docs/studies.md")
    data = ["--data-dir", str(Path(args.data_dir).resolve())] if args.data_dir else []
    unknown = sorted(set(args.arms or ()) - set(arms))
    if unknown:
        parser.error(f"study {args.study} has no arm {', '.join(unknown)}; its arms are {', '.join(arms)}")
    os.chdir(ROOT)
    if args.report:
        if not (results / "runs.json").exists():
            print(f"error: {results} holds no finished run of study {args.study} yet (no runs.json): run "
                  f"`python scripts/imagenette_study.py --study {args.study}` first", file=sys.stderr)
            return 2
        try:
            write_reports(args.study, results, readme)
        except (FileNotFoundError, ValueError) as err:  # no evaluation yet, mixed protocols, no docs section
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    results.mkdir(parents=True, exist_ok=True)
    study = json.loads((results / "runs.json").read_text()) if (results / "runs.json").exists() else []
    host = json.loads((results / "machine.json").read_text()) if (results / "machine.json").exists() else {}
    here, machines = describe_machine(), machines_by_run(host.pop("machines", {}), study)
    home = {key: value for key, value in host.items() if key != "evaluate_s"} or here  # where the study began
    seconds = host.get("evaluate_s", {})
    seconds = seconds if isinstance(seconds, dict) else {"all arms": seconds}  # v1 evaluated every run at once
    commands = (results / "commands.sh").read_text().splitlines()[1:] if (results / "commands.sh").exists() else []
    chosen = args.arms or list(arms)
    later = [arm for arm in chosen if arm in LATER.get(args.study, ())]
    # every arm's first seed before any second one, so that a whole comparison exists as early as possible
    plan = [(seed, arm) for group in ([arm for arm in chosen if arm not in later], later) for seed in args.seeds
            for arm in group]
    for step, (seed, arm) in enumerate(plan, start=1):
        label, baseline = arms[arm]
        config = f"{configs}/{arm}.yaml"
        name, out = f"{arm}_s{seed}", outputs / f"{arm}_s{seed}"
        entry = {"name": name, "model": arm, "label": label, "baseline": baseline, "seed": seed,
                 "config": config, "output": str(out)}
        launch, batch = ["python", "train.py"], []
        if args.gpus > 1:  # one process per GPU, each with its share of the batch
            launch = ["python", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.gpus}",
                      "train.py"]
            batch = [f"batch_size={build_config(config).batch_size // args.gpus}"]
        train = [*launch, "-c", config, *data, "--output", str(out), *batch, f"seed={seed}"]
        ran = False  # whether this machine trained or evaluated the run
        cfg = build_config(config, [f"seed={seed}"])
        if not finished(out / "last.pth", cfg.epochs):
            run([*train, *([f"resume={out / 'last.pth'}"] if (out / "last.pth").exists() else [])])
            ran = True
        (results / "runs" / name).mkdir(parents=True, exist_ok=True)
        for file in ("config.yaml", "metrics.csv", *(["train_subset.txt"] if cfg.train_fraction < 1 else [])):
            shutil.copy(out / file, results / "runs" / name / file)
        head = ["python", "-m", "vit_rope.evaluate", "--checkpoint", f"{out}/last.pth", "--img-sizes", *sizes]
        tail = [*data, "--limit", str(args.limit), "--workers", "0"]  # both cores compute
        policies, trained = evaluation_policies(config)
        if trained != "extrapolate":  # DINOv3's normalised coordinates: its positions as trained are `normalized`
            entry["as_trained"] = trained
        own = [] if trained == "extrapolate" else ["--policy", trained]  # as trained, at the second crop, kept epochs
        main_options = EVAL_OPTIONS.get(args.study, [])
        evaluations = [([*head, "--policy", *policies, *main_options, *tail, "--output",
                         str(results / "eval" / arm / name)], results / "eval", ("last.pth",))]
        if args.study in SECOND_EVAL:  # positions as trained (the default policy) at the second crop or window rule
            second, options = SECOND_EVAL[args.study]
            evaluations.append(([*head, *own, *options, *tail, "--output", str(results / second / arm / name)],
                                results / second, ("last.pth",)))
        keep = load_yaml(out / "config.yaml").get("keep_every") or 0  # the run's own (runs before keep_every: none)
        kept = [out / f"epoch_{epoch}.pth" for epoch in (range(keep, cfg.epochs, keep) if keep else ())]  # part-way
        if kept and not args.skip_kept:
            evaluations.append((["python", "-m", "vit_rope.evaluate", "--checkpoint", *map(str, kept), "--img-sizes",
                                 *sizes, *own, *main_options, *tail, "--output", str(results / COURSE / arm / name)],
                                results / COURSE, tuple(path.name for path in kept)))
        for index, (command, folder, checkpoints) in enumerate(evaluations):
            if not evaluated(folder, [entry], checkpoints):  # seconds: the run's evaluations on this machine
                seconds[name] = round(run(command)) + (seconds.get(name, 0) if index else 0)
                ran = True
        if ran:
            machines.pop(name, None)
            if not same_machine(here, home):
                machines[name] = here
        place = next((i for i, other in enumerate(study) if other["name"] == name), None)
        if place is None:
            study.append(entry)
        else:  # a run keeps its place in the tables: arms in first-run order
            study[place] = entry
        commands = [line for line in commands if f" {out} " not in line and f" {out}/" not in line]
        commands += [shlex.join(command) for command in [train, *(command for command, _, _ in evaluations)]]
        (results / "runs.json").write_text(json.dumps(study, indent=2) + "\n")
        (results / "machine.json").write_text(json.dumps(
            {**home, "evaluate_s": seconds, **({"machines": machines} if machines else {})}, indent=2) + "\n")
        (results / "commands.sh").write_text("# the study's commands, as scripts/imagenette_study.py runs them\n"
                                             + "\n".join(commands) + "\n")
        write_reports(args.study, results, readme, plots=step == len(plan))  # the tables after every run
    return 0


if __name__ == "__main__":
    sys.exit(main())
