"""A study's runs and evaluations as the reports read them: arm labels, seed-merged rows, positions as trained; and
the sections the study script writes into docs pages (``begin_marker``, ``replace_section``).

A study folder holds ``runs.json`` (one entry per training run: ``name``, ``model`` (the arm), ``seed``, ``output``,
and optionally ``label``, the arm's name in tables, ``baseline``, the arm of the APE model trained with the same recipe,
and ``as_trained``, the policy that places positions as the arm was trained) and ``eval/**/results.json``
(``vit_rope.evaluate`` output, one file for all runs or one per arm). Every report (``report``, ``goal``, ``compare``,
``course``) reads them through this module, so one run is one arm under one label everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vit_rope.eval.report import column_of


def begin_marker(kind: str, source: str) -> str:
    """The line that opens a section of kind ``kind`` that the study script writes into a docs page, naming what it is
    written from (``source``), so that a reader knows not to edit it by hand."""
    return f"<!-- {kind}:begin (written by scripts/imagenette_study.py {source}) -->"


def replace_section(page: Path, begin: str, end: str, body: str | Callable[[], str]) -> bool:
    """Rewrite what lies between the line ``begin`` of ``page`` and the next ``end`` with ``body`` (or what it returns,
    called only when the page has the section); the rest of the page is kept as it is. Returns False, and leaves the
    page alone, when it has no such section."""
    text = page.read_text()
    if begin not in text or end not in text.split(begin, 1)[1]:
        return False
    head, rest = text.split(begin, 1)
    body = body() if callable(body) else body
    page.write_text(head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1])
    return True


def has_evaluations(results_dir: Path) -> bool:
    """Whether the study in ``results_dir`` has its ``runs.json`` and at least one evaluation (``eval/``)."""
    return (results_dir / "runs.json").exists() and any((results_dir / "eval").rglob("results.json"))


def second_evaluations(results_dir: Path) -> list[tuple[Path, str]]:
    """A study's evaluations beside ``eval/`` (positions as trained only) and their titles in the reports: at another
    crop fraction (``eval_crop<fraction>``) or, for a Swin, under another window rule (``eval_windows_<rule>``, the
    harness's ``--window-size``)."""
    titled = [(folder, f"At crop {folder.name.removeprefix('eval_crop')}")
              for folder in sorted(results_dir.glob("eval_crop*"))]
    return titled + [(folder, f"Windows `--window-size {folder.name.removeprefix('eval_windows_')}`")
                     for folder in sorted(results_dir.glob("eval_windows_*"))]


def is_run(label: str, run: dict[str, Any], checkpoint: str = "last.pth") -> bool:
    """Whether a ``vit_rope.evaluate`` row label (``"<model> (<checkpoint>)"``) is the final checkpoint of ``run`` (or
    the one named ``checkpoint`` in its output folder)."""
    return label.endswith(f"({run['output']}/{checkpoint})")


def arm_label(run: dict[str, Any]) -> str:
    """The name of a run's arm in the tables: its ``label`` in runs.json (the study script's name of the arm), else
    the arm itself; two arms of one model (e.g. with and without a training remedy) stay apart either way."""
    return run.get("label") or run["model"]


def spread(row: dict[str, Any]) -> str:
    """A merged row's top-1 as ``mean ± half the range over seeds``, the tables' one measure of seed spread; a single
    seed's top-1 alone, since ``± 0.0`` would read as seeds that agree."""
    if row.get("seeds", 2) < 2:
        return f"{row['top1']:.2f}"
    return f"{row['top1']:.2f} ± {(row['top1_max'] - row['top1_min']) / 2:.1f}"


def change(row: dict[str, Any], trained: dict[str, Any]) -> str:
    """A merged row's ``spread`` and its change in points from the arm's ``trained`` row (at the training size)."""
    return f"{spread(row)} ({row['top1'] - trained['top1']:+.1f})"


def counted(number: int, noun: str) -> str:
    """``number`` and ``noun``, plural unless one (``1 seed``, ``2 seeds``), for the generated sentences."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


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


def read_evaluations(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """The protocol and rows of every ``results.json`` under ``folder``; they must share one protocol."""
    files = sorted(folder.rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no results.json: run the study's evaluation first")
    evaluations = [json.loads(path.read_text()) for path in files]
    protocols = {evaluation["protocol"] for evaluation in evaluations}
    if len(protocols) > 1:
        raise ValueError(f"the evaluations under {folder} used different protocols: {sorted(protocols)}; delete the "
                         "stale eval folders of the other protocol and run the study script again to re-evaluate them")
    return protocols.pop(), [row for evaluation in evaluations for row in evaluation["results"]]


def merge_seeds(results: Sequence[dict[str, Any]], group_of: dict[str, str]) -> list[dict[str, Any]]:
    """Results of several seeds of a model merged into one row per (model, policy, size or token budget).

    Args:
        results: ``evaluate_models`` rows.
        group_of: row ``model`` label -> the name its seeds share; rows of other labels are left out.

    Returns:
        Rows with ``top1`` / ``top5`` the mean over seeds, ``top1_min`` / ``top1_max`` their range and ``seeds``.
    """
    groups: dict[tuple[str, str | None, tuple[str, int]], list[dict[str, Any]]] = {}
    for result in results:
        if result["model"] in group_of:
            groups.setdefault((group_of[result["model"]], result["policy"], column_of(result)), []).append(result)
    merged = []
    for (model, policy, _), rows in groups.items():
        top1 = [row["top1"] for row in rows]
        budget = {key: rows[0][key] for key in ("seq_len", "patch_size") if rows[0].get("seq_len")}
        merged.append({"model": model, "policy": policy, "img_size": rows[0]["img_size"], **budget,
                       "train_size": rows[0]["train_size"], "top1": sum(top1) / len(top1), "top1_min": min(top1),
                       "top1_max": max(top1), "top5": sum(row["top5"] for row in rows) / len(rows),
                       "seeds": len(rows)})
    return merged


def merged_results(folder: Path, runs: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The protocol of the evaluations under ``folder`` and their rows merged over seeds, arms in ``runs``' order."""
    protocol, results = read_evaluations(folder)
    index = {row["model"]: next((i for i, run in enumerate(runs) if is_run(row["model"], run)), None)
             for row in results}  # evaluation label -> its run in runs.json; others (not in this study) left out
    results = sorted((row for row in results if index[row["model"]] is not None), key=lambda row: index[row["model"]])
    return protocol, merge_seeds(results, {label: arm_label(runs[i]) for label, i in index.items() if i is not None})
