"""Batched tensor data pipeline: a decoded uint8 store, augmented one *batch* at a time on the compute device.

Per-image PIL augmentation in ``DataLoader`` workers leaves a small CPU's training step a fraction of its speed
(docs/performance.md, "Data pipeline"); here no workers, no image decoded again. Each op draws as many numbers from a
CPU ``torch.Generator`` whatever the outcome: a batch is reproducible from ``(seed, epoch, rank)`` on any device
(differences from timm: docs/training.md)."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torch.utils.data import DistributedSampler
from torchvision.ops import roi_align
from torchvision.transforms.v2.functional import normalize

from vit_rope.data.steps import StepSampler
from vit_rope.errors import UserError

_log = logging.getLogger(__name__)
ATTEMPTS = 10  # timm's RandomResizedCrop tries this many (area, aspect) draws before its center-crop fallback
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L") and torchvision's ColorJitter


def rrc_boxes(heights: Tensor, widths: Tensor, scale: tuple[float, float] = (0.08, 1.0),
              ratio: tuple[float, float] = (3 / 4, 4 / 3), generator: torch.Generator | None = None) -> Tensor:
    """timm's random-resized-crop boxes, ``[B, 4]`` float ``(x0, y0, x1, y1)`` pixels (sides at least 1 px); always
    draws ``B x 22`` numbers, so that later draws do not depend on the image sizes."""
    img_h, img_w = heights.cpu().double(), widths.cpu().double()  # [B]
    u = torch.rand(len(img_h), 2 * ATTEMPTS + 2, generator=generator, dtype=torch.float64)  # [B, 22]
    target_area = (scale[0] + (scale[1] - scale[0]) * u[:, :ATTEMPTS]) * (img_w * img_h)[:, None]  # [B, 10]
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[:, ATTEMPTS:2 * ATTEMPTS])  # [B, 10]
    w = torch.sqrt(target_area * aspect).round().clamp_min(1)  # round half to even, as Python's round
    h = torch.sqrt(target_area / aspect).round().clamp_min(1)
    fits = (w <= img_w[:, None]) & (h <= img_h[:, None])  # [B, 10]
    first = torch.where(fits, torch.arange(ATTEMPTS), ATTEMPTS).min(1, keepdim=True).values.clamp_max(ATTEMPTS - 1)
    found = fits.any(1)  # [B]
    lo, hi = min(ratio), max(ratio)  # the fallback: the whole image, its aspect clamped into [lo, hi], centred
    in_ratio = img_w / img_h
    fall_w = torch.where(in_ratio > hi, (img_h * hi).round(), img_w)
    fall_h = torch.where(in_ratio < lo, (img_w / lo).round(), img_h)
    crop_w = torch.where(found, w.gather(1, first)[:, 0], fall_w)  # [B]
    crop_h = torch.where(found, h.gather(1, first)[:, 0], fall_h)
    top = torch.where(found, (u[:, -2] * (img_h - crop_h + 1)).floor(), ((img_h - crop_h) / 2).floor())
    left = torch.where(found, (u[:, -1] * (img_w - crop_w + 1)).floor(), ((img_w - crop_w) / 2).floor())
    top, left = torch.minimum(top, img_h - crop_h), torch.minimum(left, img_w - crop_w)  # u * n may round up to n
    return torch.stack([left, top, left + crop_w, top + crop_h], 1).float()  # [B, 4]


def center_boxes(heights: Tensor, widths: Tensor, size: int, crop_pct: float) -> Tensor:
    """The source region ``[B, 4]`` that timm's eval transform (resize, center crop) shows, as torchvision rounds."""
    short_new = math.floor(size / crop_pct)
    img_h, img_w = heights.cpu().double(), widths.cpu().double()  # [B]
    short, long = torch.minimum(img_h, img_w), torch.maximum(img_h, img_w)
    long_new = (short_new * long / short).floor()  # torchvision: int(requested * long / short)
    new_h = torch.where(img_w <= img_h, long_new, short_new)
    new_w = torch.where(img_w <= img_h, short_new, long_new)
    top, left = ((new_h - size) / 2).round(), ((new_w - size) / 2).round()  # CenterCrop: int(round(...))
    sy, sx = img_h / new_h, img_w / new_w  # source pixels per resized pixel
    return torch.stack([left * sx, top * sy, (left + size) * sx, (top + size) * sy], 1).float()  # [B, 4]


