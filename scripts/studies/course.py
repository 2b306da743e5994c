"""A study's runs over their schedule: accuracy with positions as trained at every evaluated size, from checkpoints
kept part-way through training (``keep_every`` in ``train.py``) and the final one.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) trains for hundreds of epochs on ImageNet; the CPU studies train
tens on Imagenette. Whether RoPE's loss above the training size shrinks or grows as training goes on is the evidence
this table gives for or against schedule length as the cause: a loss that shrinks from one kept epoch to the next
points to a longer schedule, one that grows points elsewhere.

A study folder's ``course/**/results.json`` are ``vit_rope.evaluate`` outputs of the kept ``epoch_E.pth`` files of its
runs; the final epoch is read from the study's own ``eval/`` rows of ``last.pth``, and only runs with kept checkpoints
count, so every epoch of an arm is read over the same seeds.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from studies.results import (
    arm_label,
    as_trained_rows,
    begin_marker,
    is_run,
    merge_seeds,
    read_evaluations,
    spread,
    trained_policies,
)
from vit_rope.eval.report import table

COURSE = "course"  # the folder of a study's results that holds the evaluations of kept checkpoints
COURSE_END = "<!-- course:end -->"


def course_begin(results_dir: Path) -> str:
    """The line that opens the table of ``course_table(results_dir)`` in the docs page."""
    return begin_marker("course", f"from {results_dir.as_posix()}/{COURSE}")


def kept_epoch(path: Path) -> int | None:
    """E of a kept checkpoint's file name ``epoch_E.pth``, else None."""
    match = re.fullmatch(r"epoch_(\d+)\.pth", path.name)
    return int(match.group(1)) if match else None


def _kept_run(label: str, runs: list[dict[str, Any]], folder: Path) -> tuple[dict[str, Any], int]:
    """The run and epoch E of a kept checkpoint's evaluate label ``"<model> (<run output>/epoch_E.pth)"``."""
    match = re.search(r"\(([^()]+)\)$", label)
    epoch = kept_epoch(Path(match.group(1))) if match else None
    run = next((run for run in runs if epoch is not None and is_run(label, run, f"epoch_{epoch}.pth")), None)
    if run is None:
        raise ValueError(f"{folder} holds an evaluation of {label!r}, which is no kept checkpoint of this study's "
                         "runs: a label must end in (<run output>/epoch_E.pth) with an output of runs.json "
                         f"({', '.join(run['output'] for run in runs)}); delete {folder}/<arm>/<run>/ of the stale "
                         "evaluation and run the study script again to evaluate the kept checkpoints afresh")
    return run, epoch


def _final_epoch(results_dir: Path, run: dict[str, Any]) -> int:
    with open(results_dir / "runs" / run["name"] / "metrics.csv") as f:
        return int(list(csv.DictReader(f))[-1]["epoch"])


def course_rows(results_dir: Path, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with positions as trained, merged over the seeds that kept checkpoints, with ``model`` the arm's label
    and an ``epoch``; empty when no run kept any."""
    if not any((results_dir / COURSE).rglob("results.json")):
        return []
    protocol, kept = read_evaluations(results_dir / COURSE)
    final_protocol, final = read_evaluations(results_dir / "eval")
    if protocol != final_protocol:
        raise ValueError(f"the kept checkpoints of {results_dir} were evaluated with another protocol than the final "
                         f"ones ({protocol!r}, not {final_protocol!r}): delete {results_dir / COURSE} and run the "
                         "study script again, which evaluates them afresh with the protocol of eval/")
    group_of, with_course = {}, {}  # evaluate label -> "<arm label>\0<epoch>" (merge_seeds' groups); name -> run
    for row in kept:
        run, epoch = _kept_run(row["model"], runs, results_dir / COURSE)
        with_course[run["name"]] = run
        group_of[row["model"]] = f"{arm_label(run)}\0{epoch}"
    for row in final:  # the final epoch of the same runs
        run = next((run for run in with_course.values() if is_run(row["model"], run)), None)
        if run is not None:
            group_of[row["model"]] = f"{arm_label(run)}\0{_final_epoch(results_dir, run)}"
    merged = merge_seeds(kept + final, group_of)
    for row in merged:
        row["model"], epoch = row["model"].split("\0")
        row["epoch"] = int(epoch)
    merged = as_trained_rows(merged, trained_policies(runs))
    order = list(dict.fromkeys(arm_label(run) for run in runs))
    return sorted(merged, key=lambda row: (order.index(row["model"]), row["epoch"], row["img_size"]))


def course_table(results_dir: Path, runs: list[dict[str, Any]]) -> str:
    """One line per arm and kept epoch: top-1 as trained at each size (mean ± half the seed range; the training size
    in bold) and the change from the training size to the largest size. Empty when no run kept checkpoints."""
    rows = course_rows(results_dir, runs)
    if not rows:
        return ""
    sizes = sorted({row["img_size"] for row in rows})
    train_size = rows[0]["train_size"]
    lines = []
    for key in dict.fromkeys((row["model"], row["epoch"], row["seeds"]) for row in rows):
        by_size = {row["img_size"]: row for row in rows if (row["model"], row["epoch"], row["seeds"]) == key}
        cells = [spread(by_size[size]) if size in by_size else "" for size in sizes]
        cells = [f"**{cell}**" if size == train_size else cell for size, cell in zip(sizes, cells, strict=True)]
        change = (f"{by_size[sizes[-1]]['top1'] - by_size[train_size]['top1']:+.1f}"
                  if train_size in by_size and sizes[-1] in by_size else "")
        lines.append([key[0], key[1], key[2], *cells, change])
    header = ["model", "epoch", "seeds", *(f"{size}*" if size == train_size else str(size) for size in sizes),
              f"{sizes[-1]} minus {train_size}"]
    return table(header, lines)
