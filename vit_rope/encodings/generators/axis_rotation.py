"""ComRoPE's rotations of an image batch given per axis: ``exp(x A_x + y A_y) = exp(y A_y) exp(x A_x)`` where the
generators commute; on evenly spaced positions ``exp(x_c A) = exp(x_0 A) exp(d A)^c``, a handful of exponentials
instead of one per cell."""

from __future__ import annotations

import torch
from torch import Tensor

from vit_rope.encodings.generators.block_rotation import Rotations, expm


def rotate_axes(q: Tensor, k: Tensor, turns: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """q and k ``[B, H, P + h * w, D]`` of an image batch turned by commuting rotations per axis, ``turns = (prefix,
    turn_x, turn_y)``; every block by both axes, or (ComRoPE-AP) even blocks by y and odd ones by x."""
    prefix, turn_x, turn_y = (t.to(q.dtype) for t in turns)
    P, m, b = prefix.shape[1], prefix.shape[2], prefix.shape[-1]
    h, w = turn_y.shape[1], turn_x.shape[1]
    # split and unbind, not slices or indices, whose backward writes each gradient into zeros of the whole
    head, cells = torch.stack((q, k)).split((P, h * w), 3)  # [2, B, H, P or h * w, D]
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


def axis_turns(values: tuple[Tensor, Tensor], gens: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``exp(v_c A)`` per axis of evenly spaced ``values``: two exponentials, then the step's powers."""
    blocks, sizes = [gen.shape[2] for gen in gens], [value.shape[0] for value in values]
    steps = [value[1] - value[0] if value.shape[0] > 1 else value[0] * 0 for value in values]
    exponents = [value[0] * gen for value, gen in zip(values, gens, strict=True)]
    exponents += [step * gen for step, gen in zip(steps, gens, strict=True)]
    first, step = expm(torch.cat(exponents, 2)).chunk(2, 2)  # [L, H, m_x + m_y, b, b] each
    turns = [first]
    for _ in range(max(sizes) - 1):
        turns.append(turns[-1] @ step)
    table = torch.stack(turns, 2)  # [L, H, n, m_x + m_y, b, b]
    turn_x, turn_y = (part.narrow(2, 0, size) for part, size in zip(table.split(blocks, 3), sizes, strict=True))
    return turn_x, turn_y


class AxisRotations(Rotations):
    def __init__(self, turns: tuple[Tensor, Tensor, Tensor]) -> None:
        self.turns = turns

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return rotate_axes(q, k, self.turns)
