"""DINOv3's 2D RoPE as pure functions: period schedule, normalised patch coordinates, channel layout, coordinate draws.

DINOv3 (Simeoni et al. 2025, arXiv:2508.10104) is axial RoPE with three differences from RoPE-ViT's (arXiv:2403.13298):

- **coordinates**: patch centres normalised to [-1, 1], ``2 (i + 0.5) / d - 1``, with ``d`` each axis's own size
  (``separate``) or the grid's shorter (``min``) or longer (``max``) side, so that a larger image covers the same
  range with finer steps: the model never meets a coordinate outside what it was trained on;
- **periods**: pair ``j`` of an axis turns by ``2 pi x / p_j`` with ``p_j = base ** (4 j / D)`` (base 100) or
  ``p_j = min_period (max_period / min_period) ** (j / (D/4 - 1))``; ``vit_rope`` keeps the ``2 pi / p_j`` as the
  frequencies, so positions stay in normalised units and coordinate augmentation is in DINOv3's units;
- **layout**: rotate-half pairs ``(c, c + D/2)``, the first D/4 turning with y (row) and the last with x. Our
  kernels rotate interleaved pairs with x first; ``interleave_permutation`` is the row order of the q / k
  projection that turns one into the other, applied once when weights load (q . k is unchanged by a permutation
  applied to both).

Training-time coordinate augmentation (shift, per-axis jitter, shared rescale) is
``vit_rope.encodings.policies.CoordAugment``; with ``per_image=False`` it makes DINOv3's one draw per batch, with the
same random calls in the same order as DINOv3 and timm's ``RotaryEmbeddingDinoV3``, so the same random state gives the
same coordinates.

The q / k layouts of other checkpoints come here too (``qk_permutation``): timm's ``Eva`` rotates interleaved pairs
like ours, but with ``grid_indexing='ij'`` (EVA-02, Fang et al. 2023, arXiv:2303.11331; timm's SBB RoPE ViTs) its
first D/4 pairs turn with y; with ``'xy'`` (Perception Encoder, Bolya et al. 2025, arXiv:2504.13181) it is ours.
``permute_qk_rows`` applies such a permutation to the q and k rows of a checkpoint's qkv projection, the one place
every converter does it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vit_rope.checks import check_choice

NORMALIZE = ("separate", "min", "max")


def check_normalize(normalize: str) -> str:
    """Return ``normalize`` if DINOv3 knows it, else raise a ``ValueError`` listing the choices."""
    return check_choice(normalize, NORMALIZE, "DINOv3 coordinate normalisation")


def dinov3_frequencies(head_dim: int, base: float = 100.0, min_period: float | None = None,
                       max_period: float | None = None) -> Tensor:
    """Frequencies ``2 pi / p_j`` as ``(wx, wy)`` ``[2, 1, head_dim // 2]``: x drives the first D/4 pairs, y the last.

    ``min_period`` and ``max_period`` together replace the ``base`` schedule (DINOv3's two options).
    """
    quarter = head_dim // 4
    if (min_period is None) != (max_period is None):
        raise ValueError(f"DINOv3 RoPE needs both min_period and max_period or neither, got {min_period} and "
                         f"{max_period}.")
    if min_period is not None and max_period is not None:
        if not 0 < min_period <= max_period:
            raise ValueError(f"DINOv3 RoPE needs 0 < min_period <= max_period, got {min_period} and {max_period}.")
        periods = min_period * (max_period / min_period) ** torch.linspace(0, 1, quarter, dtype=torch.float32)
    else:
        periods = base ** (2.0 * torch.arange(quarter, dtype=torch.float32) / (head_dim // 2))
    magnitude = 2 * math.pi / periods  # [D/4]
    zeros = torch.zeros_like(magnitude)
    return torch.stack((torch.cat((magnitude, zeros)), torch.cat((zeros, magnitude))))[:, None, :]


def _swapped_axes(head_dim: int) -> tuple[Tensor, Tensor]:
    """For each of our channels ``[head_dim]``: the pair of a layout whose first D/4 pairs turn with the other axis
    (DINOv3's, timm Eva's ``'ij'``), ``(p + D/4) mod D/2`` for our pair ``p``, and the channel's place in its pair."""
    channel = torch.arange(head_dim)
    return (channel // 2 + head_dim // 4) % (head_dim // 2), channel % 2


def interleave_permutation(head_dim: int) -> Tensor:
    """Index ``[head_dim]``: row ``c`` of our q (or k) head is row ``index[c]`` of DINOv3's rotate-half head.

    Our pair ``p`` (channels ``2p, 2p + 1``, x for ``p < D/4``) is DINOv3's pair ``(p + D/4) mod D/2`` (channels
    ``i, i + D/2``, y for ``i < D/4``).
    """
    pair, place = _swapped_axes(head_dim)
    return pair + place * (head_dim // 2)


QK_LAYOUTS = ("interleaved", "eva_ij", "eva_xy", "rotate_half")


def check_qk_layout(layout: str) -> str:
    """Return ``layout`` if ``qk_permutation`` knows it, else raise a ``ValueError`` listing the choices."""
    if layout not in QK_LAYOUTS:
        raise ValueError(f"Unknown q/k layout {layout!r}: choose one of {', '.join(QK_LAYOUTS)} (the layout of the "
                         "checkpoint the model loads).")
    return layout


def qk_permutation(layout: str, head_dim: int) -> Tensor:
    """Index ``[head_dim]``: row ``c`` of our q (or k) head is row ``index[c]`` of a head in ``layout``.

    ``interleaved`` (ours) and ``eva_xy`` (timm's cat RoPE, x first): the identity; ``eva_ij`` (cat RoPE, y first):
    our pair ``p`` is timm's pair ``(p + D/4) mod D/2``, channel parity kept; ``rotate_half``: DINOv3's
    (``interleave_permutation``). Any permutation applied to both q and k leaves every attention score as it was.
    """
    if check_qk_layout(layout) in ("interleaved", "eva_xy"):
        return torch.arange(head_dim)
    if layout == "rotate_half":
        return interleave_permutation(head_dim)
    pair, place = _swapped_axes(head_dim)
    return 2 * pair + place


def permute_qk_rows(value: Tensor, index: Tensor, num_heads: int, num_kv_heads: int | None = None) -> Tensor:
    """The rows of a qkv weight ``[(nh + 2 nkv) D, C]`` or bias ``[(nh + 2 nkv) D]`` with every q and k head's rows
    taken in the order ``index`` (``qk_permutation``, ``[D]``) and the v rows as they are: a checkpoint's q / k layout
    turned into ours once, when weights load. ``num_kv_heads`` (grouped-query attention) defaults to ``num_heads``."""
    head_dim = index.numel()
    kv_rows = (num_heads if num_kv_heads is None else num_kv_heads) * head_dim
    q, k, v = value.split([num_heads * head_dim, kv_rows, kv_rows])
    index = index.to(value.device)
    q, k = (rows.unflatten(0, (-1, head_dim)).index_select(1, index).flatten(0, 1) for rows in (q, k))
    return torch.cat((q, k, v))
