"""Position encodings as additive attention biases: LookHere and 2D-ALiBi.

- **2D-ALiBi** (CROMA, Fuller et al., NeurIPS 2023, arXiv:2311.00566): ALiBi's per-head linear penalty (Press et
  al., ICLR 2022) on the Euclidean distance between patches, ``-m_h * |p_k - p_q|``, the same in every layer.
- **LookHere** (Fuller et al., NeurIPS 2024, arXiv:2405.13985): directed masks and distance penalties per head, with
  a slope per layer (``vit_rope.encodings.bias.lookhere``).

Both are a penalty of the offset between two patches times one scale per layer. On an image batch's grid the model
builds one table per offset, ``[H, 2h - 1, 2w - 1]``, and attention reads it without an ``[H, N, N]`` matrix
(``vit_rope.layers.offset_bias``: time and memory grow as attention's); the tables of the last two grids are kept,
keyed by grid, prefix count, device, policy and inference mode. A NaFlex batch,
per-image positions (coordinate augmentation, patch dropout), LookHere's ``center`` heads (a distance to the image's
middle, not an offset) and graph captures (export, FX, torch.compile) build the dense penalties ``[1 or B, H, N, N]``
of the positions per forward. Prefix tokens (class, registers) are neither biased nor penalised: their rows and
columns are 0.

Resolution policies: ``extrapolate`` keeps patch positions as they are (the penalty grows with the image);
``interpolate`` scales them per axis by training / input grid size (neighbours ``1 / s`` apart), so distances
span the training range. ``ntk``, ``yarn`` and
``normalized`` rescale rotation frequencies, which a bias does not have: ``AttnBias.policies`` leaves them out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import Tensor

from vit_rope.checks import check_choice
from vit_rope.encodings.base import BlockInput, EncodingSpec, GridTables, PositionEncoding, Positions, register
from vit_rope.encodings.bias.lookhere import (
    check_config,
    head_plan,
    layer_scales,
    lookhere_penalty,
    offset_penalty,
    scaled_offsets,
)
from vit_rope.encodings.policies import POSITION_POLICIES, ResolutionPolicy
from vit_rope.layers.capture import capturing
from vit_rope.layers.offset_bias import OffsetBias, offset_grid

BIAS_KINDS = ("lookhere", "alibi")


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes (Press et al. 2022): ``2 ** (-8 i / n)`` for a power of two ``n``; otherwise those of the
    power of two below, then every other slope of the power above, as their reference code does. ``[num_heads]``."""
    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = powers(below) + powers(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_penalty(positions: Tensor, slopes: Tensor, scale: Tensor | None = None) -> Tensor:
    """2D-ALiBi penalties ``[..., H, N, N]`` = slope times Euclidean distance, for positions ``[..., N, 2]`` (their
    offsets times ``scale`` ``[1 or B, 2]``, the policy's, if given)."""
    return offset_alibi(scaled_offsets(positions, scale), slopes)


def offset_alibi(offsets: Tensor, slopes: Tensor) -> Tensor:
    """2D-ALiBi penalties ``[..., H, Q, K]`` of key-minus-query offsets ``[..., Q, K, 2]``."""
    dist = offsets.square().sum(-1).sqrt()  # [..., Q, K]
    return slopes.to(dist.device)[:, None, None] * dist[..., None, :, :]


def policy_scale(grids: Tensor, train_grid: tuple[int, int] | None, policy: str) -> Tensor | None:
    """What the policy multiplies offsets by per grid ``grids`` ``[1 or B, 2]`` (h, w): ``[1 or B, 2]`` (x, y)
    training / input grid size under ``interpolate``, ``None`` (as they are) otherwise."""
    if policy != "interpolate" or train_grid is None:
        return None
    return torch.tensor([train_grid[1], train_grid[0]], device=grids.device) / grids.flip(-1).float()


def policy_offsets(grid: tuple[int, int], train_grid: tuple[int, int] | None, policy: str, device: torch.device,
                   dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor | None]:
    """Every key-minus-query offset ``(dx, dy)`` of an image batch's ``h x w`` grid, ``[(2h - 1) (2w - 1), 2]`` in
    ``offset_grid``'s order, as the policy scales it, and that scale ``[1, 2]`` (``policy_scale``; None: as they
    are): what the bias kinds build their tables per offset from."""
    scale = policy_scale(torch.tensor([grid], device=device), train_grid, policy)
    offsets = offset_grid(grid[0], grid[1], device).to(dtype)
    return (offsets if scale is None else offsets * scale[0].to(dtype)), scale


def pad_prefix(table: Tensor, num_prefix_tokens: int) -> Tensor:
    """Zero rows and columns in front for the prefix tokens: ``[..., N, N]`` -> ``[..., P + N, P + N]``."""
    return F.pad(table, (num_prefix_tokens, 0, num_prefix_tokens, 0)) if num_prefix_tokens else table


class Bias(BlockInput):
    """A block's penalty table ``bias`` ``[1 or B, H, P + N, P + N]`` and its scale, added to the logits."""

    def __init__(self, bias: Tensor, scale: float) -> None:
        self.bias, self.bias_scale = bias, scale


@register_notrace_module
class AttnBias(PositionEncoding):
    """The penalty tables of one bias kind and the scale each block multiplies them by; nothing learned, nothing
    saved.

    Args:
        kind: ``"lookhere"`` or ``"alibi"``.
        num_heads: attention heads.
        depth: blocks (LookHere's slopes and directions are per layer).
        train_grid: the ``(h, w)`` training grid, which ``interpolate`` scales against.
        policy: ``extrapolate`` (default) or ``interpolate``.
        config: LookHere's configuration (``vit_rope.encodings.bias.lookhere.check_config``): a preset name or the
            official dict; ``None`` is ``lh180`` (the model's ``encoding_options={"config": ...}``).
    """

    CACHE_SIZE = 4  # two grids: each its offset tables and the dense matrices built from them
    policies = POSITION_POLICIES

    def __init__(self, kind: str, num_heads: int, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None,
                 config: str | dict[str, Any] | None = None) -> None:
        super().__init__()
        check_choice(kind, BIAS_KINDS, "attention bias")
        if kind != "lookhere" and config is not None:
            raise ValueError(f"config sets LookHere (encoding='lookhere') and does nothing for {kind!r}.")
        self.kind, self.num_heads, self.depth = kind, num_heads, depth
        self.train_grid = None if train_grid is None else (int(train_grid[0]), int(train_grid[1]))
        self.policy = policy
        self._cache = GridTables(self.CACHE_SIZE)
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows .to(device): the tables' device
        if kind == "lookhere":
            self.config = check_config(config, num_heads, depth)
            specs = self.config["head_directions"]
            self.layer_specs = [specs] * depth if isinstance(specs, str) else list(specs)
            self.scales = layer_scales(self.config, depth)
        else:
            self.config = None
            self.layer_specs = ["alibi"] * depth
            self.scales = [-1.0] * depth
        plans = [head_plan(spec, num_heads)[0] for spec in self.layer_specs if spec != "alibi"]
        self.by_offset = not any("center" in dirs for plan in plans for dirs in plan)

    def refusal(self, policy: str) -> str:
        return (f"Policy {policy!r} does not apply to {self.kind}, an attention bias: ntk, yarn and normalized "
                "rescale RoPE frequencies, which it has none of. Use 'extrapolate' (positions as they are) or "
                "'interpolate' (positions scaled to the training grid).")

    def _penalties(self, positions: Tensor, valid: Tensor | None, scale: Tensor | None) -> dict[str, Tensor]:
        """One penalty table ``[..., H, N, N]`` per distinct layer spec."""
        out = {}
        for spec in dict.fromkeys(self.layer_specs):
            if spec == "alibi":
                out[spec] = alibi_penalty(positions, alibi_slopes(self.num_heads), scale)
            else:
                cfg = self.config
                out[spec] = lookhere_penalty(positions, *head_plan(spec, self.num_heads), cfg["distance"],
                                             cfg["fill_with"], valid, scale)
        return out

    def _offset_tables(self, grid: tuple[int, int]) -> dict[str, Tensor]:
        """One table per offset ``[H, 2h - 1, 2w - 1]`` per distinct layer spec, for an image batch's grid."""
        h, w = grid
        offsets = policy_offsets(grid, self.train_grid, self.policy_name, self.anchor.device)[0][None]  # [1, M, 2]
        out = {}
        for spec in dict.fromkeys(self.layer_specs):
            if spec == "alibi":
                table = offset_alibi(offsets, alibi_slopes(self.num_heads))
            else:
                cfg = self.config
                table = offset_penalty(offsets, *head_plan(spec, self.num_heads), cfg["distance"], cfg["fill_with"])
            out[spec] = table.reshape(-1, 2 * h - 1, 2 * w - 1)
        return out

    def _layers(self, positions: Positions, num_prefix_tokens: int) -> list[Tensor]:
        scale = policy_scale(positions.grids, self.train_grid, self.policy_name)
        penalties = self._penalties(positions.coords, positions.valid, scale)
        tables = {spec: pad_prefix(t if t.dim() == 4 else t[None], num_prefix_tokens) for spec, t in penalties.items()}
        return [tables[spec] for spec in self.layer_specs]

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> list[Tensor]:
        """Each block's penalty table ``[1 or B, H, P + N, P + N]`` (blocks with the same directions share one);
        an image batch's (one grid, positions shared by the batch) cached per grid."""
        grid = positions.grid
        if grid is None or positions.coords.dim() != 2 or capturing():  # a captured graph serves every size
            return self._layers(positions, num_prefix_tokens)
        key = (int(grid[0]), int(grid[1]), num_prefix_tokens, str(self.anchor.device), self.policy_name,
               torch.is_inference_mode_enabled())
        return self._cache.get(key, lambda: self._layers(positions, num_prefix_tokens))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        grid = positions.grid
        if self.by_offset and grid is not None and not capturing(positions.coords) and positions.coords.dim() == 2:
            key = (int(grid[0]), int(grid[1]), str(self.anchor.device), self.policy_name,
                   torch.is_inference_mode_enabled())
            offsets = self._cache.get(("offsets", *key), lambda: self._offset_tables(grid))
            dense = self._cache.get(("dense", num_prefix_tokens, *key), lambda: {spec: {} for spec in offsets})
            return [OffsetBias(offsets[spec], scale, grid, num_prefix_tokens, dense[spec]) if scale else None
                    for spec, scale in zip(self.layer_specs, self.scales, strict=True)]
        tables = self(positions, num_prefix_tokens)
        # indexed, not iterated: FX records the tables as one call whose items it can index but not unpack
        return [Bias(tables[i], scale) if scale else None for i, scale in enumerate(self.scales)]

    def prune_(self, depth: int) -> None:
        """Keep the first ``depth`` blocks' directions and scales (timm's ``prune_intermediate_layers``)."""
        self.depth, self.layer_specs, self.scales = depth, self.layer_specs[:depth], self.scales[:depth]
        self._cache.clear()

    def extra_repr(self) -> str:
        return (f"kind={self.kind}, num_heads={self.num_heads}, train_grid={self.train_grid}, "
                f"policy={self.policy_name}" + (f", config={self.config}" if self.config else ""))


@register("alibi")
@register("lookhere", options=("config",))
def _bias(spec: EncodingSpec) -> PositionEncoding:
    return AttnBias(spec.kind, spec.num_heads, spec.depth, spec.train_grid, spec.policy, **spec.options)
