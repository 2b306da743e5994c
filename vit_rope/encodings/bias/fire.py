"""FIRE: a learned function of the relative position as an attention bias (Li et al., ICLR 2024, arXiv:2310.04418).

"Analysing extrapolation capabilities of modern position encodings in ViTs" (TMLR submission, 2026, openreview
mEGr7Fm54B) finds it holding best far above the training size; it has no public code, so the 2D form is ours:

    bias_h(q, k) = MLP_l([u(dx, w), u(dy, h)])_h,  u(d, L) = sign(d) psi(|d|) / psi(max(L, tau)),  psi(x) = log(cx + 1)
"""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import Mlp, register_notrace_module
from torch import Tensor, nn

from vit_rope.encodings.base import BlockInput, EncodingSpec, PositionEncoding, Positions, register
from vit_rope.encodings.bias.offset_attention import OffsetBias, pad_prefix, scaled_offsets
from vit_rope.encodings.policies import POSITION_POLICIES, ResolutionPolicy, per_sample, policy_offsets, policy_scale


@register_notrace_module
class Fire(PositionEncoding):
    """Each block's FIRE bias: an MLP ``2 -> hidden -> num_heads`` of normalised offsets, with its ``c`` and ``tau``."""

    policies = POSITION_POLICIES
    what = "FIRE, an attention bias"
    uses = {"extrapolate": "FIRE's own normalisation by the input's grid",
            "interpolate": "offsets and grid scaled to the training grid first"}

    def __init__(self, num_heads: int, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None, hidden: int = 32) -> None:
        super().__init__("fire", depth, train_grid, policy)
        self.num_heads = num_heads
        self.mlps = nn.ModuleList(Mlp(2, hidden, num_heads, act_layer=nn.ReLU) for _ in range(depth))
        self.log_scale = nn.Parameter(torch.ones(depth))  # c of psi(x) = log(c x + 1)
        self.threshold = nn.Parameter(torch.ones(depth))  # tau: grids smaller than it are normalised by it

    def _bias(self, layer: int, offsets: Tensor, extent: Tensor) -> Tensor:
        c, tau = self.log_scale[layer].abs(), self.threshold[layer]
        psi = torch.log1p(c * offsets.abs()) / torch.log1p(c * torch.maximum(extent, tau))
        return self.mlps[layer](offsets.sign() * psi)

    def _extent(self, grids: Tensor, scale: Tensor | None) -> Tensor:
        size = grids.flip(-1).to(self.log_scale.dtype)
        return size if scale is None else size * scale

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> list[Tensor]:
        """Each block's dense bias ``[1 or B, H, P + N, P + N]``."""
        scale = policy_scale(positions.grids, self.train_grid, self.policy_name)
        offsets = scaled_offsets(positions.coords, scale)  # [..., N, N, 2]
        extent = per_sample(self._extent(positions.grids, scale), positions.coords).unsqueeze(-2)
        biases = (self._bias(layer, offsets, extent).movedim(-1, -3) for layer in range(self.depth))  # [..., H, N, N]
        return [pad_prefix(bias if bias.dim() == 4 else bias[None], num_prefix_tokens) for bias in biases]

    def _offset_tables(self, grid: tuple[int, int]) -> list[Tensor]:
        h, w = grid
        offsets, scale = policy_offsets(grid, self.train_grid, self.policy_name, self.log_scale.device,
                                        self.log_scale.dtype)  # [M, 2] (dx, dy)
        extent = self._extent(torch.tensor([[h, w]], device=offsets.device), scale)[0]
        return [self._bias(layer, offsets, extent).T.reshape(-1, 2 * h - 1, 2 * w - 1) for layer in range(self.depth)]

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        grid = positions.grid
        if positions.image_batch:
            return [OffsetBias(table, 1.0, grid, num_prefix_tokens) for table in self._offset_tables(grid)]
        biases = self(positions, num_prefix_tokens)
        return [BlockInput(bias=biases[i]) for i in range(self.depth)]

    def prune_(self, depth: int) -> None:
        self.depth = depth
        self.mlps = self.mlps[:depth]
        self.log_scale = nn.Parameter(self.log_scale.data[:depth])
        self.threshold = nn.Parameter(self.threshold.data[:depth])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_heads={self.num_heads}"


@register("fire", options=("hidden",))
def _fire(spec: EncodingSpec) -> PositionEncoding:
    return Fire(spec.num_heads, spec.depth, spec.train_grid, spec.policy, **spec.options)
