"""Rotary position encodings as one ``PositionEncoding``: the ``RoPE2D`` tables every block rotates q and k by.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) learns mixed frequencies per layer, so a mixed model holds one
``RoPE2D`` per block (keeping its ``<block>.freqs`` state-dict layout); fixed frequencies share one."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import EncodingSpec, LazyBlockInputs, PositionEncoding, Positions, register
from vit_rope.encodings.policies import ResolutionPolicy
from vit_rope.encodings.rope.cayley_string import CayleyString, StringTables
from vit_rope.encodings.rope.tables import KINDS, RoPE2D


class RotaryEncoding(PositionEncoding, nn.ModuleList):
    """One ``RoPE2D`` per block (``per_block``: learned frequencies) or one for all; ``string``: Cayley-STRING."""

    def __init__(self, depth: int, per_block: bool, string: bool = False, **rope_args: Any) -> None:
        # a ModuleList of RoPE2D modules, which hold the kind, grid and policy (``policy`` sets theirs)
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
        # a NaFlex batch on integer positions with unscaled frequencies: a position's tables are the same in every
        # sample, so each token reads those of the batch's bounding grid
        same = positions.lattice is not None and self.kind != "dinov3" and self[0].resolution.name == "extrapolate"
        lattice = positions.lattice() if same else None

        def tables(rope: RoPE2D) -> Any:
            if lattice is not None:
                return rope.lattice_tables(lattice)
            return rope(positions.coords, num_prefix_tokens, positions.grids)

        def block(i: int, shared: Any = None) -> Any:
            block_tables = tables(self[i]) if shared is None else shared
            return StringTables(block_tables, cache=not positions.captured) if self.string else block_tables

        if not self.per_block:
            shared = tables(self[0])
            return [block(0, shared) for _ in range(self.depth)]
        if positions.captured:  # a graph records every block's tables up front
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
            for index in reversed(range(depth, len(self))):
                del self[index]
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
