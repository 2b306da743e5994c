"""Does an arm change above its training size as the same model trained another way, in another study, does?

Study v4's data question: v3 trained RoPE-Mixed and APE on every training image for 30 epochs; v4's stage 2 trains the
same models on a third of the images for 90 epochs, about the same number of optimizer steps. If too little data is
what makes RoPE lose accuracy above its training size, RoPE's loss grows against v3's while APE's does not. A ``Pair``
names an arm and its counterpart (a ``studies.goal.Control``: a name, another study's folder and its arm); ``paired``
sets their changes from the training size side by side, read from the files each study's own report reads, so a
difference of the two differences (RoPE's against APE's) is read off one table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from studies.goal import Control
from studies.results import arm_label, as_trained_by_arm, spread, trained_policies, training_row
from vit_rope.eval.report import table

Rows = dict[int, dict[str, Any]]  # size -> a seed-merged row with positions as trained


@dataclass(frozen=True)
class Pair:
    """``arm`` of this study and ``other``, the same model trained another way in another study."""

    arm: str
    other: Control


def _changes(rows: Rows) -> dict[int, float]:
    """Size above the training size -> the change in top-1 points from the training size (mean over seeds)."""
    trained = training_row(rows)
    if trained is None:
        return {}
    return {size: row["top1"] - trained["top1"] for size, row in rows.items() if size > trained["train_size"]}


def paired(merged: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], pairs: Sequence[Pair],
           rows_of: Callable[[Control], Rows | None]) -> str | None:
    """A table, one row per pair whose arm is evaluated here and whose counterpart has rows (``rows_of``, e.g.
    ``studies.goal.control_rows`` at one crop; None where it was not evaluated): top-1 at each one's training size,
    then at every size above it that both were evaluated at, the change here, the change there and their
    difference. None when no pair has both."""
    as_trained = as_trained_by_arm(merged, trained_policies(runs))
    labels = {run["model"]: arm_label(run) for run in runs}
    found = []
    for pair in pairs:
        here = as_trained.get(labels.get(pair.arm, ""), {})
        there = rows_of(pair.other) if training_row(here) else None
        if there and training_row(there):
            found.append((labels[pair.arm], pair.other.name, here, there))
    if not found:
        return None
    sizes = sorted(set.intersection(*(set(_changes(here)) & set(_changes(there)) for _, _, here, there in found)))
    lines = []
    for label, name, here, there in found:
        ours, theirs = _changes(here), _changes(there)
        lines.append([label, name, f"{spread(training_row(here))} / {spread(training_row(there))}",
                      *(f"{ours[size]:+.1f} / {theirs[size]:+.1f} ({ours[size] - theirs[size]:+.1f})"
                        for size in sizes)])
    return table(["model", "against", "top-1 at training size", *(f"change at {size}" for size in sizes)], lines)
