"""Variable-resolution training: which image size each optimizer step trains at, and how many images it takes.

Position encodings that must hold at many resolutions are best trained at many resolutions: NaViT (Dehghani et al.
2023, "Patch n' Pack") and FiT sample a resolution per example, timm's NaFlexViT groups batches into sequence-length
buckets under a fixed token budget, and DeiT / YOLO train multi-scale. Here every step draws one square size from a
list (a whole batch shares it, so no packing or masks are needed), and with the token budget the batch shrinks as
the size grows so that each step holds about as many patches as ``batch_size`` images at ``img_size`` (as timm's
NaFlex loader keeps ``batch x tokens`` fixed). With RoPE a new size only costs a new frequency table.

The draw is a pure function of (seed, epoch, step): every DDP rank computes the same size without a collective,
and a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_TAG = 0x5135E5  # a fourth SeedSequence entry: the size stream differs from the (seed, epoch, rank) augmentation seeds


def step_size(sizes: Sequence[int], seed: int, epoch: int, step: int) -> int:
    """The size of step ``step`` (0-based, within the epoch) of epoch ``epoch``, uniform over ``sizes``.

    A list with repeats weights its entries (``[64, 64, 96]`` draws 64 two times in three).
    """
    draw = np.random.SeedSequence([seed, epoch, step, _TAG]).generate_state(1, np.uint64)[0]
    return int(sizes[int(draw) % len(sizes)])


def budget_images(batch_size: int, img_size: int, size: int) -> int:
    """Images at ``size`` that hold at most the patches of ``batch_size`` images at ``img_size`` (may be 0).

    Patches per image are ``(size / patch)^2``, so the patch size cancels out: ``batch_size x (img_size / size)^2``,
    rounded down (never over the budget).
    """
    return batch_size * img_size**2 // size**2


def budget_batch(batch_size: int, img_size: int, size: int, even: bool = False) -> int:
    """Images per step at ``size`` under the token budget (``budget_images``), to an even number when ``even``
    (Mixup / CutMix mix pairs), and at least 1 (2 when even): ``vit_rope.checks`` refuses sizes that need the floor.
    """
    batch = budget_images(batch_size, img_size, size)
    return max(batch - batch % 2, 2) if even else max(batch, 1)


@dataclass(frozen=True)
class SizeSchedule:
    """``(size, batch)`` of every step: ``BatchLoader`` calls it with (epoch, step).

    Args:
        sizes: the sizes to draw from (pixels, square).
        img_size: the size whose ``batch_size`` sets the token budget (the config's ``img_size``).
        batch_size: images per step at ``img_size``; without ``budget``, the batch at every size.
        seed: the run's seed.
        budget: scale the batch with the size (``budget_batch``), else keep ``batch_size``.
        even: keep batches even (Mixup / CutMix on).
    """

    sizes: tuple[int, ...]
    img_size: int
    batch_size: int
    seed: int = 0
    budget: bool = True
    even: bool = False

    def batch_at(self, size: int) -> int:
        """Images per step at ``size``."""
        return budget_batch(self.batch_size, self.img_size, size, self.even) if self.budget else self.batch_size

    def __call__(self, epoch: int, step: int) -> tuple[int, int]:
        """``(size, batch)`` of step ``step`` of epoch ``epoch``; the same on every rank and on resume."""
        size = step_size(self.sizes, self.seed, epoch, step)
        return size, self.batch_at(size)

    def describe(self) -> str:
        """One line for the training log: the sizes and the batch at each."""
        batches = ", ".join(f"{size} px x {self.batch_at(size)}" for size in sorted(set(self.sizes)))
        rule = (f"token budget of {self.batch_size} x {self.img_size} px" if self.budget
                else "fixed batch, no token budget")
        return f"variable resolution, one size per step: {batches} images ({rule})"
