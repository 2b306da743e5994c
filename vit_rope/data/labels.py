"""The labels of shards and datasets, which carry class indices rather than class folders: unlabelled samples left
out, and every label checked against the train split's classes before training."""

from __future__ import annotations

import logging
from typing import Any

from vit_rope.errors import UserError

_log = logging.getLogger(__name__)


def drop_unlabelled(samples: list[tuple[Any, int]], where: str, split_key: str) -> list[tuple[Any, int]]:
    """``samples`` without those of a negative label, which marks an unlabelled sample (Hugging Face's test splits use
    -1; timm's readers skip them), with a warning counting them; an error when none is left."""
    kept = [sample for sample in samples if sample[1] >= 0]
    if not kept:
        raise UserError(f"{where} has no labelled samples ({len(samples)} in all); check {split_key}")
    if len(kept) < len(samples):
        _log.warning("%s: %d of %d samples have no label (a negative one) and are left out", where,
                     len(samples) - len(kept), len(samples))
    return kept


def check_labels(labels: list[int], classes: list[str], where: str) -> None:
    """Every label a class index of the train split's ``classes``."""
    bad = next((label for label in labels if label >= len(classes)), None)
    if bad is not None:
        raise UserError(f"{where} has label {bad}, outside the {len(classes)} classes of the train split (0 to "
                        f"{len(classes) - 1}): a split of another data set, or a train split without some classes")
