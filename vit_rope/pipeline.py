"""Batched tensor data pipeline: a decoded uint8 store, augmented one *batch* at a time on the compute device.

Why: training from the decoded cache through a ``DataLoader`` spends a worker process per core on per-image PIL
augmentation, so on a 2-core CPU the model ran at about 0.55x its step speed. Here the cache is one flat uint8 store
(optionally memory-mapped and shared by processes, or held on a GPU), and each batch is cropped, resized, flipped,
colour-jittered and normalised by a handful of batched tensor ops in the training process itself (CPU threads or
CUDA); there are no worker processes and an image is never decoded again.

What matches timm / torchvision and what is approximated:

- Training crops follow timm's ``RandomResizedCropAndInterpolation.get_params`` law (timm/data/transforms.py): up to
  10 attempts of area ``U(scale)`` x image area and aspect ``exp(U(log ratio))``, the first that fits wins at a
  uniform position, else a centred crop with the aspect clamped to ``ratio``. Random numbers come from a CPU
  ``torch.Generator`` (all 10 attempts drawn at once), so the law is timm's but the stream is not Python's ``random``.
- Validation crops are the source region that timm's eval transform (resize the short side to
  ``floor(size / crop_pct)``, center-crop ``size``) shows, computed exactly as torchvision rounds.
- Resampling is ``torchvision.ops.roi_align`` (bilinear, ``aligned=True``, adaptive sampling: each output pixel
  averages ``ceil(box / size)``^2 bilinear samples, so downscaling is antialiased by a box filter) instead of PIL's
  bicubic / bilinear filters: a few gray levels of difference on natural images, identical geometry.
- Colour jitter has torchvision's ``ColorJitter`` factor law for brightness, contrast and saturation (no hue), applied
  in the fixed order brightness, contrast, saturation; timm / torchvision pick a random order per image.
- Not covered: RandAugment / ThreeAugment, random erasing, timm's ``rkrc`` / ``rkrr`` crop modes, repeated
  augmentation. Configs that use them need the ``DataLoader`` pipeline of ``vit_rope.data``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DistributedSampler
from torchvision.ops import roi_align

_log = logging.getLogger(__name__)
ATTEMPTS = 10  # timm's RandomResizedCrop tries this many (area, aspect) draws before its center-crop fallback
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L") and torchvision's ColorJitter
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The augmentation seed of (seed, epoch, rank), for this loader and ``vit_rope.data.set_epoch``'s workers."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


def rrc_boxes(heights: Tensor, widths: Tensor, scale: tuple[float, float] = (0.08, 1.0),
              ratio: tuple[float, float] = (3 / 4, 4 / 3), generator: torch.Generator | None = None) -> Tensor:
    """timm's random-resized-crop boxes for a batch of image sizes, as ``[B, 4]`` float ``(x0, y0, x1, y1)`` pixels.

    Always draws ``B x 22`` numbers from ``generator`` (CPU), whatever the outcome, so later draws do not depend on
    the image sizes. Widths and heights are at least 1 px (timm would produce an empty crop for tiny images).
    """
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
    # fallback: the whole image with its aspect clamped into [min(ratio), max(ratio)], centred
    lo, hi = min(ratio), max(ratio)
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
    """The source region timm's eval transform shows (resize short side to ``floor(size / crop_pct)``, center-crop
    ``size``), as ``[B, 4]`` float ``(x0, y0, x1, y1)`` in source pixels; torchvision's integer rounding included."""
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
    """Crop each box of ``images`` (uint8 ``[B, 3, H, W]``), resize it to ``size`` px: float ``[B, 3, s, s]``, 0..255.

    A box is in continuous pixel coordinates (pixel ``i`` covers ``[i, i + 1)``); past its right / bottom edge an
    image must be padded with a copy of its last column / row (``TensorStore.gather`` does), since bilinear samples
    near the edge read one pixel beyond it with zero weight.
    """
    index = torch.arange(len(boxes), dtype=torch.float32, device=boxes.device)[:, None]
    rois = torch.cat([index, boxes.float()], 1).to(images.device)  # [B, 5]: batch index, x0, y0, x1, y1
    pixels = images.to(torch.float32, memory_format=torch.contiguous_format)  # [B, 3, H, W]
    return roi_align(pixels, rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def flip_draws(batch: int, p: float, generator: torch.Generator | None) -> Tensor:
    """Which images to flip, ``[B]`` bool; draws ``B`` numbers whatever ``p`` is."""
    return torch.rand(batch, generator=generator) < p


def hflip(images: Tensor, flips: Tensor) -> Tensor:
    """Mirror left-right the images ``[B, C, H, W]`` where ``flips`` ``[B]`` is true."""
    return torch.where(flips.to(images.device)[:, None, None, None], images.flip(-1), images)


def jitter_factors(batch: int, strength: float | Sequence[float], generator: torch.Generator | None) -> Tensor:
    """Brightness, contrast and saturation factors ``[B, 3]``, each ``U(max(0, 1 - j), 1 + j)`` as torchvision's
    ``ColorJitter``; draws ``3 B`` numbers whatever the strength is."""
    j = torch.tensor([float(strength)] * 3 if isinstance(strength, (int, float)) else list(strength)[:3],
                     dtype=torch.float64)
    lo, hi = (1 - j).clamp_min(0), 1 + j  # [3]
    return (lo + (hi - lo) * torch.rand(batch, 3, generator=generator, dtype=torch.float64)).float()  # [B, 3]


def grayscale(images: Tensor) -> Tensor:
    """Luma ``[B, 1, H, W]`` of RGB images ``[B, 3, H, W]``."""
    weights = torch.tensor(GRAY_WEIGHTS, dtype=images.dtype, device=images.device)
    return torch.einsum("bchw,c->bhw", images, weights)[:, None]


def color_jitter(images: Tensor, factors: Tensor) -> Tensor:
    """Brightness, contrast, saturation (fixed order) with per-image ``factors`` ``[B, 3]`` on 0..255 floats.

    As torchvision: brightness multiplies, contrast blends with the mean of the grayscale image, saturation with the
    grayscale image, and the result is clamped to 0..255 after each.
    """
    brightness, contrast, saturation = factors.to(images.device, images.dtype)[:, :, None, None, None].unbind(1)
    x = (images * brightness).clamp_(0, 255)  # [B, 3, H, W]
    mean = grayscale(x).mean((1, 2, 3), keepdim=True)  # [B, 1, 1, 1]
    x = (contrast * x + (1 - contrast) * mean).clamp_(0, 255)
    return (saturation * x + (1 - saturation) * grayscale(x)).clamp_(0, 255)


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(x / 255 - mean) / std`` per channel, in place, for 0..255 float images ``[B, 3, H, W]``."""
    mean_t = torch.tensor(mean, dtype=images.dtype, device=images.device)[:, None, None]  # [3, 1, 1]
    std_t = torch.tensor(std, dtype=images.dtype, device=images.device)[:, None, None]
    return images.div_(255).sub_(mean_t).div_(std_t)


class TensorStore:
    """Decoded images in one flat uint8 tensor (HWC per image, as ``vit_rope.data.DecodedImages``) with targets.

    Args:
        data: flat uint8, may be memory-mapped (``torch.load(mmap=True)``): it is never copied as a whole.
        offsets: ``[N]`` start of each image in ``data``.
        shapes: ``[N, 2]`` (height, width); height 0 marks an image that could not be decoded.
        targets: ``[N]`` class indices.
    """

    def __init__(self, data: Tensor, offsets: Tensor, shapes: Tensor, targets: Tensor | Sequence[int]) -> None:
        self.data, self.offsets = data, offsets.cpu().long()
        self.shapes, self.targets = shapes.cpu().long().reshape(-1, 2), torch.as_tensor(targets).long().cpu()
        if not len(self.shapes) == len(self.offsets) == len(self.targets):
            raise ValueError(f"{len(self.shapes)} shapes, {len(self.offsets)} offsets, {len(self.targets)} targets")
        readable = torch.nonzero(self.shapes[:, 0] > 0)[:, 0]  # [R], ascending
        if len(readable) == 0:
            raise RuntimeError("no image of the dataset could be read")
        # next readable index at or after each index, wrapping, as ImageFolderDataset's replacement
        pos = torch.searchsorted(readable, torch.arange(len(self)))
        self._next = readable[pos % len(readable)]  # [N]
        self._skips = (self._next - torch.arange(len(self))) % len(self)  # [N]

    @classmethod
    def from_decoded(cls, images: Any, targets: Tensor | Sequence[int]) -> TensorStore:
        """A store sharing the tensors of a ``vit_rope.data.DecodedImages`` (no copy)."""
        return cls(images.data, images.offsets, images.shapes, targets)

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
            into the padding, see ``crop_resize``), heights ``[B]`` and widths ``[B]`` (CPU, long).
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
    ``world_size``, this rank's share), full batches only; crops, flips and jitter come from a CPU generator seeded
    by (seed, epoch, rank), so an epoch is the same whenever it is run (resumes included). Validation: this rank's
    slice ``range(rank, N, world_size)`` in order, every batch including the last partial one, center crops.
    Images and targets are on ``device``; ``skipped`` (unreadable images replaced in the batch) stays on the CPU.

    ``schedule`` (training only; e.g. ``vit_rope.sizes.SizeSchedule``) maps (epoch, step) to the ``(size, batch)`` of
    that step, for variable-resolution training. An epoch keeps ``len(self)`` steps and step i takes the next
    ``batch_i`` indices of the epoch's order, wrapping around to its start when they run out: the images seen per
    epoch vary by a few percent, and since the order is reshuffled every epoch no image is left out for good.
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
            raise ValueError("hue jitter is not supported by the batched pipeline")
        self.hflip_p, self.mean, self.std, self.crop_pct = hflip, tuple(mean), tuple(std), crop_pct
        self.seed, self.rank, self.world_size, self.epoch = seed, rank, world_size, 0
        self.device, self.channels_last, self.schedule = torch.device(device), channels_last, schedule
        self.sampler = DistributedSampler(range(len(store)), world_size, rank, shuffle=True, seed=seed)
        if train and len(self.sampler) < batch_size:
            raise ValueError(f"{len(store)} images make no full batch of {batch_size} x {world_size} process(es)")

    def __len__(self) -> int:
        if self.train:
            return len(self.sampler) // self.batch_size
        return -(-len(range(self.rank, len(self.store), self.world_size)) // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select epoch ``epoch``'s order and augmentation randomness (training)."""
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def batches(self) -> list[Tensor]:
        """This rank's store indices of each batch of the current epoch."""
        if not self.train:
            return list(torch.arange(self.rank, len(self.store), self.world_size).split(self.batch_size))
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        if self.schedule is None:
            return list(order[:len(self) * self.batch_size].view(len(self), self.batch_size))
        lengths = [self.schedule(self.epoch, step)[1] for step in range(len(self))]
        return list(order[torch.arange(sum(lengths)) % len(order)].split(lengths))  # wraps around the order

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch, self.rank)) if self.train else None
        for step, indices in enumerate(self.batches()):
            size = self.schedule(self.epoch, step)[0] if self.train and self.schedule is not None else self.size
            yield self.make_batch(indices, size, generator)

    def make_batch(self, indices: Tensor, size: int,
                   generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """One batch of any length and output ``size``: random crops etc. from ``generator`` when training."""
        resolved, skips = self.store.resolve(indices)  # [B], [B]
        if skips.any():
            _log.warning("replacing unreadable image(s) %s by the next readable one", indices[skips > 0].tolist())
        padded, heights, widths = self.store.gather(resolved, self.device)  # [B, 3, Hmax, Wmax] uint8
        if self.train:
            boxes = rrc_boxes(heights, widths, self.scale, self.ratio, generator)  # [B, 4]
            flips = flip_draws(len(indices), self.hflip_p, generator)  # [B]
            factors = jitter_factors(len(indices), self.jitter, generator)  # [B, 3]
        else:
            boxes = center_boxes(heights, widths, size, self.crop_pct)
        images = crop_resize(padded, boxes, size)  # [B, 3, s, s] float 0..255
        if self.train:
            images = hflip(images, flips)
            if any(self.jitter[:3]):
                images = color_jitter(images, factors)
        images = normalize(images, self.mean, self.std)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, self.store.targets[resolved].to(self.device, non_blocking=True), skips.sum()

    def describe(self) -> str:
        """One line for the training log."""
        what = (f"random-resized crop scale {self.scale} ratio ({self.ratio[0]:.3g}, {self.ratio[1]:.3g}), hflip "
                f"{self.hflip_p}, color jitter {self.jitter[:3]} (fixed order)" if self.train
                else f"center crop (crop_pct {self.crop_pct})")
        scheduled = self.train and self.schedule is not None
        sizes, batches = ("per-step sizes", "varying length") if scheduled else (f"{self.size} px", self.batch_size)
        return (f"batched {'train' if self.train else 'val'} pipeline on {self.device}: {len(self.store)} decoded "
                f"images ({self.store.device} store), {what} to {sizes} by roi_align, normalised; "
                f"{len(self)} batches of {batches}, rank {self.rank}/{self.world_size}, no workers")

    __repr__ = describe
