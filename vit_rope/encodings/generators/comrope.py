"""ComRoPE: RoPE whose rotations come from trainable commuting angle matrices, so attention stays exactly relative.

Yu et al., "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by Trainable Commuting Angle
Matrices", CVPR 2025, arXiv:2506.03737; github.com/Longin-Yu/ComRoPE, ``model.py`` at 7aeef083. ``block_size`` is 8
(``model.py``'s 2 makes AP RoPE with learned frequencies); forms, positions and policies: docs/models.md.

An image batch turns per axis, ``exp(x A_x + y A_y) = exp(y A_y) exp(x A_x)`` as the generators commute; on evenly
spaced positions ``exp(x_c A) = exp(x_0 A) exp(d A)^c``, a handful of exponentials instead of one per cell. In
evaluation the real Schur form ``S = Q T Q^T`` gives ``exp(t S) = Q Rot(t w) Q^T``, the same basis at every position,
which folds into the q and k rows of the projection: RoPE's cost (no stable gradient where two ``w_k`` meet)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import EncodingSpec, GridTables, Kept, PositionEncoding, Positions, register
from vit_rope.encodings.generators.block_rotation import BlockRotation, Rotations, check_block, expm
from vit_rope.encodings.policies import ResolutionPolicy, grid_sizes, per_sample
from vit_rope.layers.attention import BlockInput, plain_projection
from vit_rope.layers.fused import fold_qk
from vit_rope.layers.rotary import rope_angles, rope_tables

COMROPE_KINDS = ("comrope_ap", "comrope_ld")
AP_BLOCKS = slice(1, None, 2), slice(0, None, 2)  # ComRoPE-AP's blocks of x (odd) and of y (even), the official order
TOLERANCE = 1e-9  # the RoPE form's float64 reconstruction error accepted, relative to the largest entry of S


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
    return torch.cat((head.flatten(-2), cells.flatten(-2).flatten(3, 4)), 3).unbind(0)


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
    return tuple(part.narrow(2, 0, size) for part, size in zip(table.split(blocks, 3), sizes, strict=True))


class AxisRotations(Rotations):
    def __init__(self, turns: tuple[Tensor, Tensor, Tensor]) -> None:
        self.turns = turns

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return rotate_axes(q, k, self.turns)


def spectral_form(skew: Tensor, scale: Tensor) -> tuple[Tensor, Tensor] | None:
    """The basis ``[L, H, D, D]`` (the block-diagonal ``Q^T``) and RoPE frequencies ``[L, 2, H, D/2]`` equal to the
    block rotations ``exp((c_x x + c_y y) S_j)``; ``None`` where ``S`` has a zero eigenvalue pair (ambiguous planes)."""
    if skew.is_meta:  # no values to decompose
        return None
    s = skew.double()
    L, H, m, b, _ = s.shape
    # S u = i w u with w >= 0 is (i S) u = -w u: the b/2 smallest eigenvalues of the Hermitian i S, ascending
    eigenvalues, vectors = torch.linalg.eigh(1j * s.to(torch.complex128))
    w, u = -eigenvalues[..., : b // 2], vectors[..., : b // 2]  # [L, H, m, b/2], [L, H, m, b, b/2]
    # u = a + i c gives S c = w a and S a = -w c: the plane (c, a), each of norm 1/sqrt(2), turns by +w
    q = (torch.stack((u.imag, u.real), -1) * math.sqrt(2)).flatten(-2)  # [L, H, m, b, b]: columns c_0, a_0, c_1, ...
    plane = torch.zeros_like(s)
    index = torch.arange(b // 2, device=s.device)
    plane[..., 2 * index + 1, 2 * index] = w
    plane[..., 2 * index, 2 * index + 1] = -w
    eye = torch.eye(b, dtype=s.dtype, device=s.device)
    bound = TOLERANCE * max(1.0, float(s.abs().max()))
    if (q.mT @ q - eye).abs().max() > bound or (q @ plane @ q.mT - s).abs().max() > bound:
        return None
    basis = torch.einsum("lhjac,jk->lhjakc", q.mT, torch.eye(m, dtype=s.dtype, device=s.device))
    freqs = w[:, None] * scale.double()[:, :, None, :, None]  # [L, 2, H, m, b/2]
    return basis.reshape(L, H, m * b, m * b).float(), freqs.flatten(-2).float()


class Spectral(BlockInput):
    """A block's commuting rotations with their RoPE form: in inference, where the basis folds into a plain projection,
    q and k are projected in it and rotated in place; elsewhere the rotations run."""

    def __init__(self, rotations: BlockInput, basis: Tensor, tables: Callable[[], tuple[Tensor, Tensor]],
                 fold: Kept) -> None:
        self.rotations, self.basis, self.tables, self.fold = rotations, basis, tables, fold

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if torch.is_grad_enabled() or not plain_projection(attn):
            return self.rotations.project(attn, x)
        weight, bias = attn.qkv.weight, attn.qkv.bias
        folded = self.fold.get(lambda: fold_qk(self.basis, weight, bias), weight, bias, self.basis)
        return attn.project_tables(x, self.tables(), *folded)


def comrope_positions(coord: Tensor, grids: Tensor, train_grid: tuple[int, int], policy: str) -> Tensor:
    """Patch centres ``(i + 0.5) / n`` (x, y), ``n`` the training grid or (``interpolate``) the input's."""
    size, train = grid_sizes(grids, train_grid)
    reference = size if policy == "interpolate" else train.expand_as(size)
    return (coord.flip(-1).float() + 0.5) / per_sample(reference, coord)


