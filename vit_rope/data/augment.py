"""Batched augmentation ops on uint8 / float image tensors ``[B, 3, H, W]``, for ``vit_rope.data.pipeline``.

Each op draws from a CPU ``torch.Generator`` passed in, as many numbers whatever the outcome, so that a batch is
reproducible from ``(seed, epoch, rank)`` on any device; how they differ from timm's: docs/training.md."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.ops import roi_align

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


def hflip(images: Tensor, flips: Tensor) -> Tensor:
    return torch.where(flips.to(images.device)[:, None, None, None], images.flip(-1), images)


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


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(x / 255 - mean) / std`` per channel, in place, for 0..255 float images ``[B, 3, H, W]``."""
    mean_t = torch.tensor(mean, dtype=images.dtype, device=images.device)[:, None, None]  # [3, 1, 1]
    std_t = torch.tensor(std, dtype=images.dtype, device=images.device)[:, None, None]
    return images.div_(255).sub_(mean_t).div_(std_t)
