"""Frequency vectors ``(wx, wy)`` of the 2D RoPE kinds, and p-RoPE's choice of the pairs left unrotated.

Axial and mixed: RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298), axial's alternate ladder Pixtral's
(arXiv:2410.07073); golden: J. Xiong, "On N-dimensional Rotary Positional Embeddings", 2025,
https://jerryxio.ng/posts/nd-rope/; p-RoPE: Barbero et al., ICLR 2025, arXiv:2410.06205."""

from __future__ import annotations

import math

import torch
from torch import Tensor

GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))  # 2 pi / phi^2, about 137.5 degrees
MIXED_INITS = ("rope-vit", "golden")


def check_head_dim(head_dim: int) -> int:
    """``head_dim`` if 2D RoPE can use it: two axes times pairs of channels need ``4 | head_dim``."""
    if head_dim <= 0 or head_dim % 4:
        lower, upper = head_dim - head_dim % 4, head_dim - head_dim % 4 + 4
        raise ValueError(f"2D RoPE needs a head_dim divisible by 4 (pairs of channels for each of the x and y axes), "
                         f"got head_dim={head_dim}. Change embed_dim / num_heads so that head_dim is {lower or 4} or "
                         f"{upper}.")
    return head_dim


def check_fraction(fraction: float) -> float:
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # NaN fails too
        raise ValueError(f"rope_fraction must be in [0, 1] (the share of channel pairs rotated, p-RoPE): got "
                         f"{fraction}. 1 rotates every pair (plain RoPE), 0 none.")
    return fraction


def _magnitudes(head_dim: int, theta: float) -> Tensor:
    """``theta ** (-4k / head_dim)`` for ``k < head_dim / 4``: one frequency per pair of each axis."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim))


def axial_frequencies(head_dim: int, theta: float = 100.0, alternate: bool = False) -> Tensor:
    """Axial RoPE ``(wx, wy)`` ``[2, 1, D/2]``; ``alternate``: Pixtral's, x and y on alternate rungs."""
    if not alternate:
        return axial_layout(_magnitudes(check_head_dim(head_dim), theta))
    ladder = 1.0 / (theta ** (torch.arange(0, check_head_dim(head_dim), 2, dtype=torch.float32) / head_dim))
    return axial_layout(ladder[1::2], ladder[0::2])


def axial_layout(magnitude: Tensor, magnitude_y: Tensor | None = None) -> Tensor:
    """``(wx, wy)`` ``[2, 1, 2 F]`` of ``F`` magnitudes per axis: x drives the first ``F`` pairs, y the last."""
    zeros = torch.zeros_like(magnitude)
    y = magnitude if magnitude_y is None else magnitude_y
    return torch.stack((torch.cat((magnitude, zeros)), torch.cat((zeros, y))))[:, None, :]


def mixed_frequencies(head_dim: int, num_heads: int, theta: float = 10.0, generator: torch.Generator | None = None
                      ) -> Tensor:
    """RoPE-ViT's initial mixed frequencies ``[2, nh, D/2]``: axial RoPE in a random frame per head."""
    mag = _magnitudes(check_head_dim(head_dim), theta)  # [D/4]
    phi = torch.rand(num_heads, 1, generator=generator) * (2 * math.pi)  # [nh, 1]
    angles = torch.cat((phi.expand(-1, mag.numel()), (phi + math.pi / 2).expand(-1, mag.numel())), dim=-1)
    mag = torch.cat((mag, mag))  # [D/2]
    return torch.stack((mag * torch.cos(angles), mag * torch.sin(angles)))  # [2, nh, D/2]


def golden_frequencies(head_dim: int, num_heads: int, theta: float = 100.0) -> Tensor:
    """Xiong's golden-angle schedule ``[2, nh, D/2]``: pair ``f`` of head ``h`` points at ``(h * D/2 + f) *
    GOLDEN_ANGLE``, the directions continuing from head to head so that the heads differ."""
    pairs = check_head_dim(head_dim) // 2
    mag = theta ** (-torch.arange(pairs, dtype=torch.float64) / (pairs - 1))  # [D/2], log-spaced from 1 to 1/theta
    index = torch.arange(num_heads * pairs, dtype=torch.float64).reshape(num_heads, pairs)  # [nh, D/2]
    angle = torch.remainder(index * GOLDEN_ANGLE, 2 * math.pi)  # fp64 before the sum grows large
    return torch.stack((mag * torch.cos(angle), mag * torch.sin(angle))).float()  # [2, nh, D/2]


def rotated_pairs(freqs: Tensor, fraction: float) -> Tensor:
    """p-RoPE's mask ``[1, H, D/2]``: 1 for each head's ``round(fraction * D/2)`` pairs of largest ``|w|``; a stable
    sort, so that axial RoPE drops as many x pairs as y pairs."""
    magnitude = freqs.detach().float().norm(dim=0)  # [H, D/2]
    keep = round(check_fraction(fraction) * magnitude.shape[-1])
    order = torch.sort(magnitude, dim=-1, descending=True, stable=True).indices[:, :keep]  # [H, keep]
    mask = torch.zeros_like(magnitude).scatter_(-1, order, 1.0)
    return mask[None]  # [1, H, D/2]
