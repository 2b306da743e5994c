"""Position encodings as additive attention biases: 2D-ALiBi (CROMA, Fuller et al., NeurIPS 2023, arXiv:2311.00566;
ALiBi, Press et al., ICLR 2022) and LookHere (Fuller et al., NeurIPS 2024, arXiv:2405.13985; ``lookhere.py``).

Both are a penalty of the offset times one scale per layer, so an image batch gets one table per offset
(``offset_attention``); the rest build dense ``[1 or B, H, N, N]`` per forward (docs/models.md)."""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.layers import register_notrace_module
from torch import Tensor

from vit_rope.checks import check_choice
from vit_rope.encodings.base import BlockInput, EncodingSpec, GridTables, PositionEncoding, Positions, register
from vit_rope.encodings.bias.lookhere import check_config, head_plan, layer_scales, lookhere_penalty, offset_penalty
from vit_rope.encodings.bias.offset_attention import OffsetBias, pad_prefix, scaled_offsets
from vit_rope.encodings.policies import POSITION_POLICIES, ResolutionPolicy, policy_offsets, policy_scale

BIAS_KINDS = ("lookhere", "alibi")


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes ``[num_heads]`` (Press et al. 2022), as their reference code gives them."""
    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = powers(below) + powers(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


def offset_alibi(offsets: Tensor, slopes: Tensor) -> Tensor:
    """2D-ALiBi penalties ``[..., H, Q, K]``, slope times distance, of key-minus-query offsets ``[..., Q, K, 2]``."""
    dist = offsets.square().sum(-1).sqrt()  # [..., Q, K]
    return slopes.to(dist.device)[:, None, None] * dist[..., None, :, :]


@register_notrace_module
class AttnBias(PositionEncoding):
    """The penalty tables of one bias kind and the scale each block multiplies them by; nothing learned or saved."""

    CACHE_SIZE = 4  # two grids: each its offset tables and the dense matrices built from them
    policies = POSITION_POLICIES
    what = "{kind}, an attention bias"
    uses = {"extrapolate": "positions as they are", "interpolate": "positions scaled to the training grid"}

    def __init__(self, kind: str, num_heads: int, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None,
                 config: str | dict[str, Any] | None = None) -> None:
        super().__init__(check_choice(kind, BIAS_KINDS, "attention bias"), depth, train_grid, policy)
        if kind != "lookhere" and config is not None:
            raise ValueError(f"config sets LookHere (encoding='lookhere') and does nothing for {kind!r}.")
        self.num_heads = num_heads
        self._cache = GridTables(self.CACHE_SIZE)
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows .to(device): the tables' device
        if kind == "lookhere":
            self.config = check_config(config, num_heads, depth)
            specs = self.config["head_directions"]
            self.layer_specs = [specs] * depth if isinstance(specs, str) else list(specs)
            self.scales = layer_scales(self.config, depth)
        else:
            self.config, self.layer_specs, self.scales = None, ["alibi"] * depth, [-1.0] * depth
        plans = [head_plan(spec, num_heads)[0] for spec in self.layer_specs if spec != "alibi"]
        self.by_offset = not any("center" in dirs for plan in plans for dirs in plan)

    def _offset_tables(self, grid: tuple[int, int]) -> dict[str, Tensor]:
        """One table per offset ``[H, 2h - 1, 2w - 1]`` per distinct layer spec."""
        offsets = policy_offsets(grid, self.train_grid, self.policy_name, self.anchor.device)[0][None]  # [1, M, 2]
        cfg, slopes = self.config, alibi_slopes(self.num_heads)
        return {spec: (offset_alibi(offsets, slopes) if spec == "alibi" else
                       offset_penalty(offsets, *head_plan(spec, self.num_heads), cfg["distance"], cfg["fill_with"])
                       ).reshape(-1, 2 * grid[0] - 1, 2 * grid[1] - 1) for spec in dict.fromkeys(self.layer_specs)}

    def _layers(self, positions: Positions, num_prefix_tokens: int) -> list[Tensor]:
        scale = policy_scale(positions.grids, self.train_grid, self.policy_name)
        cfg, slopes, pos = self.config, alibi_slopes(self.num_heads), positions.coords
        tables = {spec: offset_alibi(scaled_offsets(pos, scale), slopes) if spec == "alibi" else
                  lookhere_penalty(pos, *head_plan(spec, self.num_heads), cfg["distance"], cfg["fill_with"],
                                   positions.valid, scale) for spec in dict.fromkeys(self.layer_specs)}
        tables = {spec: pad_prefix(t if t.dim() == 4 else t[None], num_prefix_tokens) for spec, t in tables.items()}
        return [tables[spec] for spec in self.layer_specs]

    def _key(self, grid: tuple[int, int], *extra: Any) -> tuple:
        return (*extra, int(grid[0]), int(grid[1]), str(self.anchor.device), self.policy_name,
                torch.is_inference_mode_enabled())

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> list[Tensor]:
        """Each block's dense penalty ``[1 or B, H, P + N, P + N]``, an image batch's cached per grid."""
        key = self._key(positions.grid, num_prefix_tokens) if positions.image_batch else None
        return self._cache.get(key, lambda: self._layers(positions, num_prefix_tokens))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        grid = positions.grid
        if self.by_offset and positions.image_batch:
            offsets = self._cache.get(self._key(grid, "offsets"), lambda: self._offset_tables(grid))
            dense = self._cache.get(self._key(grid, "dense", num_prefix_tokens), lambda: {spec: {} for spec in offsets})
            return [OffsetBias(offsets[spec], scale, grid, num_prefix_tokens, dense[spec]) if scale else None
                    for spec, scale in zip(self.layer_specs, self.scales, strict=True)]
        tables = self(positions, num_prefix_tokens)
        # indexed, not iterated: FX records the tables as one call whose items it can index but not unpack
        return [BlockInput(bias=tables[i] * scale) if scale else None for i, scale in enumerate(self.scales)]

    def prune_(self, depth: int) -> None:
        self.depth, self.layer_specs, self.scales = depth, self.layer_specs[:depth], self.scales[:depth]
        self._cache.clear()

    def extra_repr(self) -> str:
        config = f", config={self.config}" if self.config else ""
        return f"{super().extra_repr()}, num_heads={self.num_heads}{config}"


@register("alibi")
@register("lookhere", options=("config",))
def _bias(spec: EncodingSpec) -> PositionEncoding:
    return AttnBias(spec.kind, spec.num_heads, spec.depth, spec.train_grid, spec.policy, **spec.options)