def crop_resize(images: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Crop each box of ``images`` (uint8 ``[B, 3, H, W]``) to float ``[B, 3, s, s]``, 0..255. Samples at an edge
    read one pixel past it with zero weight, so each image must be padded with a copy of its last column and row."""
    index = torch.arange(len(boxes), dtype=torch.float32, device=boxes.device)[:, None]
    rois = torch.cat([index, boxes.float()], 1).to(images.device)  # [B, 5]: batch index, x0, y0, x1, y1
    pixels = images.to(torch.float32, memory_format=torch.contiguous_format)  # [B, 3, H, W]
    return roi_align(pixels, rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def jitter_factors(batch: int, strength: float, generator: torch.Generator | None) -> Tensor:
    """Brightness, contrast, saturation factors ``[B, 3]``, each ``U(max(0, 1 - j), 1 + j)`` as ``ColorJitter``."""
    lo, hi = max(0.0, 1 - strength), 1 + strength
    return (lo + (hi - lo) * torch.rand(batch, 3, generator=generator, dtype=torch.float64)).float()  # [B, 3]


def grayscale(images: Tensor) -> Tensor:
    weights = torch.tensor(GRAY_WEIGHTS, dtype=images.dtype, device=images.device)
    return torch.einsum("bchw,c->bhw", images, weights)[:, None]


def color_jitter(images: Tensor, factors: Tensor) -> Tensor:
    """Brightness, contrast, saturation (fixed order) with ``factors`` ``[B, 3]`` on 0..255 floats, as torchvision."""
    brightness, contrast, saturation = factors.to(images.device, images.dtype)[:, :, None, None, None].unbind(1)
    x = (images * brightness).clamp_(0, 255)  # [B, 3, H, W]
    mean = grayscale(x).mean((1, 2, 3), keepdim=True)  # [B, 1, 1, 1]
    x = (contrast * x + (1 - contrast) * mean).clamp_(0, 255)
    return (saturation * x + (1 - saturation) * grayscale(x)).clamp_(0, 255)


class TensorStore:
    """Decoded images in one flat uint8 tensor ``data`` (HWC per image, as ``DecodedImages``; may be memory-mapped: it
    is never copied as a whole) at ``offsets``, of ``shapes`` ``[N, 2]`` (height 0: unreadable)."""

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

    def __len__(self) -> int:
        return len(self.shapes)

    def to(self, device: torch.device | str) -> TensorStore:
        """The same store with ``data`` on ``device`` (e.g. held on the GPU); the index tensors stay on the CPU."""
        store = copy.copy(self)  # the index tables as they are, not rebuilt
        store.data = self.data.to(device)
        return store

    def resolve(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        """Replace unreadable images by the next readable one: ``(indices [B], images skipped for each [B])``."""
        indices = indices.cpu().long()
        return self._next[indices], self._skips[indices]

    def gather(self, indices: Tensor, device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Readable images ``indices`` as one padded uint8 batch ``[B, 3, Hmax, Wmax]`` (each image's last column and
        row repeated once into the padding, for ``crop_resize``), heights and widths ``[B]``."""
        indices = indices.cpu().long()
        heights, widths = self.shapes[indices].unbind(1)  # [B], [B]
        if (heights == 0).any():
            raise ValueError("gather() got unreadable images; map the indices with resolve() first")
        hmax, wmax = int(heights.max()), int(widths.max())
        device = torch.device(device) if device is not None else self.data.device
        pin = self.data.device.type == "cpu" and device.type == "cuda"
        out = torch.zeros(len(indices), hmax, wmax, 3, dtype=torch.uint8, device=self.data.device, pin_memory=pin)
        rows = zip(self.offsets[indices].tolist(), heights.tolist(), widths.tolist(), strict=True)
        for b, (start, h, w) in enumerate(rows):
            out[b, :h, :w] = self.data[start:start + h * w * 3].view(h, w, 3)
            if w < wmax:
                out[b, :h, w] = out[b, :h, w - 1]
            if h < hmax:
                out[b, h, :w + 1] = out[b, h - 1, :w + 1]
        return out.to(device, non_blocking=True).permute(0, 3, 1, 2), heights, widths  # [B, 3, Hmax, Wmax]


class BatchLoader:
    """Batches ``(images, targets, skipped)`` from a ``TensorStore``. Training: this rank's share in ``StepSampler``'s
    steps, augmented from a CPU generator seeded by (seed, epoch, rank); a resumed epoch draws the numbers of the steps
    it skips. Validation: the slice ``range(rank, N, world_size)``, center crops."""

    def __init__(self, store: TensorStore, batch_size: int, size: int, *, train: bool,
                 mean: Sequence[float] = IMAGENET_DEFAULT_MEAN, std: Sequence[float] = IMAGENET_DEFAULT_STD,
                 scale: Sequence[float] = (0.08, 1.0), hflip: float = 0.5, color_jitter: float = 0.4,
                 crop_pct: float = 0.875, seed: int = 0, rank: int = 0, world_size: int = 1,
                 device: torch.device | str = "cpu", schedule: Callable[[int, int], tuple[int, int]] | None = None
                 ) -> None:
        self.store, self.batch_size, self.size, self.train = store, batch_size, size, train
        self.scale, self.jitter = (float(scale[0]), float(scale[1])), float(color_jitter)
        self.hflip_p, self.mean, self.std, self.crop_pct = hflip, tuple(mean), tuple(std), crop_pct
        self.seed, self.rank, self.world_size, self.device = seed, rank, world_size, torch.device(device)
        self.sampler = DistributedSampler(range(len(store)), world_size, rank, shuffle=True, seed=seed)
        self.steps = StepSampler(self.sampler, batch_size, size, schedule, seed, rank) if train else None

    def __len__(self) -> int:
        shard = len(range(self.rank, len(self.store), self.world_size))  # validation: this rank's slice
        return len(self.steps) if self.train else math.ceil(shard / self.batch_size)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.steps.set_epoch(epoch, start_step)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        if not self.train:
            for indices in torch.arange(self.rank, len(self.store), self.world_size).split(self.batch_size):
                yield self.make_batch(indices, self.size, None)
            return
        epoch_seed = np.random.SeedSequence([self.seed, self.steps.epoch, self.rank]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(epoch_seed))
        for step, (size, indices) in enumerate(self.steps.plan()):
            if step < self.steps.start:  # a resumed epoch: the skipped steps' random numbers, without their images
                ones = torch.ones(len(indices), dtype=torch.long)
                self.train_draws(ones, ones, generator)
                continue
            yield self.make_batch(indices, size, generator)

    def train_draws(self, heights: Tensor, widths: Tensor, generator: torch.Generator | None
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """Crop boxes ``[B, 4]``, flips ``[B]``, jitter factors ``[B, 3]``: as many draws for any images of a batch."""
        return (rrc_boxes(heights, widths, self.scale, generator=generator),
                torch.rand(len(heights), generator=generator) < self.hflip_p,
                jitter_factors(len(heights), self.jitter, generator))

    def make_batch(self, indices: Tensor, size: int,
                   generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """One batch of any length and output ``size``: random crops etc. from ``generator`` when training."""
        resolved, skips = self.store.resolve(indices)  # [B], [B]
        if skips.any():  # each such index is itself unreadable (a skip starts there)
            paths = self.store.paths
            names = ", ".join(paths[i] if paths is not None else f"#{i}" for i in indices.cpu()[skips > 0].tolist())
            _log.warning("replacing unreadable image(s) %s by the next readable one", names)
        padded, heights, widths = self.store.gather(resolved, self.device)  # [B, 3, Hmax, Wmax] uint8
        if self.train:
            boxes, flips, factors = self.train_draws(heights, widths, generator)  # [B, 4], [B], [B, 3]
        else:
            boxes = center_boxes(heights, widths, size, self.crop_pct)
        images = crop_resize(padded, boxes, size)  # [B, 3, s, s] float 0..255
        if self.train:
            images = torch.where(flips.to(images.device)[:, None, None, None], images.flip(-1), images)
            if self.jitter:
                images = color_jitter(images, factors)
        images = normalize(images.div_(255), self.mean, self.std, inplace=True)  # (x / 255 - mean) / std
        return images, self.store.targets[resolved].to(self.device, non_blocking=True), skips.sum()

    def describe(self) -> str:
        what = (f"random-resized crop scale {self.scale} ratio (0.75, 1.33), hflip {self.hflip_p}, color jitter "
                f"{self.jitter} (brightness, contrast, saturation in a fixed order)" if self.train
                else f"center crop (crop_pct {self.crop_pct})")
        scheduled = self.train and self.steps.schedule is not None
        sizes, batches = ("per-step sizes", "varying length") if scheduled else (f"{self.size} px", self.batch_size)
        return (f"batched {'train' if self.train else 'val'} pipeline on {self.device}: {len(self.store)} decoded "
                f"images ({self.store.data.device} store), {what} to {sizes} by roi_align, normalised; "
                f"{len(self)} batches of {batches}, rank {self.rank}/{self.world_size}, no workers")

    __repr__ = describe
