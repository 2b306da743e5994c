"""RoFormer's rotation on 2D patch positions as pure functions (the angles: ``vit_rope.encodings.rope.tables``):
positions, angles, tables, and ``apply_rope``, the reference rotation the fused one is held to."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grid_positions(height: int, width: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32
                   ) -> Tensor:
    """Integer patch coordinates ``[height * width, 2]`` (x, y) of a grid, row-major as timm's PatchEmbed flattens."""
    ys, xs = torch.meshgrid(torch.arange(height, device=device, dtype=dtype),
                            torch.arange(width, device=device, dtype=dtype), indexing="ij")
    return torch.stack((xs, ys), dim=-1).reshape(-1, 2)  # [N, 2]


def rope_angles(positions: Tensor, freqs: Tensor) -> Tensor:
    """Angle ``x * wx + y * wy`` of every pair at every position, fp32 at least, token-major in memory."""
    dtype = torch.float64 if freqs.dtype == torch.float64 else torch.float32  # fp32 at least, fp64 when asked
    pos = positions.to(dtype)[..., None, None]  # [(B,) N, 2, 1, 1]
    f = freqs.to(dtype).unsqueeze(-3)  # [(B,) 2, 1, H, D/2]; elementwise, so autocast never lowers the angles to bf16
    angles = torch.addcmul(pos[..., 0, :, :] * f.select(-4, 0), pos[..., 1, :, :], f.select(-4, 1))  # [(B,) N, H, D/2]
    return angles.transpose(-3, -2)


def _prepend_rows(x: Tensor, count: int, value: float) -> Tensor:
    """``count`` rows of ``value`` before ``x`` ``[..., N, D/2]``, in its memory order (token-major tables stay so)."""
    if x.dim() >= 3 and x.transpose(-3, -2).is_contiguous():
        return F.pad(x.transpose(-3, -2), (0, 0, 0, 0, count, 0), value=value).transpose(-3, -2)
    return F.pad(x, (0, 0, count, 0), value=value)


def rope_tables(angles: Tensor, num_prefix_tokens: int = 0) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` of ``angles``, identity rows in front for the prefix tokens (one pass rotates all)."""
    cos, sin = angles.cos(), angles.sin()
    if num_prefix_tokens:
        cos = _prepend_rows(cos, num_prefix_tokens, 1.0)
        sin = _prepend_rows(sin, num_prefix_tokens, 0.0)
    return cos, sin


def grid_tables(xs: Tensor, ys: Tensor, freqs: Tensor, num_prefix_tokens: int = 0) -> tuple[Tensor, Tensor]:
    """``rope_tables(rope_angles(positions, freqs), num_prefix_tokens)`` for the row-major grid ``(xs[j], ys[i])``
    from the tables of each axis: ``h + w`` sines and cosines instead of ``h * w``, by the angle-sum identities."""
    def axis(positions: Tensor) -> tuple[Tensor, Tensor]:  # [n, 2] -> [n, H, D/2] each, angles of one axis only
        return tuple(t.transpose(0, 1) for t in rope_tables(rope_angles(positions, freqs)))

    cos_x, sin_x = axis(torch.stack((xs, torch.zeros_like(xs)), dim=-1))  # [w, H, D/2]
    cos_y, sin_y = (t[:, None] for t in axis(torch.stack((torch.zeros_like(ys), ys), dim=-1)))  # [h, 1, H, D/2]
    cos = (cos_y * cos_x).addcmul_(sin_y, sin_x, value=-1).flatten(0, 1)  # [h * w, H, D/2]
    sin = (sin_y * cos_x).addcmul_(cos_y, sin_x).flatten(0, 1)
    return (_prepend_rows(cos.transpose(0, 1), num_prefix_tokens, 1.0),
            _prepend_rows(sin.transpose(0, 1), num_prefix_tokens, 0.0))


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the interleaved channel pairs of ``x`` ``[B, nh, N, D]`` by ``(cos, sin)`` ``[..., N, D/2]``, out of
    place, in the tables' dtype: the reference, plain ops that autocast and torch.compile see through."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # [..., D/2] each: even and odd channels
    return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2).to(x.dtype)
