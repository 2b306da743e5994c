"""LieRE: rotations ``exp(p_x A_x + p_y A_y)`` from learned skew-symmetric generators that need not commute.

Ostmeier et al., ICML 2025, arXiv:2406.10322; github.com/StanfordMIMI/LieRE at b27b41ba. One set for every block by
default: the official forward turns every block by layer 0's, so the checkpoints were trained that way."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vit_rope.encodings.base import EncodingSpec, PositionEncoding, register
from vit_rope.encodings.generators.block_rotation import BlockRotation, check_block
from vit_rope.encodings.policies import ResolutionPolicy, grid_sizes, per_sample


def liere_positions(coord: Tensor, grids: Tensor, train_grid: tuple[int, int], policy: str) -> Tensor:
    """``i / (m - 1)`` (x, y) on an ``m``-patch axis, under ``extrapolate`` (the official) times ``m / n``."""
    size, train = grid_sizes(grids, train_grid)
    return coord.flip(-1).float() / per_sample((size - 1).clamp_min(1) * (1.0 if policy == "interpolate" else
                                                                           train / size), coord)


# FX (timm's and torchvision's tracers): recorded as one call, whose branches on shapes the trace cannot take
torch.fx.wrap("liere_positions")


class LieRE(BlockRotation):
    """LieRE's generators: ``generator_raw_params`` ``[2, L, G, g, g]`` as officially (axes (y, x), ``L`` 1 or depth,
    ``G = heads * D / g`` head-major, or ``D / g``), upper triangle used."""

    def __init__(self, depth: int, num_heads: int, head_dim: int, train_grid: tuple[int, int],
                 policy: str | dict | ResolutionPolicy | None = None, generator_dim: int = 8, per_head: bool = True,
                 per_layer: bool = False) -> None:
        super().__init__("liere", depth, train_grid, policy, None, per_layer)
        self.generator_dim = check_block("encoding_options['generator_dim']", generator_dim, head_dim)
        self.heads = num_heads if per_head else 1
        count = self.heads * (head_dim // generator_dim)
        self.generator_raw_params = nn.Parameter(
            torch.rand(2, depth if per_layer else 1, count, generator_dim, generator_dim) * 2 * math.pi)

    def generators(self) -> Tensor:
        upper = torch.triu(self.generator_raw_params, diagonal=1)  # [2, L, G, g, g]
        skew = (upper - upper.transpose(-1, -2)).unflatten(2, (self.heads, -1))  # [2, L, H or 1, m, g, g]
        return skew.permute(1, 2, 0, 3, 4, 5).flip(2)  # [L, H or 1, 2, m, g, g], axes (y, x) -> (x, y)

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return liere_positions(coord, grids, self.train_grid, self.policy_name)

    def prune_(self, depth: int) -> None:
        if self.per_layer:
            self.generator_raw_params = nn.Parameter(self.generator_raw_params.data[:, :depth])
        self.depth = depth
        self.clear_()

    def no_weight_decay(self) -> set[str]:
        """Weight decay would pull the generators towards no rotation at all."""
        return {"generator_raw_params"}

    def extra_repr(self) -> str:
        _, _, G, g, _ = self.generator_raw_params.shape
        return f"{super().extra_repr()}, heads={self.heads}, generators={G}x{g}x{g}, per_layer={self.per_layer}"


@register("liere", options=("generator_dim", "per_head", "per_layer"))
def _liere(spec: EncodingSpec) -> PositionEncoding:
    return LieRE(spec.depth, spec.num_heads, spec.head_dim, spec.train_grid, spec.policy, **spec.options)