# FX (timm's and torchvision's tracers): recorded as one call, whose branches on shapes the trace cannot take
torch.fx.wrap("comrope_positions")


def _layer_tables(pos: Tensor, freqs: Tensor, identity_rows: int) -> tuple[Tensor, Tensor]:
    return rope_tables(rope_angles(pos, freqs), identity_rows)  # in inference only (``Spectral``), of constants


class ComRoPE(BlockRotation):
    """ComRoPE-AP or -LD angle matrices for every block, in the official layout with layers in front and axes (y, x):
    ``freqs`` ``[L, H, 1, D/b, b, b]`` (``P``) and LD's ``multiplier`` ``[L, 1, 2, D/b, 1, 1]`` (``theta``)."""

    def __init__(self, kind: str, depth: int, num_heads: int, head_dim: int, train_grid: tuple[int, int],
                 policy: str | dict | ResolutionPolicy | None = None, block_size: int = 8, init_std: float = 1.0,
                 cls_position: float | None = 0.5) -> None:
        kind = check_choice(kind, COMROPE_KINDS, "ComRoPE kind")
        super().__init__(kind, depth, train_grid, policy, cls_position, per_layer=True)
        self.block_size = check_block("encoding_options['block_size']", block_size, head_dim)
        num_blocks = head_dim // block_size
        if kind == "comrope_ap" and num_blocks % 2:
            fits = [d for d in range(2, head_dim // 2 + 1) if (head_dim // 2) % d == 0]
            raise ValueError(f"encoding_options['block_size']={block_size} leaves {num_blocks} blocks per head, "
                             f"which ComRoPE-AP cannot split evenly between the two axes: pick one of {fits}.")
        self._spectral = GridTables(self.CACHE_SIZE)
        self._folds = [Kept() for _ in range(depth)]  # each block's projection in the RoPE form's basis
        self.freqs = nn.Parameter(torch.randn(depth, num_heads, 1, num_blocks, block_size, block_size) * init_std)
        if kind == "comrope_ld":
            self.multiplier = nn.Parameter(torch.randn(depth, 1, 2, num_blocks, 1, 1))
        else:
            mask = torch.zeros(2, num_blocks)  # block j turns with axis j mod 2 (y, x)
            mask[0, AP_BLOCKS[1]], mask[1, AP_BLOCKS[0]] = 1.0, 1.0  # rows in the official order (y, x)
            self.register_buffer("axis_mask", mask[:, :, None, None], persistent=False)  # [2, m, 1, 1]

    def generators(self) -> Tensor:
        skew, scale = self.angle_matrices()
        return (skew * scale).flip(2)  # [L, H, 2, m, b, b], axes (y, x) -> (x, y)

    def angle_matrices(self) -> tuple[Tensor, Tensor]:
        """Each block's ``S = P - P^T`` and its factor per axis (y, x): LD's ``theta`` or AP's axis mask."""
        skew = self.freqs - self.freqs.transpose(-1, -2)
        return skew, self.multiplier if self.kind == "comrope_ld" else self.axis_mask

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        """An eager image batch's rotations per axis, with their RoPE form in evaluation."""
        if not positions.image_batch:
            return super().block_inputs(positions, num_prefix_tokens)
        grid = (int(positions.grid[0]), int(positions.grid[1]))
        key = self.cache_key(positions, num_prefix_tokens)
        turns = self._cache.get(None if key is None else (*key, "axes"),
                                lambda: self.axis_tables(positions.coords, num_prefix_tokens, grid))
        inputs = [AxisRotations(layer) for layer in zip(*(t.unbind(0) for t in turns), strict=True)]
        spectral = None if key is None else self._spectral.get(
            key, lambda: self.spectral_tables(positions.coords, num_prefix_tokens))
        if spectral is None:
            return inputs
        return [Spectral(item, *layer, fold) for item, layer, fold in zip(inputs, spectral, self._folds, strict=True)]

    def axis_tables(self, coords: Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> tuple[Tensor, ...]:
        """``rotate_axes``' tables: the prefix's, each column's and each row's."""
        gens = self.generators().float()  # [L, H, 2, m, b, b]
        cells = coords.float().view(*grid, 2)
        x_blocks, y_blocks = AP_BLOCKS if self.kind == "comrope_ap" else (slice(None), slice(None))
        turns = axis_turns((cells[0, :, 0], cells[:, 0, 1]), (gens[:, :, 0, x_blocks], gens[:, :, 1, y_blocks]))
        return self.prefix_tables(gens, num_prefix_tokens), *turns

    def spectral_tables(self, coords: Tensor, num_prefix_tokens: int) -> list[tuple[Tensor, Callable]] | None:
        """Per block, the basis and the maker of RoPE tables equal to its rotations; ``None`` where ambiguous."""
        with torch.no_grad():
            skew, scale = self.angle_matrices()
            scale = scale.reshape(-1, 2, skew.shape[3])  # [L or 1, 2, m]
            form = spectral_form(skew[:, :, 0], scale.flip(1))  # axes (y, x) -> (x, y)
            if form is None:
                return None
            basis, freqs = form
            pos, identity_rows = coords.float(), num_prefix_tokens
            if num_prefix_tokens and self.prefix_position is not None:  # prefix tokens turned at their position
                pos = torch.cat((pos.new_full((num_prefix_tokens, 2), self.prefix_position), pos))
                identity_rows = 0
        freqs = freqs.to(pos.device)  # [L, 2, H, D/2]
        return [(layer_basis, partial(_layer_tables, pos, freqs[i], identity_rows))
                for i, layer_basis in enumerate(basis.to(pos.device).unbind(0))]

    def clear_(self) -> None:
        super().clear_()
        self._spectral.clear()
        for fold in self._folds:
            fold.clear()

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return comrope_positions(coord, grids, self.train_grid, self.policy_name)

    def prune_(self, depth: int) -> None:
        self.freqs = nn.Parameter(self.freqs.data[:depth])
        if self.kind == "comrope_ld":
            self.multiplier = nn.Parameter(self.multiplier.data[:depth])
        self.depth, self._folds = depth, self._folds[:depth]
        self.clear_()

    def no_weight_decay(self) -> set[str]:
        """Weight decay would shrink the angle matrices towards no rotation at all (as for RoPE-ViT's frequencies)."""
        return {"freqs", "multiplier"} if self.kind == "comrope_ld" else {"freqs"}

    def extra_repr(self) -> str:
        _, H, _, m, b, _ = self.freqs.shape
        return f"{super().extra_repr()}, num_heads={H}, blocks={m}x{b}, cls_position={self.prefix_position}"


@register(*COMROPE_KINDS, options=("block_size", "init_std", "cls_position"))
def _comrope(spec: EncodingSpec) -> PositionEncoding:
    return ComRoPE(spec.kind, spec.depth, spec.num_heads, spec.head_dim, spec.train_grid, spec.policy, **spec.options)
