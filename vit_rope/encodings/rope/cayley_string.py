"""Cayley-STRING: RoPE after a learned orthogonal change of basis ``P`` of the queries and keys (Schenck, Reid et al.,
"Learning the RoPEs: Better 2D and 3D Position Encodings with STRING", ICML 2025, arXiv:2502.02562).

``P = (I - S)(I + S)^-1`` of a skew-symmetric ``S`` is orthogonal for every ``S``, the same at every position (exact
translation invariance) and ``I`` at ``S = 0``: a fresh model is its base kind (docs/models.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vit_rope.encodings.base import Kept
from vit_rope.layers.attention import BlockInput, RoPEAttention
from vit_rope.layers.fused import fold_qk


def cayley(skew: Tensor) -> Tensor:
    """``P = (I - S)(I + S)^-1`` with ``S = A - A^T``: orthogonal for any ``A``, in fp32 at least (a solve in bf16
    would lose orthogonality)."""
    if skew.dtype != torch.float64:
        skew = skew.float()
    s = skew - skew.transpose(-1, -2)  # exactly skew-symmetric
    eye = torch.eye(s.shape[-1], dtype=s.dtype, device=s.device)
    return torch.linalg.solve(eye + s, eye - s)  # (I + S)^-1 (I - S), which equals (I - S)(I + S)^-1 (they commute)


# FX (torchvision's feature extractor, timm's tracer): recorded as calls, whose shapes and dtypes the trace cannot read
torch.fx.wrap("cayley")


class CayleyString(nn.Module):
    """The learned ``S`` of one attention layer; ``forward`` folds ``P`` into the qkv projection."""

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.skew = nn.Parameter(torch.zeros(num_heads, head_dim, head_dim))  # A, with S = A - A^T; P = I at 0
        self._fold = Kept()  # the last fold in evaluation

    def no_weight_decay(self) -> set[str]:
        """``S``: decay would pull the basis back to the identity, the base kind."""
        return {"skew"}

    def basis(self) -> Tensor:
        return cayley(self.skew)

    def forward(self, weight: Tensor, bias: Tensor | None, cache: bool = False) -> tuple[Tensor, Tensor | None]:
        """The projection folded with ``P``; with ``cache`` and no autograd, the last fold while nothing changed."""
        if cache and not torch.is_grad_enabled():
            return self._fold.get(lambda: fold_qk(self.basis(), weight, bias), weight, bias, self.skew)
        return fold_qk(self.basis(), weight, bias)

    def train(self, mode: bool = True) -> CayleyString:
        """Also drop the evaluation fold when training starts: it would be stale after the first step anyway."""
        if mode:
            self._fold.clear()
        return super().train(mode)

    @torch.no_grad()
    def fold_into_(self, linear: nn.Linear) -> None:
        """Write ``P`` into ``linear`` (the qkv projection) and reset ``S`` to 0: the same function, ``P = I`` after."""
        weight, bias = fold_qk(self.basis(), linear.weight, linear.bias)
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
        self.skew.zero_()
        self._fold.clear()

    def extra_repr(self) -> str:
        return f"num_heads={self.skew.shape[0]}, head_dim={self.skew.shape[-1]}"


class StringTables(BlockInput):
    """One block's RoPE tables under Cayley-STRING: q and k projected with the block's basis folded in, then rotated."""

    def __init__(self, tables: tuple[Tensor, Tensor], cache: bool) -> None:
        self.tables, self.cache = tables, cache

    def project(self, attn: RoPEAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        weight, bias = attn.string(attn.qkv.weight, attn.qkv.bias, self.cache)
        return attn.project_tables(x, self.tables, weight, bias)
