"""Rotary position encodings as one ``PositionEncoding``: the ``RoPE2D`` tables every block rotates q and k by.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) learns mixed frequencies per layer, so a mixed model holds one
``RoPE2D`` per block (keeping its ``<block>.freqs`` state-dict layout); fixed frequencies share one.

Cayley-STRING: RoPE after a learned orthogonal change of basis ``P`` of the queries and keys (Schenck, Reid et al.,
"Learning the RoPEs: Better 2D and 3D Position Encodings with STRING", ICML 2025, arXiv:2502.02562): ``P`` (``cayley``)
is the same at every position (exact translation invariance) and ``I`` at first: a fresh model is its base kind."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import EncodingSpec, Kept, LazyBlockInputs, PositionEncoding, Positions, register
from vit_rope.encodings.policies import ResolutionPolicy
from vit_rope.encodings.rope.tables import KINDS, RoPE2D
from vit_rope.layers.attention import BlockInput, RoPEAttention
from vit_rope.layers.fused import fold_qk


def cayley(skew: Tensor) -> Tensor:
    """``P = (I - S)(I + S)^-1``, ``S = A - A^T``: orthogonal for any ``A``, in fp32 at least (bf16 is not)."""
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

    def forward(self, weight: Tensor, bias: Tensor | None, cache: bool = False) -> tuple[Tensor, Tensor | None]:
        """The projection folded with ``P``; with ``cache`` and no autograd, the last fold while nothing changed."""
        if cache and not torch.is_grad_enabled():
            return self._fold.get(lambda: fold_qk(cayley(self.skew), weight, bias), weight, bias, self.skew)
        return fold_qk(cayley(self.skew), weight, bias)

    def train(self, mode: bool = True) -> CayleyString:
        """Also drop the evaluation fold when training starts: it would be stale after the first step anyway."""
        if mode:
            self._fold.clear()
        return super().train(mode)

    @torch.no_grad()
    def fold_into_(self, linear: nn.Linear) -> None:
        """Write ``P`` into ``linear`` (the qkv projection) and reset ``S`` to 0: the same function, ``P = I`` after."""
        weight, bias = fold_qk(cayley(self.skew), linear.weight, linear.bias)
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


class RotaryEncoding(PositionEncoding, nn.ModuleList):
    """One ``RoPE2D`` per block (``per_block``: learned frequencies) or one for all; ``string``: Cayley-STRING."""

    def __init__(self, depth: int, per_block: bool, string: bool = False, **rope_args: Any) -> None:
        nn.ModuleList.__init__(self, (RoPE2D(**rope_args) for _ in range(depth if per_block else 1)))
        self.depth, self.per_block, self.string = depth, per_block, string
        self.kind, self.train_grid = self[0].kind, self[0].train_grid

    @property
    def policy(self) -> ResolutionPolicy:
        return self[0].policy

    @policy.setter
    def policy(self, policy: str | dict | ResolutionPolicy | None) -> None:
        for rope in self:
            rope.policy = policy

    @property
    def policies(self) -> tuple[str, ...]:
        return self[0].policies

    def check_policy(self, policy: str) -> str:
        return self[0].check_policy(policy)

    def attach_(self, blocks: nn.ModuleList, dim: int, num_heads: int) -> None:
        """Under STRING, a basis ``P`` per attention, the identity at creation (the base kind exactly)."""
        if not self.string:
            return
        if any(blk.attn.num_kv_heads != num_heads for blk in blocks):
            raise ValueError("Cayley-STRING (encoding='string') folds into [3, nh, D] q/k/v rows; grouped-query "
                             "attention (num_kv_heads) has fewer: use another encoding or leave num_kv_heads unset.")
        for blk in blocks:
            blk.attn.string = CayleyString(num_heads, dim // num_heads)

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return self[0].place(coord, grids)

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        # NaFlex on integer positions, unscaled frequencies: all samples' tables agree, so read the bounding grid's
        same = positions.lattice is not None and self.kind != "dinov3" and self[0].resolution.name == "extrapolate"
        lattice = positions.lattice() if same else None

        def tables(rope: RoPE2D) -> Any:
            if lattice is not None:
                return rope.lattice_tables(lattice)
            return rope(positions.coords, num_prefix_tokens, positions.grids)

        def block(i: int) -> Any:
            block_tables = tables(self[i]) if self.per_block else shared
            return StringTables(block_tables, cache=not positions.captured) if self.string else block_tables

        shared = None if self.per_block else tables(self[0])
        if not self.per_block or positions.captured:  # shared tables, or a graph that records every block's up front
            return [block(i) for i in range(self.depth)]
        return LazyBlockInputs(block, self.depth)  # each block's tables as the block runs

    def fold_(self, blocks: nn.ModuleList) -> None:
        """Write each block's STRING basis into its qkv projection: the same function at the base kind's cost."""
        if not self.string:
            return
        for blk in blocks:
            blk.attn.string.fold_into_(blk.attn.qkv)
            del blk.attn.string
        self.string = False

    def prune_(self, depth: int) -> None:
        if self.per_block:
            del self[depth:]
        self.depth = depth

    def extra_repr(self) -> str:
        return f"depth={self.depth}, per_block={self.per_block}" + (", string=True" if self.string else "")


@register(*KINDS, "string", rope=True)
def _rotary(spec: EncodingSpec) -> PositionEncoding:
    """RoPE tables, under Cayley-STRING for ``string`` (its base kind ``rope_string_base``, axial if unset)."""
    options = dict(spec.rope_options)
    base = options.pop("string_base", None)
    if spec.kind == "string":
        base = check_choice(base or "axial", KINDS, "rope_string_base (the RoPE under Cayley-STRING)")
    elif base is not None:
        raise ValueError(f"rope_string_base={base!r} names the RoPE under Cayley-STRING (encoding='string'); "
                         f"encoding={spec.kind!r} would ignore it: leave it unset.")
    else:
        base = spec.kind
    return RotaryEncoding(spec.depth, base == "mixed", spec.kind == "string", head_dim=spec.head_dim,
                          num_heads=spec.num_heads, kind=base, train_grid=spec.train_grid, policy=spec.policy,
                          **options)
