"""Each step's image size and batch (variable resolution: encodings that must hold at many resolutions are best trained
at many; NaViT, Dehghani et al. 2023; FiT; DeiT / YOLO multi-scale) and ``StepSampler`` (as ml-cvnets'
``VariableBatchSampler``), which cuts an epoch's order into steps. Sizes depend on (seed, epoch, step), augmentation on
(seed, epoch, rank, step, position): ranks agree without a collective, a resumed run repeats its steps."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch import Tensor
from torch.utils.data import DistributedSampler, Sampler

Item = tuple[int, int, int]  # (image index, size in pixels, augmentation seed) of one image of a step
_TAG = 0x5EED5  # a last SeedSequence entry: sample seeds differ from the size draws and the tensor pipeline's seeds
_SIZE_TAG = 0x5135E5  # a fourth SeedSequence entry: the size stream differs from the augmentation seeds


def step_size(sizes: Sequence[int], seed: int, epoch: int, step: int) -> int:
    """The size of step ``step`` of epoch ``epoch``, uniform over ``sizes`` (repeats weigh: ``[64, 64, 96]``)."""
    draw = np.random.SeedSequence([seed, epoch, step, _SIZE_TAG]).generate_state(1, np.uint64)[0]
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


def sample_seeds(seed: int, epoch: int, rank: int, step: int, count: int) -> list[int]:
    """Augmentation seeds of the ``count`` images of step ``step`` (independent 64-bit words)."""
    words = np.random.SeedSequence([seed, epoch, rank, step, _TAG]).generate_state(count, np.uint64)
    return [int(word) for word in words]


def seed_globals(seed: int) -> None:
    """Seed the global RNGs that timm's and torchvision's per-image transforms draw from (CPU only, not CUDA's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    """Restore the global RNGs that ``seed_globals`` sets when the block ends: with ``workers=0`` the transforms run in
    the training process, whose own draws (drop-path, Mixup) must not depend on them."""
    states = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.default_generator.set_state(states[2])


class StepSampler(Sampler[list[Item]]):
    """Yields, for every step of an epoch, this rank's ``[(index, size, seed), ...]`` (a ``DataLoader`` batch sampler):
    ``len(order) // batch_size`` steps whatever the sizes, so lr schedules are unchanged, the order wrapping around
    where a token budget's batches add up to more. Seeds take the rank: repeated augmentation shares images."""

    def __init__(self, order: DistributedSampler | RepeatAugSampler, batch_size: int, size: int,
                 schedule: Callable[[int, int], tuple[int, int]] | None = None, seed: int = 0, rank: int = 0) -> None:
        if len(order) < batch_size:
            raise ValueError(f"{len(order)} images per rank make no full batch of {batch_size}")
        self.order, self.batch_size, self.size, self.schedule = order, batch_size, size, schedule
        self.seed, self.rank, self.epoch, self.start = seed, rank, 0, 0

    def __len__(self) -> int:
        return len(self.order) // self.batch_size

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        if not 0 <= start_step <= len(self):
            raise ValueError(f"start_step {start_step} is outside the epoch's {len(self)} steps")
        self.epoch, self.start = epoch, start_step
        self.order.set_epoch(epoch)

    def plan(self) -> list[tuple[int, Tensor]]:
        """``(size, indices [batch])`` of every step of the current epoch, from step 0."""
        order = torch.tensor(list(self.order), dtype=torch.long)
        fixed = (self.size, self.batch_size)
        steps = [self.schedule(self.epoch, step) if self.schedule is not None else fixed for step in range(len(self))]
        sizes, lengths = zip(*steps, strict=True)
        return list(zip(sizes, order[torch.arange(sum(lengths)) % len(order)].split(lengths), strict=True))

    def __iter__(self) -> Iterator[list[Item]]:
        for step, (size, indices) in enumerate(self.plan()[self.start:], self.start):
            seeds = sample_seeds(self.seed, self.epoch, self.rank, step, len(indices))
            yield [(index, size, seed) for index, seed in zip(indices.tolist(), seeds, strict=True)]
