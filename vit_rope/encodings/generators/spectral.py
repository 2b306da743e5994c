"""ComRoPE's commuting block rotations as RoPE in a fixed basis: how it runs in evaluation at the cost of mixed RoPE.

The real Schur form ``S = Q T Q^T`` gives ``exp(t S) = Q Rot(t w) Q^T``, the same basis at every position, which folds
into the q and k rows of the projection. Evaluation only: the form has no stable gradient where two ``w_k`` meet."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from vit_rope.encodings.base import Kept
from vit_rope.layers.attention import BlockInput, plain_projection
from vit_rope.layers.fused import fold_qk

TOLERANCE = 1e-9  # float64 reconstruction error accepted, relative to the largest entry of S


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
