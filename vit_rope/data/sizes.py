"""Variable-resolution training: which image size each optimizer step trains at, and how many images it takes.

Encodings that must hold at many resolutions are best trained at many (NaViT, Dehghani et al. 2023; FiT; DeiT / YOLO
multi-scale); each step's size is a pure function of (seed, epoch, step), the same on every rank and on resume."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_TAG = 0x5135E5  # a fourth SeedSequence entry: the size stream differs from the (seed, epoch, rank) augmentation seeds


def step_size(sizes: Sequence[int], seed: int, epoch: int, step: int) -> int:
    """The size of step ``step`` of epoch ``epoch``, uniform over ``sizes`` (repeats weigh: ``[64, 64, 96]``)."""
    draw = np.random.SeedSequence([seed, epoch, step, _TAG]).generate_state(1, np.uint64)[0]
    return int(sizes[int(draw) % len(sizes)])


def budget_images(batch_size: int, img_size: int, size: int) -> int:
    """Images at ``size`` holding at most the patches of ``batch_size`` images at ``img_size`` (may be 0)."""
    return batch_size * img_size**2 // size**2


def budget_batch(batch_size: int, img_size: int, size: int, even: bool = False) -> int:
    """Images per step at ``size`` under the token budget: at least 1, or an even 2 or more when ``even``."""
    batch = budget_images(batch_size, img_size, size)
    return max(batch - batch % 2, 2) if even else max(batch, 1)


@dataclass(frozen=True)
class SizeSchedule:
    """``(size, batch)`` of every (epoch, step): a size from ``sizes``, with ``budget`` the token budget's batch."""

    sizes: tuple[int, ...]
    img_size: int
    batch_size: int
    seed: int = 0
    budget: bool = True
    even: bool = False

    def batch_at(self, size: int) -> int:
        return budget_batch(self.batch_size, self.img_size, size, self.even) if self.budget else self.batch_size

    def __call__(self, epoch: int, step: int) -> tuple[int, int]:
        size = step_size(self.sizes, self.seed, epoch, step)
        return size, self.batch_at(size)

    def describe(self) -> str:
        batches = ", ".join(f"{size} px x {self.batch_at(size)}" for size in sorted(set(self.sizes)))
        rule = (f"token budget of {self.batch_size} x {self.img_size} px" if self.budget
                else "fixed batch, no token budget")
        return f"variable resolution, one size per step: {batches} images ({rule})"
