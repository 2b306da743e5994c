"""RoFormer's rotation on 2D patch positions as pure functions: positions, angles, tables, rotation.

RoFormer (Su et al., 2021, arXiv:2104.09864) rotates each channel pair ``(x_2i, x_2i+1)`` of the queries and keys by an
angle proportional to the token position, so that ``q . k`` depends only on the offset between positions; RoPE-ViT
(Heo et al., ECCV 2024, arXiv:2403.13298) gives a patch the position ``(x, y)`` and pair ``i`` the angle
``x * wx_i + y * wy_i``. These functions take the frequencies ``(wx, wy)`` as given
(``vit_rope.encodings.rope.tables.RoPE2D`` owns them) and turn positions into the ``(cos, sin)`` tables that attention
rotates q and k by: one value per channel pair, prefix tokens as identity rows, laid out token-major for the fused
rotation (``vit_rope.layers.fused``). ``apply_rope`` is the reference rotation that the fused one is held to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grid_positions(
    height: int, width: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Integer patch coordinates of an ``height x width`` grid, in the order timm's PatchEmbed flattens patches.

    Returns:
        ``[height * width, 2]`` float ``(x, y)`` per patch: x is the column, y the row, row-major.
    """
    ys, xs = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype),
        torch.arange(width, device=device, dtype=dtype),
        indexing="ij",
    )
    return torch.stack((xs, ys), dim=-1).reshape(-1, 2)  # [N, 2]


def rope_angles(positions: Tensor, freqs: Tensor) -> Tensor:
    """Angle of every channel pair at every position, ``x * wx + y * wy``, in fp32 (or fp64) even for bf16 freqs.

    Args:
        positions: ``[N, 2]`` or ``[B, N, 2]`` float ``(x, y)``; fractional and negative values are fine.
        freqs: ``[2, H, D/2]`` frequencies ``(wx, wy)``, ``H`` = 1 (shared by all heads) or num_heads; or
            ``[B, 2, H, D/2]``, one set per sample (a policy applied to each sample's grid in a NaFlex batch).

    Returns:
        ``[H, N, D/2]``, or ``[B, H, N, D/2]`` for batched positions or frequencies: a view of token-major memory
        (``[(B,) N, H, D/2]`` contiguous), the order in which the fused rotation reads its table; one ``addcmul``
        writes it row after row, where a head-major broadcast of per-token positions strides through memory.
    """
    dtype = torch.float64 if freqs.dtype == torch.float64 else torch.float32  # fp32 at least, fp64 when asked
    pos = positions.to(dtype)[..., None, None]  # [(B,) N, 2, 1, 1]
    f = freqs.to(dtype).unsqueeze(-3)  # [(B,) 2, 1, H, D/2]; elementwise, so autocast never lowers the angles to bf16
    angles = torch.addcmul(pos[..., 0, :, :] * f.select(-4, 0), pos[..., 1, :, :], f.select(-4, 1))  # [(B,) N, H, D/2]
    return angles.transpose(-3, -2)


def _prepend_rows(x: Tensor, count: int, value: float) -> Tensor:
    """``count`` rows of ``value`` before the N rows of ``x`` ``[..., N, D/2]``, in ``x``'s memory order: token-major
    tables (``rope_angles``) stay token-major."""
    if x.dim() >= 3 and x.transpose(-3, -2).is_contiguous():
        return F.pad(x.transpose(-3, -2), (0, 0, 0, 0, count, 0), value=value).transpose(-3, -2)
    return F.pad(x, (0, 0, count, 0), value=value)


