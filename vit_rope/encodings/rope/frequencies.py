"""Frequency vectors ``(wx, wy)`` of the 2D RoPE kinds, and p-RoPE's choice of the pairs left unrotated.

Every kind turns pair ``i`` by ``x * wx_i + y * wy_i``; the kinds differ only in these vectors:

- **axial** (RoPE-ViT, Heo et al., ECCV 2024, arXiv:2403.13298): the first ``D/4`` pairs turn with x, the last with
  y, magnitudes ``theta ** (-4k / D)``;
- **mixed** (RoPE-ViT): learned per layer and head, initialised as axial RoPE in a randomly rotated frame per head
  (or, ``mixed_init="golden"``, as the golden schedule below);
- **golden** (J. Xiong, "On N-dimensional Rotary Positional Embeddings", 2025, https://jerryxio.ng/posts/nd-rope/,
  its 2D "golden gate" RoPE): fixed directions that step by the golden angle ``pi (3 - sqrt 5)`` from one pair to
  the next (and on across heads), with log-spaced magnitudes from 1 down to ``1 / theta``. Consecutive directions
  never line up, so every head covers the circle of directions about evenly: mixed RoPE's isotropy, without learned
  frequencies and with no parameter.

p-RoPE (Barbero et al., "Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025,
arXiv:2410.06205) rotates only a fraction of the pairs, those of the highest frequencies, and leaves the lowest
ones unrotated (angle 0 at every position): ``rope_fraction`` = 1 is plain RoPE, 0 no position at all.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))  # 2 pi / phi^2, about 137.5 degrees
MIXED_INITS = ("rope-vit", "golden")


def check_head_dim(head_dim: int) -> int:
    """Return ``head_dim`` if 2D RoPE can use it: two axes times pairs of channels need ``4 | head_dim``."""
    if head_dim <= 0 or head_dim % 4:
        lower, upper = head_dim - head_dim % 4, head_dim - head_dim % 4 + 4
        raise ValueError(
            f"2D RoPE needs a head_dim divisible by 4 (pairs of channels for each of the x and y axes), got "
            f"head_dim={head_dim}. Change embed_dim / num_heads so that head_dim is {lower or 4} or {upper}."
        )
    return head_dim


def check_fraction(fraction: float) -> float:
    """Return ``fraction`` as a float if it is a share of pairs in [0, 1], else raise a ``ValueError`` naming it."""
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # NaN fails too
        raise ValueError(f"rope_fraction must be in [0, 1] (the share of channel pairs rotated, p-RoPE): got "
                         f"{fraction}. 1 rotates every pair (plain RoPE), 0 none.")
    return fraction


def _magnitudes(head_dim: int, theta: float) -> Tensor:
    """``theta ** (-4k / head_dim)`` for ``k < head_dim / 4``: one frequency per pair of each axis."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim))


def axial_frequencies(head_dim: int, theta: float = 100.0) -> Tensor:
    """Axial RoPE as ``(wx, wy)``: x drives the first ``head_dim / 4`` pairs, y the last ``head_dim / 4``.

    Returns:
        ``[2, 1, head_dim // 2]``; the singleton is the head axis (all heads share the frequencies).
    """
    mag = _magnitudes(check_head_dim(head_dim), theta)
    zeros = torch.zeros_like(mag)
    wx = torch.cat((mag, zeros))
    wy = torch.cat((zeros, mag))
    return torch.stack((wx, wy))[:, None, :]


def mixed_frequencies(
    head_dim: int, num_heads: int, theta: float = 10.0, generator: torch.Generator | None = None
) -> Tensor:
    """RoPE-ViT's initialisation of mixed frequencies: one random direction per head.

    The first ``head_dim / 4`` pairs turn along a random angle ``phi`` and the last ``head_dim / 4`` along the
    orthogonal direction ``phi + pi / 2``, with the axial magnitudes, so that at initialisation each head is an
    axial RoPE in a randomly rotated frame; training then moves the frequencies freely.

    Returns:
        ``[2, num_heads, head_dim // 2]`` as ``(wx, wy)``.
    """
    mag = _magnitudes(check_head_dim(head_dim), theta)  # [D/4]
    phi = torch.rand(num_heads, 1, generator=generator) * (2 * math.pi)  # [nh, 1]
    angles = torch.cat((phi.expand(-1, mag.numel()), (phi + math.pi / 2).expand(-1, mag.numel())), dim=-1)
    mag = torch.cat((mag, mag))  # [D/2]
    return torch.stack((mag * torch.cos(angles), mag * torch.sin(angles)))  # [2, nh, D/2]


def golden_frequencies(head_dim: int, num_heads: int, theta: float = 100.0) -> Tensor:
    """Xiong's golden-angle schedule: pair ``f`` of head ``h`` points at ``(h * D/2 + f) * GOLDEN_ANGLE`` with
    magnitude ``theta ** (-f / (D/2 - 1))`` (1 for the first pair, ``1 / theta`` for the last).

    The magnitudes span the axial range (1 down to about ``1 / theta``) with every pair on one log-spaced ladder
    instead of two, one per axis; the directions continue from head to head, so the heads differ. Deterministic: the
    same frequencies in every layer and every run.

    Returns:
        ``[2, num_heads, head_dim // 2]`` as ``(wx, wy)``.
    """
    pairs = check_head_dim(head_dim) // 2
    mag = theta ** (-torch.arange(pairs, dtype=torch.float64) / (pairs - 1))  # [D/2], log-spaced from 1 to 1/theta
    index = torch.arange(num_heads * pairs, dtype=torch.float64).reshape(num_heads, pairs)  # [nh, D/2]
    angle = torch.remainder(index * GOLDEN_ANGLE, 2 * math.pi)  # fp64 before the sum grows large
    return torch.stack((mag * torch.cos(angle), mag * torch.sin(angle))).float()  # [2, nh, D/2]


def rotated_pairs(freqs: Tensor, fraction: float) -> Tensor:
    """p-RoPE's mask: 1 for the ``round(fraction * D/2)`` pairs of each head with the largest ``|w|``, 0 for the rest.

    Ranked on the frequencies given (the initial ones, for learned kinds), with ties kept in pair order by a stable
    sort, so that axial RoPE drops as many x pairs as y pairs.

    Args:
        freqs: ``[2, H, D/2]`` frequencies ``(wx, wy)``.
        fraction: share of pairs rotated, in [0, 1].

    Returns:
        ``[1, H, D/2]`` float, to multiply frequencies ``[2, H, D/2]`` by.
    """
    magnitude = freqs.detach().float().norm(dim=0)  # [H, D/2]
    keep = round(check_fraction(fraction) * magnitude.shape[-1])
    order = torch.sort(magnitude, dim=-1, descending=True, stable=True).indices[:, :keep]  # [H, keep]
    mask = torch.zeros_like(magnitude).scatter_(-1, order, 1.0)
    return mask[None]  # [1, H, D/2]
