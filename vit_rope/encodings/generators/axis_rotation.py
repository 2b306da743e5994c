"""Commuting rotations of an image batch given per axis (ComRoPE's): ``exp(x A_x + y A_y) = exp(y A_y) exp(x A_x)``.

Where the generators commute (``vit_rope.encodings.generators.comrope``) and a grid's positions are evenly spaced, the
rotation of every cell is the product of its column's and its row's, ``exp(x_c A) = exp(x_0 A) exp(d A)^c`` along an
axis: a handful of exponentials instead of one per cell (``axis_turns``).

- ``rotate_axes``: q and k turned by the per-axis tables themselves, one batched matmul per axis (``[H, w or h, m, b,
  b]``, the batch and the other axis as its columns): the path of graph captures and of attentions whose projection
  is not a plain one (q/k norms, hooks).
- ``cell_table``: the same rotations as one token-major table per cell, which ``vit_rope.layers.paired_rotation``
  applies straight from the projection (``AxisRotations.project``): the cheaper path for batches of 8 images or
  more, in training above all.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vit_rope.layers.attention import BlockInput, plain_projection
from vit_rope.layers.expm import expm
from vit_rope.layers.paired_rotation import project_rotate_paired

# the per-cell path's products have the batch's images as their rows: with 2 images (2-core CPU, ViT-S at 448 px) the
# per-axis products, fewer and with more rows, cost less despite their reorderings (docs/performance.md); 8 and more
# were faster paired
PAIRED_MIN_BATCH = 8


def rotate_axes(q: Tensor, k: Tensor, turns: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """q and k ``[B, H, P + h * w, D]`` of an image batch turned by commuting rotations given per axis, ``turns =
    (prefix, turn_x, turn_y)``: the prefix tokens' ``[H, P, m, b, b]``, the columns' ``[H, w, m_x, b, b]`` and the
    rows' ``[H, h, m_y, b, b]``. Every block turns by both axes (``m_x = m_y = m``: x, then y) or, with ``m / 2``
    tables each, the even blocks by y only and the odd ones by x only (ComRoPE-AP). Equal to ``rotate_blocks`` with
    the tables of every cell (``exp(y A_y) exp(x A_x)``), at a fraction of the products in both directions."""
    prefix, turn_x, turn_y = (t.to(q.dtype) for t in turns)
    P, m, b = prefix.shape[1], prefix.shape[2], prefix.shape[-1]
    h, w = turn_y.shape[1], turn_x.shape[1]
    qk = torch.stack((q, k))  # [2, B, H, P + N, D]
    # split and unbind, not slices or indices, whose backward writes each gradient into zeros of the whole
    head, cells = qk.split((P, h * w), 3)
    head = torch.einsum("hpmij,cbhpmj->cbhpmi", prefix, head.unflatten(-1, (m, b)))
    cells = cells.unflatten(-1, (m, b)).unflatten(3, (h, w))  # [2, B, H, h, w, m, b]
    if turn_x.shape[2] == m:  # every block turns with both axes
        cells = torch.einsum("hymij,cbhyxmj->cbhyxmi", turn_y, torch.einsum("hxmij,cbhyxmj->cbhyxmi", turn_x, cells))
    else:  # blocks 0::2 turn with y, 1::2 with x
        by_y, by_x = cells.unflatten(-2, (m // 2, 2)).unbind(-2)  # [2, B, H, h, w, m/2, b] each
        cells = torch.stack((torch.einsum("hymij,cbhyxmj->cbhyxmi", turn_y, by_y),
                             torch.einsum("hxmij,cbhyxmj->cbhyxmi", turn_x, by_x)), -2).flatten(-3, -2)
    q, k = torch.cat((head.flatten(-2), cells.flatten(-2).flatten(3, 4)), 3).unbind(0)
    return q, k


def axis_turns(values: tuple[Tensor, Tensor], gens: tuple[Tensor, Tensor], prefix: Tensor | None = None
               ) -> tuple[Tensor, ...]:
    """``exp(v_c A)`` ``[L, H, n, m, b, b]`` of each axis, for its evenly spaced ``values`` ``[n]`` and generators
    ``[L, H, m, b, b]``, then ``exp(prefix)`` if given: the first and the step of both axes exponentiated in one call
    (whose cost is per call more than per matrix: small products), the rest as the steps' powers, both axes in one
    product per power."""
    blocks = [gen.shape[2] for gen in gens]
    sizes = [value.shape[0] for value in values]
    steps = [value[1] - value[0] if value.shape[0] > 1 else value[0] * 0 for value in values]
    exponents = [value[0] * gen for value, gen in zip(values, gens, strict=True)]
    exponents += [step * gen for step, gen in zip(steps, gens, strict=True)]
    exponents += [] if prefix is None else [prefix]
    exps = expm(torch.cat(exponents, 2)).split([*blocks, *blocks] + ([] if prefix is None else [prefix.shape[2]]), 2)
    first, step = torch.cat(exps[:2], 2), torch.cat(exps[2:4], 2)  # [L, H, m_x + m_y, b, b]
    turns = [first]
    for _ in range(max(sizes) - 1):
        turns.append(turns[-1] @ step)
    table = torch.stack(turns, 2)  # [L, H, n, m_x + m_y, b, b]
    per_axis = tuple(part.narrow(2, 0, size) for part, size in zip(table.split(blocks, 3), sizes, strict=True))
    return per_axis + tuple(exps[4:])


def cell_table(turns: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """``rotate_axes``' rotations ``turns = (prefix, turn_x, turn_y)`` as one table per token, token-major ``[P + h *
    w, H, m, b, b]`` (``project_rotate_paired``'s): ``exp(y A_y) exp(x A_x)`` per block, or (``m_x = m_y = m / 2``,
    ComRoPE-AP) the row's turn for the even blocks and the column's for the odd ones."""
    prefix, turn_x, turn_y = turns
    by_x = turn_x.transpose(0, 1)[None]  # [1, w, H, m_x, b, b]
    by_y = turn_y.transpose(0, 1)[:, None]  # [h, 1, H, m_y, b, b]
    if turn_x.shape[2] == prefix.shape[2]:  # every block turns with both axes
        cells = by_y @ by_x  # [h, w, H, m, b, b]
    else:  # blocks 0::2 turn with y, 1::2 with x
        h, w = turn_y.shape[1], turn_x.shape[1]
        cells = torch.stack((by_y.expand(h, w, -1, -1, -1, -1), by_x.expand(h, w, -1, -1, -1, -1)), -3).flatten(3, 4)
    return torch.cat((prefix.transpose(0, 1), cells.flatten(0, 1)))


class AxisRotations(BlockInput):
    """A block's commuting rotations of an image batch per axis: ``turns`` as ``rotate_axes`` takes them."""

    def __init__(self, turns: tuple[Tensor, Tensor, Tensor]) -> None:
        self.turns = turns

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """From a plain projection, for a batch of ``PAIRED_MIN_BATCH`` images or more: the rotations as one table
        per cell, applied as the projection writes q and k."""
        if not plain_projection(attn, x) or x.shape[0] < PAIRED_MIN_BATCH:  # no batch-size guard under compile
            return None
        return project_rotate_paired(attn, x, cell_table(self.turns))

    def transform(self, attn: nn.Module, x: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k = rotate_axes(q, k, self.turns)
        return q, k, v
