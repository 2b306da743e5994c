"""Seed-merged report of a resolution-extrapolation study (``scripts/imagenette_study.py``): tables, plots, a verdict.

A study folder holds what the runs left, and the report is rebuilt from those files only: ``runs.json`` and
``eval/**/results.json`` (read by ``studies.results``), ``runs/<name>/metrics.csv``, ``machine.json`` and
``commands.sh``. ``machine.json`` is ``benchmarks.machine.describe_machine`` of the study's machine,
``evaluate_s`` (seconds, per arm or in all) and, for arms run on another machine (a study resumed elsewhere),
``machines``: run name -> that machine (an arm's name in earlier files: all its runs), so minutes per run are read
against the right one. The verdict is ``studies.goal``'s.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.goal import Control, Goal, control_rows, verdict
from studies.paired import Pair, paired
from studies.results import (
    arm_label,
    as_trained_by_arm,
    as_trained_rows,
    begin_marker,
    best_row,
    counted,
    merged_results,
    replace_section,
    second_evaluations,
    spread,
    trained_policies,
    training_row,
)
from vit_rope.eval.report import markdown_table, plot, plot_panels, table

STUDY_END = "<!-- study:end -->"


def study_begin(results_dir: Path) -> str:
    """The line that opens the section of the study in ``results_dir`` (a path relative to the repo) in its docs page
    (``docs/studies.md``)."""
    return begin_marker("study", f"--report from {results_dir.as_posix()}")


def machines_by_run(machines: dict[str, dict[str, Any]], runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``machine.json``'s ``machines`` keyed by run name: an arm's name (how earlier files recorded it) stands for
    every run of that arm."""
    by_run = {name: host for name, host in machines.items() if name not in {run["model"] for run in runs}}
    return {**{run["name"]: machines[run["model"]] for run in runs if run["model"] in machines}, **by_run}


def _host(machine: dict[str, Any]) -> str:
    cores = f"{machine['cores']} cores" + (f", {machine['gpu']}" if machine["gpu"] else "")
    return f"{machine['cpu'] or 'CPU'} ({cores}), torch {machine['torch']}, timm {machine['timm']}"


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


def _changes(merged: Sequence[dict[str, Any]], policies: dict[str, str]) -> str:
    """Per arm: top-1 change from the training size to the largest size, as trained and under the best policy."""
    largest = max(row["img_size"] for row in merged)
    lines = []
    for model, by_size in as_trained_by_arm(merged, policies).items():
        trained, plain, best = training_row(by_size), by_size[largest], best_row(merged, model, largest)
        lines.append([model, f"{trained['top1']:.2f}", f"{plain['top1']:.2f} ({plain['top1'] - trained['top1']:+.1f})",
                      f"{best['top1']:.2f} ({best['top1'] - trained['top1']:+.1f}, {best['policy'] or '-'})"])
    return table(["model", "top-1 at training size", f"at {largest}, as trained", f"at {largest}, best policy"], lines)


def write_study(results_dir: Path, readme: Path | None = None, goal: Goal = Goal(),
                controls: Sequence[Control] = (), pairs: Sequence[Pair] = (), plots: bool = True) -> str:
    """Seed-merged report of a study folder: ``summary.md``, two plots and, given ``readme`` (the docs page, e.g.
    ``docs/studies.md``), that page's section between ``study_begin(results_dir)`` and the next ``STUDY_END``.
    ``results_dir`` is relative to the repo root, and the section names its files by that path. Evaluations at a
    second crop fraction or window rule (``studies.results.second_evaluations``) get their own table and verdict. The
    verdict also sets the RoPE arms against ``controls`` (APE arms of other studies, at each crop where they were
    evaluated), and ``pairs`` (``studies.paired``) set arms' changes above the training size against the same models
    in other studies. Returns the section. ``plots=False`` leaves the plots as they are (a study redraws them at its
    end)."""
    runs = json.loads((results_dir / "runs.json").read_text())
    machine = json.loads((results_dir / "machine.json").read_text())
    protocol, merged = merged_results(results_dir / "eval", runs)
    as_trained = as_trained_rows(merged, trained_policies(runs))
    policies = [row for row in merged if row["policy"] is not None]
    if plots:
        plot(as_trained, results_dir / "summary_as_trained.png", "Positions as trained (mean and range over seeds)")
    if plots and policies:  # none while only APE arms are evaluated
        plot_panels({policy: [row for row in policies if row["policy"] == policy]
                     for policy in dict.fromkeys(row["policy"] for row in policies)},
                    results_dir / "summary_policies.png", "RoPE models under each resolution policy (mean, seed range)")
    seeds = sorted({run["seed"] for run in runs})
    per_arm = Counter(run["model"] for run in runs)  # arm -> how many seeds it ran
    fewest, most = min(per_arm.values()), max(per_arm.values())
    grid = (f"{counted(len(per_arm), 'model')} x {counted(len(seeds), 'seed')}" if fewest == len(seeds) else
            f"{counted(len(per_arm), 'model')}, {fewest}{f' to {most}' if most > fewest else ''} "
            f"{'seed' if most == 1 else 'seeds'} each")
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
        f"{counted(len(runs), 'training run')} ({grid}) on "
        f"{_host(machine)}, {machine['date']}"
        f"{others}; evaluation took {seconds / 60:.0f} min. Commands: `{where}/commands.sh`.",
        "**Training** (final epoch, all val images at the training size):\n\n" + _training(results_dir, runs, by_run),
        f"**Positions as trained** (`extrapolate`{own}; APE resampled bicubically). {note}\n\n"
        + markdown_table(as_trained),
        *(["**Every resolution policy** (RoPE models):\n\n" + markdown_table(policies)] if policies else []),
        "**From the training size to the largest size:**\n\n" + _changes(merged, trained_policies(runs)),
    ]
    baselines = any(run.get("baseline") for run in runs)

    def against(folder: str, protocol: str) -> dict[str, dict[int, dict[str, Any]]]:  # the controls evaluated there
        found = {control.name: control_rows(control, folder, protocol) for control in controls}
        return {name: rows for name, rows in found.items() if rows is not None}

    def counterparts(rows: list[dict[str, Any]], folder: str, protocol: str) -> list[str]:  # the pairs' table
        found = paired(rows, runs, pairs, lambda other: control_rows(other, folder, protocol))
        return [] if found is None else [
            "**Against the same model in another study** (positions as trained; each change in points from the "
            "arm's own training-size top-1, mean over seeds: this study / the other (this study minus the other)):"
            "\n\n" + found]

    if baselines:
        names = [control.name for control in controls]
        parts.append(f"**Does RoPE hold its accuracy?** Goal: as trained, {goal.describe(names)} with every seed "
                     "(seed ranges apart). `apart`: every seed of the RoPE arm above every seed of its "
                     f"{goal.baseline}; `below`: every one under; `overlap`: neither.\n\n"
                     + verdict(merged, runs, goal, against("eval", protocol)))
    parts += counterparts(merged, "eval", protocol)
    for folder, title in second_evaluations(results_dir):  # one crop fraction (or window rule) can favour one arm
        second_protocol, second = merged_results(folder, runs)
        parts.append(f"**{title}**, positions as trained ({second_protocol}):"
                     "\n\n" + markdown_table(as_trained_rows(second, trained_policies(runs)))
                     + ("\n\nThe goal here:\n\n"
                        + verdict(second, runs, goal, against(folder.name, second_protocol)) if baselines else ""))
        parts += counterparts(second, folder.name, second_protocol)

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
