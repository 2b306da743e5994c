"""Seed-merged report of a resolution-extrapolation study (``scripts/imagenette_study.py``): tables, plots, a verdict.

A study folder holds what the runs left, and the report is rebuilt from those files only:

- ``runs.json``: one entry per training run: ``name``, ``model`` (the arm), ``seed``, ``output``, and optionally
  ``label`` (the arm's name in tables) and ``baseline`` (the arm of the APE model trained with the same recipe);
- ``eval/**/results.json``: ``vit_rope.evaluate`` output, one file for all runs or one per arm;
- ``runs/<name>/metrics.csv``, ``machine.json`` and ``commands.sh``. ``machine.json`` is
  ``vit_rope.eval.report.machine`` of the study's machine, ``evaluate_s`` (seconds, per arm or in all) and, for arms
  run on another machine (a study resumed elsewhere), ``machines``: run name -> that machine (an arm's name in
  earlier files: all its runs), so minutes per run are read against the right one.

The verdict applies the goal of RoPE-ViT (Heo et al., ECCV 2024), whose RoPE-Mixed loses 1.8 points from 224 to
512 px while APE loses 5.0: RoPE with positions as trained stays within 1 point of its training-size accuracy at
2x the training size, and is above the APE model of the same recipe at 2x and at the largest size, with every seed
(the seed ranges do not overlap). A study can name controls from another study's files (``Control``) that its RoPE
arms must beat as well.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_rope.eval.report import markdown_table, merge_seeds, plot, plot_panels, replace_section, table

STUDY_LABELS = {"ape": "APE (timm ViT)", "axial": "RoPE-Axial", "mixed": "RoPE-Mixed", "axial_ape": "RoPE-Axial + APE",
                "mixed_ape": "RoPE-Mixed + APE"}  # v1's arms, whose runs.json predates the label field
STUDY_END = "<!-- study:end -->"
HOLD_POINTS = 1.0  # the largest loss from the training size that counts as holding accuracy


@dataclass(frozen=True)
class Goal:
    """Where a RoPE arm must hold its accuracy and where it must beat its APE baseline, as ratios of the training
    size (``None``: the largest size evaluated); each ratio is matched to the nearest evaluated size within 3%.

    The default is v1 and v2's goal (hold at 2x; beat APE at 2x and at the largest size); study v3 takes RoPE-ViT's
    own reading of its table: hold at 1.43x-1.71x (320 and 384 px of a 224 px model) and beat APE at 2.29x (512 px).
    """

    hold: tuple[float, ...] = (2.0,)
    beat: tuple[float | None, ...] = (2.0, None)

    def describe(self, controls: Sequence[str] = ()) -> str:
        """The goal in words; ``controls``: the names of the other APE arms to beat (``Control``)."""
        def at(ratios: tuple[float | None, ...]) -> str:
            return " and ".join(f"at {ratio:g}x" if ratio is not None else "at the largest size" for ratio in ratios)

        apes = ["the APE model of the same recipe", *controls]
        named = " and ".join([", ".join(apes[:-1]), apes[-1]] if controls else apes)
        return (f"within {HOLD_POINTS:g} point of the training-size top-1 {at(self.hold)}, and above {named} "
                f"{at(self.beat)}")


@dataclass(frozen=True)
class Control:
    """An APE arm of another study that this study's RoPE arms must also beat at the goal's sizes, read from that
    study's committed files: ``name`` in the tables, its study's ``results_dir`` and its ``arm``."""

    name: str
    results_dir: Path
    arm: str


def control_rows(control: Control, folder: str, protocol: str) -> dict[int, dict[str, Any]] | None:
    """The control's seed-merged rows with positions as trained, by size, from its study's ``folder`` (``eval`` or
    ``eval_crop<fraction>``); None when that study has no such folder. Its protocol must be ``protocol``, the one of
    the rows it is set against."""
    if not (control.results_dir / folder).is_dir():
        return None
    runs = [run for run in json.loads((control.results_dir / "runs.json").read_text()) if run["model"] == control.arm]
    rows: dict[int, dict[str, Any]] = {}
    if runs:
        theirs, merged = merged_results(control.results_dir / folder, runs)
        rows = as_trained_by_arm(merged, trained_policies(runs)).get(arm_label(runs[0]), {})
    if not rows:
        raise ValueError(f"{control.results_dir / folder} holds no evaluated run of arm {control.arm!r}, the control "
                         f"{control.name!r}: evaluate it there or drop the control")
    if theirs != protocol:
        raise ValueError(f"the control {control.name!r} was evaluated as {theirs!r}, this study as {protocol!r}: "
                         "a verdict needs one protocol")
    return rows


def study_begin(results_dir: Path) -> str:
    """The line that opens the section of the study in ``results_dir`` (a path relative to the repo) in its docs page
    (``docs/studies.md``)."""
    return f"<!-- study:begin (written by scripts/imagenette_study.py --report from {results_dir.as_posix()}) -->"


def is_run(label: str, run: dict[str, Any], checkpoint: str = "last.pth") -> bool:
    """Whether a ``vit_rope.evaluate`` row label (``"<model> (<checkpoint>)"``) is the final checkpoint of ``run`` (or
    the one named ``checkpoint`` in its output folder)."""
    return label.endswith(f"({run['output']}/{checkpoint})")


def arm_label(run: dict[str, Any]) -> str:
    """The name of a run's arm in the tables: its ``label`` in runs.json, else the study's name of its model, so that
    two arms of one model (e.g. with and without a training remedy) stay apart."""
    return run.get("label") or STUDY_LABELS.get(run["model"], run["model"])


def spread(row: dict[str, Any]) -> str:
    """A merged row's top-1 as ``mean ± half the range over seeds``, the tables' one measure of seed spread; a single
    seed's top-1 alone, since ``± 0.0`` would read as seeds that agree."""
    if row.get("seeds", 2) < 2:
        return f"{row['top1']:.2f}"
    return f"{row['top1']:.2f} ± {(row['top1_max'] - row['top1_min']) / 2:.1f}"


