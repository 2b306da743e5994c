"""What NaFlex batches (NaViT, Dehghani et al., NeurIPS 2023; timm's NaFlexViT: images at their own sizes, packed into
one padded sequence) need: all for the whole batch at once, no loop over samples nor ``.item()``, one compiled graph."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def naflex_grid(coord: Tensor, valid: Tensor) -> Tensor:
    """Each sample's patch grid ``[B, 2]`` as (h, w): one more than its largest valid coordinate per axis."""
    return (coord * valid[..., None]).amax(1) + 1  # [B, 2]


class Lattice(NamedTuple):
    """The rows ``[B, P + N]`` a NaFlex batch on integer positions reads of its bounding ``grid``'s (h, w) RoPE tables
    with an identity row in front: prefix tokens row 0, the patch at (y, x) row ``1 + y * w + x``, padding (0, 0)."""

    rows: Tensor
    grid: tuple[int, int]


def lattice(coord: Tensor, valid: Tensor, grid: Tensor, num_prefix_tokens: int) -> Lattice | None:
    """The ``Lattice`` of a batch (its ``h * w`` tables replace ``B * N`` angle, cosine and sine evaluations), ``None``
    where the bounding grid has at least as many cells as the batch tokens. Reads the box's size: one host sync."""
    B, N = valid.shape
    if not B:
        return None
    height, width = grid.amax(0).tolist()  # the bounding grid
    if height * width >= B * N:
        return None
    rows = (coord[..., 0] * width + coord[..., 1] + 1).masked_fill(~valid, 1)  # [B, N]
    return Lattice(torch.cat((rows.new_zeros(B, num_prefix_tokens), rows), dim=1), (height, width))


def gather_rows(table: Tensor, rows: Tensor) -> Tensor:
    """Per-sample tables ``[B, H, T, D/2]`` (token-major) from one table ``[H, R, D/2]`` and ``rows`` ``[B, T]``."""
    H, R, half = table.shape
    flat = table.transpose(0, 1).reshape(R, H * half)  # [R, H * D/2]: a view of token-major memory
    return flat.index_select(0, rows.flatten()).view(*rows.shape, H, half).transpose(1, 2)


def key_padding_mask(valid: Tensor, num_prefix_tokens: int) -> Tensor:
    """Boolean attention mask ``[B, 1, 1, P + N]`` that hides padding as keys only: a padded query row with no key
    would softmax to NaN (and NaN times a zero gradient is NaN); its output is never read."""
    return torch.cat((valid.new_ones(valid.shape[0], num_prefix_tokens), valid), dim=1)[:, None, None, :]


def _aa_bicubic_weights(index: Tensor, out_len: Tensor, in_len: int) -> Tensor:
    """Per-token weights ``[B, N, in_len]`` of ``F.interpolate(mode="bicubic", antialias=True)`` to ``out_len``."""
    scale = in_len / out_len.double()  # [B, 1]
    center = scale * (index.double() + 0.5)  # [B, N]
    support = scale.clamp(min=1.0)[..., None]  # [B, 1, 1]
    taps = torch.arange(in_len, dtype=torch.float64, device=index.device) + 0.5  # [in_len]
    x = ((taps - center[..., None]) / support).abs()  # [B, N, in_len]
    a = -0.5  # the cubic coefficient of PyTorch's antialiased bicubic resampling (timm's APE resampling)
    w = torch.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    torch.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, torch.zeros_like(x)))
    return (w / w.sum(-1, keepdim=True)).float()


def _bilinear_corner_weights(index: Tensor, out_len: Tensor, in_len: int) -> Tensor:
    """Per-token weights ``[B, N, in_len]`` of ``F.interpolate(mode="bilinear", align_corners=True)``."""
    steps = (out_len.double() - 1).clamp(min=1.0)
    source = index.double() * (in_len - 1) / steps  # [B, N]
    taps = torch.arange(in_len, dtype=torch.float64, device=index.device)
    return (1 - (taps - source[..., None]).abs()).clamp(min=0.0).float()


def pos_embed_at(table: Tensor, coord: Tensor, grid: Tensor, train_grid: tuple[int, int],
                 resampling: str = "bicubic") -> Tensor:
    """The absolute position embedding ``[B, N, C]`` of each patch, as ``fit_pos_embed`` resamples the ``[h0 * w0, C]``
    ``table`` to each sample's grid, read at its coordinate: a weighted sum per token, not a table per grid size."""
    weights = _aa_bicubic_weights if resampling == "bicubic" else _bilinear_corner_weights
    wy = weights(coord[..., 0], grid[:, :1], train_grid[0])  # [B, N, h0]
    wx = weights(coord[..., 1], grid[:, 1:], train_grid[1])  # [B, N, w0]
    weights = (wy[..., :, None] * wx[..., None, :]).flatten(-2)  # [B, N, h0 * w0]
    return (weights @ table.float()).to(table.dtype)
