"""Commuting block rotations as RoPE in a fixed basis: how ComRoPE runs in evaluation at the cost of RoPE.

ComRoPE (``vit_rope.encodings.generators.comrope``) turns each ``b x b`` block of a head by ``exp(t S)``, with one
skew-symmetric ``S`` per block and ``t = c_x x + c_y y`` a scalar per token (ComRoPE-AP: ``c`` selects the block's axis;
ComRoPE-LD: ``c = theta``). A real skew-symmetric matrix is an orthogonal change of basis away from ``b / 2`` plane
rotations: ``S = Q T Q^T`` with ``T`` the 2x2 blocks ``[[0, -w_k], [w_k, 0]]`` (the real Schur form), so ``exp(t S) = Q
Rot(t w) Q^T``, RoPE's rotation by the angles ``t w_k = (c_x w_k) x + (c_y w_k) y``. As ``Q`` is orthogonal and the same
at every position, ``(R_i q) . (R_j k) = (Rot_i Q^T q) . (Rot_j Q^T k)``: attention sees the same scores when q and k
are projected in the basis ``Q^T`` and rotated by RoPE with those 2D frequencies (mixed RoPE's form, per layer and
head). And ``Q^T q = (Q^T W_q) x + Q^T b_q``: the basis folds into the q and k rows of the qkv projection once
(Cayley-STRING does the same, ``vit_rope.layers.fused.fold_qk``), after which a forward costs what mixed RoPE
costs, in place with the fused rotation, instead of a ``b x b`` product per block, token and head and the copies that
lay q and k out for it.

Only for evaluation: the decomposition has no stable gradient where two ``w_k`` meet, and training moves ``S`` at every
step. ``spectral_form`` computes it in float64 and checks it (``Q`` orthogonal, ``Q T Q^T = S``); where the check
fails (a ``w_k`` of 0 makes the pairing ambiguous) the caller keeps the block rotations. ``Spectral`` is what a block
gets: its rotations, and the RoPE form that attention takes where the basis can fold into its projection.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.layers.attention import BlockInput, plain_projection
from vit_rope.layers.fused import fold_qk

TOLERANCE = 1e-9  # float64 reconstruction error accepted, relative to the largest entry of S


def spectral_form(skew: Tensor, scale: Tensor) -> tuple[Tensor, Tensor] | None:
    """The basis and RoPE frequencies equal to the block rotations ``exp((c_x x + c_y y) S_j)``.

    Args:
        skew: ``[L, H, m, b, b]`` skew-symmetric ``S`` per layer, head and block (``b`` even).
        scale: ``[L or 1, 2, m]`` the axis factors ``(c_x, c_y)`` of each block.

    Returns:
        ``(basis, freqs)``: ``basis`` ``[L, H, D, D]`` the block-diagonal ``Q^T`` of every head (``D = m b``), and
        ``freqs`` ``[L, 2, H, D/2]`` the ``(wx, wy)`` of every channel pair in that basis (``rope_angles``' layout),
        both float32; or ``None`` where ``S`` has a zero eigenvalue pair and the plane pairing is ambiguous.
    """
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


class FoldedProjection:
    """One attention's qkv weights with a basis folded into their q and k rows (``fold_qk``), kept while the basis and
    the weights stay the same (their versions and storage): folded once per grid and weights, not per forward."""

    def __init__(self) -> None:
        self._kept: tuple[Any, ...] | None = None

    def get(self, basis: Tensor, qkv: nn.Linear) -> tuple[Tensor, Tensor | None]:
        weight, bias = qkv.weight, qkv.bias
        key = (weight._version, weight.data_ptr(), None if bias is None else (bias._version, bias.data_ptr()))
        if self._kept is None or self._kept[0] is not basis or self._kept[1] != key:
            self._kept = (basis, key, *fold_qk(basis, weight, bias))  # holds basis: no address reuse
        return self._kept[2], self._kept[3]

    def clear(self) -> None:
        self._kept = None


class Spectral(BlockInput):
    """A block's commuting rotations (``rotations``, the input they have otherwise) with their RoPE form ``basis``
    ``[H, D, D]`` and ``tables()``, its ``cos`` and ``sin`` ``[H, P + N, D/2]`` (built as the block runs, as mixed
    RoPE's are: never every block's at once): in eager inference, where the basis can fold into the projection (no q/k
    norms, a key head per query head, a plain ``nn.Linear`` without hooks), q and k are projected in the basis and
    rotated in place by the tables, at the cost of mixed RoPE; elsewhere the rotations run."""

    def __init__(self, rotations: BlockInput, basis: Tensor, tables: Callable[[], tuple[Tensor, Tensor]],
                 fold: FoldedProjection) -> None:
        self.rotations, self.basis, self.tables, self.fold = rotations, basis, tables, fold

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        if torch.is_grad_enabled() or not plain_projection(attn, x):
            return None
        return attn.project_tables(x, self.tables(), *self.fold.get(self.basis, attn.qkv))

    def transform(self, attn: nn.Module, x: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.rotations.transform(attn, x, q, k, v)
