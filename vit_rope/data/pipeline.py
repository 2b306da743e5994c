"""Batched tensor data pipeline: a decoded uint8 store, augmented one *batch* at a time on the compute device.

Why: training from the decoded cache through a ``DataLoader`` spends a worker process per core on per-image PIL
augmentation, which on a small CPU leaves the training step a fraction of its speed (docs/performance.md, "Data
pipeline"). Here the cache is one flat uint8 store
(optionally memory-mapped and shared by processes, or held on a GPU), and each batch is cropped, resized, flipped,
colour-jittered and normalised by a handful of batched tensor ops in the training process itself (CPU threads or
CUDA); there are no worker processes and an image is never decoded again.

The per-batch operations, and how they match timm / torchvision, are in ``vit_rope.data.augment``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DistributedSampler

from vit_rope.data import augment
from vit_rope.data.steps import StepSampler
from vit_rope.errors import UserError

_log = logging.getLogger(__name__)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of the generator that draws a training epoch's crops, flips and jitter on rank ``rank``."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


class TensorStore:
    """Decoded images in one flat uint8 tensor (HWC per image, as ``vit_rope.data.decoded.DecodedImages``) with targets.

    Args:
        data: flat uint8, may be memory-mapped (``torch.load(mmap=True)``): it is never copied as a whole.
        offsets: ``[N]`` start of each image in ``data``.
        shapes: ``[N, 2]`` (height, width); height 0 marks an image that could not be decoded.
        targets: ``[N]`` class indices.
        paths: the file of each image, named when it is unreadable; None names them by index.
    """

    def __init__(self, data: Tensor, offsets: Tensor, shapes: Tensor, targets: Tensor | Sequence[int],
                 paths: Sequence[str] | None = None) -> None:
        self.data, self.offsets = data, offsets.cpu().long()
        self.shapes, self.targets = shapes.cpu().long().reshape(-1, 2), torch.as_tensor(targets).long().cpu()
        self.paths = paths
        if not len(self.shapes) == len(self.offsets) == len(self.targets) == len(paths or self.targets):
            raise ValueError(f"{len(self.shapes)} shapes, {len(self.offsets)} offsets, {len(self.targets)} targets"
                             + (f", {len(paths)} paths" if paths is not None else ""))
        readable = torch.nonzero(self.shapes[:, 0] > 0)[:, 0]  # [R], ascending
        if len(readable) == 0:
            example = f" (the first: {paths[0]})" if paths else ""
            raise UserError(f"none of the {len(self.targets)} images of this split could be decoded{example}: replace "
                            "the corrupt files, or point the data dir at the data set")
        # next readable index at or after each index, wrapping, as ImageFolderDataset's replacement
        pos = torch.searchsorted(readable, torch.arange(len(self)))
        self._next = readable[pos % len(readable)]  # [N]
        self._skips = (self._next - torch.arange(len(self))) % len(self)  # [N]

    @classmethod
    def from_decoded(cls, images: Any, targets: Tensor | Sequence[int], paths: Sequence[str] | None = None
                     ) -> TensorStore:
        """A store sharing the tensors of a ``vit_rope.data.decoded.DecodedImages`` (no copy)."""
        return cls(images.data, images.offsets, images.shapes, targets, paths)

    def names(self, indices: Tensor) -> str:
        """The files of images ``indices`` (``#index`` when the store was given no paths), for a warning."""
        return ", ".join(self.paths[i] if self.paths is not None else f"#{i}" for i in indices.tolist())

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: torch.device | str) -> TensorStore:
        """The same store with ``data`` on ``device`` (e.g. held on the GPU); the index tensors stay on the CPU."""
        store = object.__new__(TensorStore)
        store.__dict__.update(self.__dict__, data=self.data.to(device))
        return store

    def resolve(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        """Replace unreadable images by the next readable one: ``(indices [B], images skipped for each [B])``."""
        indices = indices.cpu().long()
        return self._next[indices], self._skips[indices]

    def gather(self, indices: Tensor, device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Readable images ``indices`` as one zero-padded uint8 batch on ``device`` (default: the store's).

        Returns:
            ``[B, 3, Hmax, Wmax]`` uint8 (a channels-last view; each image's last column and row are repeated once
            into the padding, see ``vit_rope.data.augment.crop_resize``), heights ``[B]`` and widths ``[B]`` (CPU,
            long).
        """
        indices = indices.cpu().long()
        heights, widths = self.shapes[indices].unbind(1)  # [B], [B]
        if (heights == 0).any():
            raise ValueError("gather() got unreadable images; map the indices with resolve() first")
        hmax, wmax = int(heights.max()), int(widths.max())
        device = torch.device(device) if device is not None else self.device
        pin = self.device.type == "cpu" and device.type == "cuda"
        out = torch.zeros(len(indices), hmax, wmax, 3, dtype=torch.uint8, device=self.device, pin_memory=pin)
        rows = zip(self.offsets[indices].tolist(), heights.tolist(), widths.tolist(), strict=True)
        for b, (start, h, w) in enumerate(rows):
            out[b, :h, :w] = self.data[start:start + h * w * 3].view(h, w, 3)
            if w < wmax:
                out[b, :h, w] = out[b, :h, w - 1]
            if h < hmax:
                out[b, h, :w + 1] = out[b, h - 1, :w + 1]
        return out.to(device, non_blocking=True).permute(0, 3, 1, 2), heights, widths  # [B, 3, Hmax, Wmax]


class BatchLoader:
    """Batches ``(images [B, 3, s, s] normalised, targets [B] long, skipped scalar long)`` from a ``TensorStore``.

    Training: each epoch's order is ``DistributedSampler(shuffle=True, seed)``'s (padded to a multiple of
    ``world_size``, this rank's share), cut into steps by ``vit_rope.data.steps.StepSampler`` (full batches only; with a
    ``schedule``, e.g. ``vit_rope.data.sizes.SizeSchedule``, a size and batch length per step, as the per-image
    pipeline); crops, flips and jitter come from a CPU generator seeded by (seed, epoch, rank), so an epoch is the
    same whenever it is run (resumes included: a resumed epoch draws the random numbers of the steps it skips).
    Validation: this rank's slice ``range(rank, N, world_size)`` in order, every batch including the last partial
    one, center crops. Images and targets are on ``device``; ``skipped`` (unreadable images replaced in the batch)
    stays on the CPU.
    """

    def __init__(self, store: TensorStore, batch_size: int, size: int, *, train: bool,
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                 color_jitter: float | Sequence[float] | None = 0.4, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, crop_pct: float = 0.875, seed: int = 0, rank: int = 0,
                 world_size: int = 1, device: torch.device | str = "cpu", channels_last: bool = False,
                 schedule: Callable[[int, int], tuple[int, int]] | None = None) -> None:
        self.store, self.batch_size, self.size, self.train = store, batch_size, size, train
        self.scale, self.ratio = (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1]))
        jitter = color_jitter or 0.0
        self.jitter = tuple(float(j) for j in ((jitter,) * 3 if isinstance(jitter, (int, float)) else jitter))
        if len(self.jitter) == 4 and self.jitter[3]:
            raise ValueError(f"color_jitter={tuple(jitter)} asks for hue jitter, which the batched pipeline does not "
                             "have: pass one value or three (brightness, contrast, saturation), or use timm's "
                             "per-image pipeline (pipeline=timm)")
        self.hflip_p, self.mean, self.std, self.crop_pct = hflip, tuple(mean), tuple(std), crop_pct
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device, self.channels_last = torch.device(device), channels_last
        self.sampler = DistributedSampler(range(len(store)), world_size, rank, shuffle=True, seed=seed)
        if train and len(self.sampler) < batch_size:
            raise ValueError(f"{len(store)} images make no full batch of {batch_size} x {world_size} process(es)")
        self.steps = StepSampler(self.sampler, batch_size, size, schedule, seed, rank) if train else None

    def __len__(self) -> int:
        if self.train:
            return len(self.steps)
        return -(-len(range(self.rank, len(self.store), self.world_size)) // self.batch_size)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select epoch ``epoch``'s order and augmentation randomness (training), iterated from step ``start_step``."""
        self.steps.set_epoch(epoch, start_step)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        if not self.train:
            for indices in torch.arange(self.rank, len(self.store), self.world_size).split(self.batch_size):
                yield self.make_batch(indices, self.size, None)
            return
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.steps.epoch, self.rank))
        for step, (size, indices) in enumerate(self.steps.plan()):
            if step < self.steps.start:  # a resumed epoch: the skipped steps' random numbers, without their images
                ones = torch.ones(len(indices), dtype=torch.long)
                self.train_draws(ones, ones, generator)
                continue
            yield self.make_batch(indices, size, generator)

    def train_draws(self, heights: Tensor, widths: Tensor, generator: torch.Generator | None
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """Crop boxes ``[B, 4]``, flips ``[B]`` and jitter factors ``[B, 3]`` of a training batch of images of these
        sizes; the numbers drawn from ``generator`` depend on the batch length only (``vit_rope.data.augment``)."""
        return (augment.rrc_boxes(heights, widths, self.scale, self.ratio, generator),
                augment.flip_draws(len(heights), self.hflip_p, generator),
                augment.jitter_factors(len(heights), self.jitter, generator))

    def make_batch(self, indices: Tensor, size: int,
                   generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """One batch of any length and output ``size``: random crops etc. from ``generator`` when training."""
        resolved, skips = self.store.resolve(indices)  # [B], [B]
        if skips.any():  # each such index is itself unreadable (a skip starts there)
            _log.warning("replacing unreadable image(s) %s by the next readable one", self.store.names(
                indices.cpu()[skips > 0]))
        padded, heights, widths = self.store.gather(resolved, self.device)  # [B, 3, Hmax, Wmax] uint8
        if self.train:
            boxes, flips, factors = self.train_draws(heights, widths, generator)  # [B, 4], [B], [B, 3]
        else:
            boxes = augment.center_boxes(heights, widths, size, self.crop_pct)
        images = augment.crop_resize(padded, boxes, size)  # [B, 3, s, s] float 0..255
        if self.train:
            images = augment.hflip(images, flips)
            if any(self.jitter[:3]):
                images = augment.color_jitter(images, factors)
        images = augment.normalize(images, self.mean, self.std)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, self.store.targets[resolved].to(self.device, non_blocking=True), skips.sum()

    def describe(self) -> str:
        """One line for the training log."""
        what = (f"random-resized crop scale {self.scale} ratio ({self.ratio[0]:.3g}, {self.ratio[1]:.3g}), hflip "
                f"{self.hflip_p}, color jitter {self.jitter[:3]} (fixed order)" if self.train
                else f"center crop (crop_pct {self.crop_pct})")
        scheduled = self.train and self.steps.schedule is not None
        sizes, batches = ("per-step sizes", "varying length") if scheduled else (f"{self.size} px", self.batch_size)
        return (f"batched {'train' if self.train else 'val'} pipeline on {self.device}: {len(self.store)} decoded "
                f"images ({self.store.device} store), {what} to {sizes} by roi_align, normalised; "
                f"{len(self)} batches of {batches}, rank {self.rank}/{self.world_size}, no workers")

    __repr__ = describe
