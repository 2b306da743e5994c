"""The steps of a training epoch: which images each optimizer step takes and at which size, for both pipelines.

One batch sampler, ``StepSampler``, turns an epoch's order of this rank's images (``DistributedSampler`` or timm's
``RepeatAugSampler``) into steps ``(size, indices)``: the size and batch length from a
``vit_rope.data.sizes.SizeSchedule`` (or ``img_size`` x ``batch_size`` without one), the indices taken in order from the
epoch's order. It is the multi-scale batch sampler of ml-cvnets' ``VariableBatchSampler`` and of timm's NaFlex loader (a
schedule of ``(sequence length, batch size)`` per step), kept a pure function of (seed, epoch, step) so that every DDP
rank draws the same sizes without a collective and a run resumed at step k of an epoch repeats steps k, k+1, ...

The batched tensor pipeline (``vit_rope.data.pipeline.BatchLoader``) reads ``plan()``; the per-image pipeline hands the
sampler to a ``DataLoader`` as its ``batch_sampler``, whose items ``(index, size, seed)`` tell a worker which
transform to apply (``vit_rope.data.folders.SizedImages``) and seed its random numbers, so an image's augmentation
depends on (seed, epoch, rank, step, position) only: not on the number of workers, which worker got the batch, or where
a run was resumed.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sized
from typing import Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Sampler

Item = tuple[int, int, int]  # (image index, size in pixels, augmentation seed) of one image of a step
_TAG = 0x5EED5  # a last SeedSequence entry: sample seeds differ from the size draws and the tensor pipeline's seeds


class EpochOrder(Sized, Protocol):
    """This rank's image indices of an epoch, in order (``DistributedSampler``, ``RepeatAugSampler``)."""

    def __iter__(self) -> Iterator[int]: ...

    def set_epoch(self, epoch: int) -> None: ...


def sample_seeds(seed: int, epoch: int, rank: int, step: int, count: int) -> list[int]:
    """Augmentation seeds of the ``count`` images of step ``step`` (independent 64-bit words)."""
    words = np.random.SeedSequence([seed, epoch, rank, step, _TAG]).generate_state(count, np.uint64)
    return [int(word) for word in words]


def seed_globals(seed: int) -> None:
    """Seed the global RNGs that timm's and torchvision's per-image transforms draw from (Python's ``random``:
    crops, RandAugment magnitudes, erasing boxes; numpy: RandAugment's op choice; torch's CPU generator: flips,
    colour jitter, erasing noise). Only the CPU generator, so that CUDA's stream is left alone."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    """Restore the global RNGs that ``seed_globals`` sets when the block ends: with ``workers=0`` the transforms run in
    the training process, whose own draws (drop-path, Mixup) must not depend on how images were augmented."""
    states = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.default_generator.set_state(states[2])


class StepSampler(Sampler[list[Item]]):
    """Yields, for every step of an epoch, this rank's ``[(index, size, seed), ...]`` (a ``DataLoader`` batch sampler).

    An epoch has ``len(order) // batch_size`` steps whatever the sizes, so lr schedules are unchanged. Step i takes
    the next ``batch_i`` indices of the epoch's order, wrapping around to its start when a token budget makes the
    batches add up to more than the order holds: images per epoch then vary by a few percent, and since the order is
    reshuffled every epoch no image is left out for good. ``len()`` is always a whole epoch's steps; after
    ``set_epoch(epoch, start_step=k)`` iteration yields steps k, k+1, ... (a run resumed mid-epoch).

    Args:
        order: this rank's indices of each epoch (its ``set_epoch`` picks the epoch).
        batch_size: images per step at ``size``; sets the number of steps.
        size: the size of every step without ``schedule`` (the config's ``img_size``).
        schedule: ``(epoch, step) -> (size, batch)``, e.g. ``vit_rope.data.sizes.SizeSchedule``; None = ``(size,
            batch_size)`` at every step.
        seed: the run's seed, for the augmentation seeds.
        rank: this process's rank, for the augmentation seeds (repeated augmentation puts one image on two ranks).
    """

    def __init__(self, order: EpochOrder, batch_size: int, size: int,
                 schedule: Callable[[int, int], tuple[int, int]] | None = None, seed: int = 0, rank: int = 0) -> None:
        if len(order) < batch_size:
            raise ValueError(f"{len(order)} images per rank make no full batch of {batch_size}")
        self.order, self.batch_size, self.size, self.schedule = order, batch_size, size, schedule
        self.seed, self.rank, self.epoch, self.start = seed, rank, 0, 0

    def __len__(self) -> int:
        return len(self.order) // self.batch_size

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select epoch ``epoch``, to be iterated from step ``start_step`` (0-based)."""
        if not 0 <= start_step <= len(self):
            raise ValueError(f"start_step {start_step} is outside the epoch's {len(self)} steps")
        self.epoch, self.start = epoch, start_step
        self.order.set_epoch(epoch)

    def step_size(self, step: int) -> tuple[int, int]:
        """``(size, batch)`` of step ``step`` of the current epoch."""
        return self.schedule(self.epoch, step) if self.schedule is not None else (self.size, self.batch_size)

    def plan(self) -> list[tuple[int, Tensor]]:
        """``(size, indices [batch])`` of every step of the current epoch, from step 0."""
        order = torch.tensor(list(self.order), dtype=torch.long)
        sizes, lengths = zip(*(self.step_size(step) for step in range(len(self))), strict=True)
        return list(zip(sizes, order[torch.arange(sum(lengths)) % len(order)].split(lengths), strict=True))

    def __iter__(self) -> Iterator[list[Item]]:
        for step, (size, indices) in enumerate(self.plan()[self.start:], self.start):
            seeds = sample_seeds(self.seed, self.epoch, self.rank, step, len(indices))
            yield [(index, size, seed) for index, seed in zip(indices.tolist(), seeds, strict=True)]
