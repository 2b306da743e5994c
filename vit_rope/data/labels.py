"""The labels of shards and datasets, class indices rather than folders: checked against the train split's classes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from vit_rope.errors import UserError

_log = logging.getLogger(__name__)


def labelled_samples(samples: list[tuple[Any, int]], names: Sequence[str] | None, classes: list[str] | None,
                     where: str, split_key: str) -> tuple[list[tuple[Any, int]], list[str]]:
    """``(samples, classes)`` of a split whose labels are class indices, sorted by class as a folder's are; samples of a
    negative label (Hugging Face's -1) are left out with a warning, as timm's readers skip them."""
    kept = [sample for sample in samples if sample[1] >= 0]
    if not kept:
        raise UserError(f"{where} has no labelled samples ({len(samples)} in all); check {split_key}")
    if len(kept) < len(samples):
        _log.warning("%s: %d of %d samples have no label (a negative one) and are left out", where,
                     len(samples) - len(kept), len(samples))
    largest = max(label for _, label in kept)
    if classes is None:
        classes = list(names) if names else [str(i) for i in range(largest + 1)]
    if largest >= len(classes):
        raise UserError(f"{where} has label {largest}, outside the {len(classes)} classes of the train split (0 to "
                        f"{len(classes) - 1}): a split of another data set, or a train split without some classes")
    return sorted(kept, key=lambda sample: sample[1]), classes