def rope_tables(angles: Tensor, num_prefix_tokens: int = 0, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Turn pair angles into the ``(cos, sin)`` tables that ``apply_rope`` and ``rotate_qk`` take.

    One value per channel pair (not per channel): half the memory and work of tables repeated for both channels
    of a pair. Prefix tokens (class, registers) get identity rows (cos = 1, sin = 0) in front, so attention
    rotates the whole sequence in one pass instead of slicing prefix tokens off and concatenating them back.

    Args:
        angles: ``[..., N, D/2]`` from ``rope_angles``.
        num_prefix_tokens: identity rows to put before the N patch rows.
        temperature: scales every row (prefix rows too), hence every attention logit by ``temperature ** 2``.

    Returns:
        ``(cos, sin)``, each ``[..., P + N, D/2]`` in fp32.
    """
    cos, sin = angles.cos(), angles.sin()
    if temperature != 1.0:
        cos, sin = cos * temperature, sin * temperature
    if num_prefix_tokens:
        cos = _prepend_rows(cos, num_prefix_tokens, temperature)
        sin = _prepend_rows(sin, num_prefix_tokens, 0.0)
    return cos, sin


def grid_tables(xs: Tensor, ys: Tensor, freqs: Tensor, num_prefix_tokens: int = 0) -> tuple[Tensor, Tensor]:
    """``rope_tables(rope_angles(positions, freqs), num_prefix_tokens)`` for the grid of positions ``(xs[j], ys[i])``
    in row-major order, from the tables of each axis: ``h + w`` sines and cosines instead of ``h * w``.

    The angle is a sum, ``x * wx + y * wy``, so ``cos = cos_x cos_y - sin_x sin_y`` and ``sin = sin_x cos_y +
    cos_x sin_y``: four products over the grid replace the transcendental functions, which cost several products
    each on CPU (docs/performance.md, "How the rotation is computed"). Equal to the direct tables up to rounding
    (each axis angle is smaller than their sum, so its rounding is no larger).

    Args:
        xs: ``[w]`` x positions of the grid's columns.
        ys: ``[h]`` y positions of its rows.
        freqs: ``[2, H, D/2]`` frequencies ``(wx, wy)``.
        num_prefix_tokens: identity rows to put in front.

    Returns:
        ``(cos, sin)``, each ``[H, P + h * w, D/2]``, token-major as ``rope_tables``'.
    """
    def axis(positions: Tensor) -> tuple[Tensor, Tensor]:  # [n, 2] -> [n, H, D/2] each, angles of one axis only
        return tuple(t.transpose(0, 1) for t in rope_tables(rope_angles(positions, freqs)))

    cos_x, sin_x = axis(torch.stack((xs, torch.zeros_like(xs)), dim=-1))  # [w, H, D/2]
    cos_y, sin_y = (t[:, None] for t in axis(torch.stack((torch.zeros_like(ys), ys), dim=-1)))  # [h, 1, H, D/2]
    cos = (cos_y * cos_x).addcmul_(sin_y, sin_x, value=-1).flatten(0, 1)  # [h * w, H, D/2]
    sin = (sin_y * cos_x).addcmul_(cos_y, sin_x).flatten(0, 1)
    return (_prepend_rows(cos.transpose(0, 1), num_prefix_tokens, 1.0),
            _prepend_rows(sin.transpose(0, 1), num_prefix_tokens, 0.0))


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the interleaved channel pairs of ``x`` by the angles behind ``(cos, sin)``, out of place.

    ``[x0 x1 ...] -> [x0 c - x1 s, x1 c + x0 s, ...]``. The reference path: plain differentiable ops that
    autocast and torch.compile (which fuses them into one kernel) see through; eager attention uses the fused
    ``vit_rope.layers.fused.rotate_qk``, which tests hold equal to this. With fp32 tables and a bf16/fp16 ``x`` the
    rotation is computed in fp32 and cast back once.

    Args:
        x: ``[B, nh, N, D]`` queries or keys (any leading shape that broadcasts with the tables).
        cos: ``[..., N, D/2]`` from ``rope_tables``.
        sin: ``[..., N, D/2]`` from ``rope_tables``.

    Returns:
        The rotated tensor, same shape and dtype as ``x``.
    """
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # [..., D/2] each: even and odd channels
    return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2).to(x.dtype)