def machines_by_run(machines: dict[str, dict[str, Any]], runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``machine.json``'s ``machines`` keyed by run name: an arm's name (how earlier files recorded it) stands for
    every run of that arm."""
    by_run = {name: host for name, host in machines.items() if name not in {run["model"] for run in runs}}
    return {**{run["name"]: machines[run["model"]] for run in runs if run["model"] in machines}, **by_run}


def _training(results_dir: Path, runs: Sequence[dict[str, Any]], elsewhere: dict[str, dict[str, Any]]) -> str:
    """Per arm: final val top-1 at the training size (all val images) over seeds, and minutes per run: their mean,
    or each seed's when the arm's runs trained on different machines (``elsewhere``: run name -> machine)."""
    by_model: dict[str, list[tuple[float, float, str]]] = {}
    for run in runs:
        with open(results_dir / "runs" / run["name"] / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        by_model.setdefault(arm_label(run), []).append((float(rows[-1]["top1"]),
                                                     sum(float(row["seconds"]) for row in rows) / 60,
                                                     _host(elsewhere[run["name"]]) if run["name"] in elsewhere
                                                     else "home"))
    lines = []
    for model, values in by_model.items():
        top1, minutes = [value[0] for value in values], [value[1] for value in values]
        merged = {"top1": sum(top1) / len(top1), "top1_min": min(top1), "top1_max": max(top1), "seeds": len(top1)}
        hosts = len({value[2] for value in values})
        lines.append([model, len(values), spread(merged), f"{sum(minutes) / len(minutes):.1f}" if hosts == 1 else
                      " / ".join(f"{value:.1f}" for value in minutes) + f" ({hosts} machines)"])
    return table(["model", "seeds", "final val top-1 (%)", "minutes per run"], lines)


def trained_policies(runs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Arm label -> the policy that places positions as the arm was trained: ``as_trained`` in runs.json (DINOv3's
    RoPE: ``normalized``), else ``extrapolate``."""
    return {arm_label(run): run.get("as_trained", "extrapolate") for run in runs}


def is_as_trained(row: dict[str, Any], policies: dict[str, str]) -> bool:
    """Whether a merged row has positions as its arm was trained (``trained_policies``; APE has no policy)."""
    return row["policy"] is None or row["policy"] == policies.get(row["model"], "extrapolate")


def as_trained_by_arm(merged: Sequence[dict[str, Any]], policies: dict[str, str] | None = None
                      ) -> dict[str, dict[int, dict[str, Any]]]:
    """Arm label -> size -> its merged row with positions as trained (``is_as_trained``)."""
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for row in merged:
        if is_as_trained(row, policies or {}):
            table.setdefault(row["model"], {})[row["img_size"]] = row
    return table


def training_row(by_size: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """An arm's row at its own training size from its rows by size (``as_trained_by_arm``), or None if not evaluated."""
    return next((row for row in by_size.values() if row["img_size"] == row["train_size"]), None)


def best_row(merged: Sequence[dict[str, Any]], model: str, size: int) -> dict[str, Any]:
    """The merged row of ``model`` with the highest top-1 at ``size`` over its policies (as trained included)."""
    rows = (row for row in merged if row["model"] == model and row["img_size"] == size)
    return max(rows, key=lambda row: row["top1"])


def as_trained_rows(merged: Sequence[dict[str, Any]], policies: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The merged rows with positions as trained (``is_as_trained``)."""
    return [row for row in merged if is_as_trained(row, policies or {})]


def _changes(merged: Sequence[dict[str, Any]], policies: dict[str, str]) -> str:
    """Per arm: top-1 change from the training size to the largest size, as trained and under the best policy."""
    largest = max(row["img_size"] for row in merged)
    lines = []
    for model, by_size in as_trained_by_arm(merged, policies).items():
        trained, plain, best = training_row(by_size), by_size[largest], best_row(merged, model, largest)
        lines.append([model, f"{trained['top1']:.2f}", f"{plain['top1']:.2f} ({plain['top1'] - trained['top1']:+.1f})",
                      f"{best['top1']:.2f} ({best['top1'] - trained['top1']:+.1f}, {best['policy'] or '-'})"])
    return table(["model", "top-1 at training size", f"at {largest}, as trained", f"at {largest}, best policy"], lines)


def _side(row: dict[str, Any], other: dict[str, Any]) -> str:
    """How two merged rows' seed ranges lie: ``apart`` when every seed of ``row`` is above every seed of ``other``,
    ``below`` when every one is under, else ``overlap``."""
    return "apart" if row["top1_min"] > other["top1_max"] else "below" if row["top1_max"] < other["top1_min"] \
        else "overlap"


def _one_seed(row: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether either row has one seed, whose "range" is a point: how the ranges lie then says nothing yet."""
    return min(row["seeds"], other["seeds"]) < 2


def _gap(row: dict[str, Any], other: dict[str, Any]) -> str:
    """Mean difference of two merged rows and how their seed ranges lie (``_side``; ``1 seed`` while one has one)."""
    return f"{row['top1'] - other['top1']:+.1f} ({'1 seed' if _one_seed(row, other) else _side(row, other)})"


def _size_at(ratio: float | None, train_size: int, sizes: Sequence[int]) -> int | None:
    """The evaluated size at ``ratio`` times the training size (``None``: the largest), within 3%, else None."""
    if ratio is None:
        return max(sizes)
    size = min(sizes, key=lambda size: abs(size - ratio * train_size))
    return size if abs(size - ratio * train_size) <= 0.03 * ratio * train_size else None


def _verdict(merged: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], goal: Goal,
             controls: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The goal, per RoPE arm that names its APE baseline (and against every control: name -> its rows by size),
    then the best arm per size."""
    as_trained = as_trained_by_arm(merged, trained_policies(runs))
    labels = {run["model"]: arm_label(run) for run in runs}
    lines, header = [], []
    for arm, baseline in dict.fromkeys((run["model"], run.get("baseline")) for run in runs):
        rows, ape = as_trained.get(labels[arm], {}), as_trained.get(labels.get(baseline, ""), {})
        trained = training_row(rows)
        if baseline is None or trained is None or not ape:
            continue
        base = trained["train_size"]
        hold = [_size_at(ratio, base, list(rows)) for ratio in goal.hold]
        beat = [_size_at(ratio, base, list(rows)) for ratio in goal.beat]
        others = [ape, *controls.values()]  # every APE the arm must beat
        if None in hold or None in beat or any(size not in other for size in beat for other in others):
            continue
        shown = list(dict.fromkeys(hold + beat))
        names = {size: "2x" if size == 2 * base else str(size) for size in shown}
        pairs = [(rows[size], other[size]) for other in others for size in beat]
        met = all(rows[size]["top1"] - trained["top1"] >= -HOLD_POINTS for size in hold) and all(
            _side(*pair) == "apart" for pair in pairs)
        seeds = min(row["seeds"] for row in [trained, *(rows[size] for size in shown), *(pair[1] for pair in pairs)])
        lines.append([labels[arm], spread(trained),
                      *(f"{spread(rows[size])} ({rows[size]['top1'] - trained['top1']:+.1f})" for size in shown),
                      *(_gap(*pair) for pair in pairs),
                      ("yes" if met else "no") + ("" if seeds > 1 else " so far (1 seed: no seed range yet)")])
        header = ["model", "at training size", *(f"at {names[size]}, as trained" for size in shown),
                  *((f"minus {other} at " if i == 0 else "at ") + names[size]
                    for other in ["APE of the same recipe", *controls] for i, size in enumerate(beat)), "goal met"]
    picks = []
    for size in sorted({row["img_size"] for row in merged}):
        plain = sorted((rows[size] for rows in as_trained.values() if size in rows), key=lambda row: -row["top1"])
        best = max((row for row in merged if row["img_size"] == size), key=lambda row: row["top1"])
        ranges = "" if len(plain) < 2 else "1 seed: no range yet" if _one_seed(*plain[:2]) else \
            f"seed ranges {_side(plain[0], plain[1])}"
        runner = f", then {plain[1]['model']} {spread(plain[1])} ({ranges})" if ranges else ""
        picks.append(f"- **{size} px** ({size / plain[0]['train_size']:.2g}x): as trained {plain[0]['model']} "
                     f"{spread(plain[0])}{runner}; with any policy {best['model']} [{best['policy'] or '-'}] "
                     f"{spread(best)}.")
    verdicts = table(header, lines) if lines else "(no RoPE arm has its APE baseline evaluated yet)"
    return verdicts + "\n\nBest arm at each size (top-1 mean ± half the seed range):\n\n" + "\n".join(picks)


def counted(number: int, noun: str) -> str:
    """``number`` and ``noun``, plural unless one (``1 seed``, ``2 seeds``), for the generated sentences."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _host(machine: dict[str, Any]) -> str:
    cores = f"{machine['cores']} cores" + (f", {machine['gpu']}" if machine["gpu"] else "")
    return f"{machine['cpu'] or 'CPU'} ({cores}), torch {machine['torch']}, timm {machine['timm']}"


def read_evaluations(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """The protocol and rows of every ``results.json`` under ``folder``; they must share one protocol."""
    files = sorted(folder.rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no results.json: run the study's evaluation first")
    evaluations = [json.loads(path.read_text()) for path in files]
    protocols = {evaluation["protocol"] for evaluation in evaluations}
    if len(protocols) > 1:
        raise ValueError(f"the evaluations under {folder} used different protocols: {sorted(protocols)}")
    return protocols.pop(), [row for evaluation in evaluations for row in evaluation["results"]]


def merged_results(folder: Path, runs: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The protocol of the evaluations under ``folder`` and their rows merged over seeds, arms in ``runs``' order."""
    protocol, results = read_evaluations(folder)
    index = {row["model"]: next((i for i, run in enumerate(runs) if is_run(row["model"], run)), None)
             for row in results}  # evaluation label -> its run in runs.json; others (not in this study) left out
    results = sorted((row for row in results if index[row["model"]] is not None), key=lambda row: index[row["model"]])
    return protocol, merge_seeds(results, {label: arm_label(runs[i]) for label, i in index.items() if i is not None})


def write_study(results_dir: Path, readme: Path | None = None, goal: Goal = Goal(),
                controls: Sequence[Control] = ()) -> str:
    """Seed-merged report of a study folder: ``summary.md``, two plots and, given ``readme`` (the docs page, e.g.
    ``docs/studies.md``), that page's section between ``study_begin(results_dir)`` and the next ``STUDY_END``.
    ``results_dir`` is relative to the repo root, and the section names its files by that path. Evaluations at a
    second crop fraction (``eval_crop<fraction>/``) get their own table and verdict. The verdict also sets the RoPE
    arms against ``controls`` (APE arms of other studies, at each crop where they were evaluated). Returns the
    section."""
    runs = json.loads((results_dir / "runs.json").read_text())
    machine = json.loads((results_dir / "machine.json").read_text())
    protocol, merged = merged_results(results_dir / "eval", runs)
    as_trained = as_trained_rows(merged, trained_policies(runs))
    policies = [row for row in merged if row["policy"] is not None]
    plot(as_trained, results_dir / "summary_as_trained.png", "Positions as trained (mean and range over seeds)")
    if policies:  # none while only APE arms are evaluated
        plot_panels({policy: [row for row in policies if row["policy"] == policy]
                     for policy in dict.fromkeys(row["policy"] for row in policies)},
                    results_dir / "summary_policies.png", "RoPE models under each resolution policy (mean, seed range)")
    seeds = sorted({run["seed"] for run in runs})
    arms = len({run["model"] for run in runs})
    seconds = machine["evaluate_s"] if isinstance(machine["evaluate_s"], int | float) else sum(
        machine["evaluate_s"].values())  # v2 records one evaluation per arm
    note = ("top-1 (%) on Imagenette val, mean ± half the range over seeds " + ", ".join(map(str, seeds))
            + "; `*` training size. " + protocol + ".")
    where = results_dir.as_posix()
    own = ", or `normalized` for an arm trained on normalised coordinates" if any("as_trained" in run for run in runs) \
        else ""
    by_run = machines_by_run(machine.get("machines", {}), runs)
    elsewhere: dict[str, dict[str, list[int]]] = {}  # the other machines -> arm label -> the seeds run on each
    for run in runs:
        if run["name"] in by_run:
            elsewhere.setdefault(_host(by_run[run["name"]]), {}).setdefault(arm_label(run), []).append(run["seed"])
    every = {label: sorted(run["seed"] for run in runs if arm_label(run) == label) for label in map(arm_label, runs)}
    others = "".join(
        "; " + ", ".join(label if seeds == every[label] else f"{label} (seed {', '.join(map(str, seeds))})"
                         for label, seeds in there.items()) + f" on {host}" for host, there in elsewhere.items())
    parts = [
        f"{counted(len(runs), 'training run')} ({counted(arms, 'model')} x {counted(len(seeds), 'seed')}) on "
        f"{_host(machine)}, {machine['date']}"
        f"{others}; evaluation took {seconds / 60:.0f} min. Commands: `{where}/commands.sh`.",
        "**Training** (final epoch, all val images at the training size):\n\n" + _training(results_dir, runs, by_run),
        f"**Positions as trained** (`extrapolate`{own}; APE resampled bicubically). {note}\n\n"
        + markdown_table(as_trained),
        *(["**Every resolution policy** (RoPE models):\n\n" + markdown_table(policies)] if policies else []),
        "**From the training size to the largest size:**\n\n" + _changes(merged, trained_policies(runs)),
    ]
    verdict = any(run.get("baseline") for run in runs)

    def against(folder: str, protocol: str) -> dict[str, dict[int, dict[str, Any]]]:  # the controls evaluated there
        found = {control.name: control_rows(control, folder, protocol) for control in controls}
        return {name: rows for name, rows in found.items() if rows is not None}

    if verdict:
        names = [control.name for control in controls]
        parts.append(f"**Does RoPE hold its accuracy?** Goal: as trained, {goal.describe(names)} with every seed "
                     "(seed ranges apart). `apart`: every seed of the RoPE arm above every seed of its APE; `below`: "
                     "every one under; `overlap`: neither.\n\n"
                     + _verdict(merged, runs, goal, against("eval", protocol)))
    for folder in sorted(results_dir.glob("eval_crop*")):  # one crop fraction can favour one arm
        crop_protocol, crop = merged_results(folder, runs)
        parts.append(f"**At crop {folder.name.removeprefix('eval_crop')}**, positions as trained ({crop_protocol}):"
                     "\n\n" + markdown_table(as_trained_rows(crop, trained_policies(runs)))
                     + ("\n\nThe goal at this crop:\n\n"
                        + _verdict(crop, runs, goal, against(folder.name, crop_protocol)) if verdict else ""))
    def with_plots(folder: str) -> str:  # the plots, linked from a page in another folder
        return "\n\n".join([*parts, f"![as trained]({folder}summary_as_trained.png)"
                              + (f"\n![policies]({folder}summary_policies.png)" if policies else "")])

    section = with_plots("")
    (results_dir / "summary.md").write_text("# Resolution extrapolation on Imagenette\n\n" + section + "\n")
    if readme is not None:
        section = with_plots(Path(os.path.relpath(results_dir, readme.parent)).as_posix() + "/")
        begin = study_begin(results_dir)
        if not replace_section(readme, begin, STUDY_END, section):
            raise ValueError(f"{readme} has no study section to update: add the lines {begin!r} and {STUDY_END!r} "
                             "where it should go")
    return section
