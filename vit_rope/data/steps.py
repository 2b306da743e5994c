"""The steps of a training epoch, for both pipelines: ``StepSampler`` (as ml-cvnets' ``VariableBatchSampler``) cuts an
epoch's order into steps, a pure function of (seed, epoch, step), and seeds each image's augmentation by (seed, epoch,
rank, step, position): ranks agree without a collective, and a run resumed at step k repeats steps k, k+1, ..."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch import Tensor
from torch.utils.data import DistributedSampler, Sampler

Item = tuple[int, int, int]  # (image index, size in pixels, augmentation seed) of one image of a step
_TAG = 0x5EED5  # a last SeedSequence entry: sample seeds differ from the size draws and the tensor pipeline's seeds


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
