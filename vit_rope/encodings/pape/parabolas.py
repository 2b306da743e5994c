"""PaPE and PaPE-RI: a content-dependent parabolic attention bias, written into q and k as extra channels.

Koo Øhrstrøm et al., arXiv:2602.01418, 2026; github.com/DTU-PAS/parabolic-position-encoding at 21cb390. A head's
parabolas become 5 channels for any count (PaPE-RI: 3); docs/models.md, "Parabolic biases", has the derivation."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import BlockInput, EncodingSpec, PositionEncoding, Positions, register
from vit_rope.encodings.policies import ResolutionPolicy, per_sample

PAPE_KINDS = ("pape", "pape_ri")

PARABOLAS = 50  # the official default (pape/configs.py, PaPEConfig.parabolas)


def check_parabolas(parabolas: int) -> int:
    if isinstance(parabolas, bool) or not isinstance(parabolas, int) or parabolas < 1:
        raise ValueError(f"parabolas={parabolas!r} must be a whole number of parabolas per head, at least 1 (the "
                         f"paper's default is {PARABOLAS}).")
    return parabolas


def pape_positions(coord: Tensor, grids: Tensor, policy: str, train_grid: tuple[int, int] | None) -> Tensor:
    """The official ``(col + 1, row + 1)``, as they are, divided by the grid or scaled to the training grid."""
    xy = coord.flip(-1).float() + 1.0
    if policy == "extrapolate":
        return xy
    size = per_sample(grids.flip(-1).float(), coord)  # [2] or [B, 1, 2] (w, h)
    if policy == "normalized" or train_grid is None:
        return xy / size
    return xy * xy.new_tensor([float(train_grid[1]), float(train_grid[0])]) / size


class ParabolaLayer(nn.Module):
    """PaPE's and PaPE-RI's layers (official weight names): ``forward`` appends channels to q and k (to a multiple of 4)
    and zero-pads v to that width, as CPU SDPA's flash kernel takes no narrower v; attention cuts the output back."""

    def __init__(self, dim: int, num_heads: int, parabolas: int, width: int) -> None:
        super().__init__()
        self.num_heads, self.parabolas = num_heads, parabolas
        self.pad = -(dim // num_heads + width) % 4  # known here, so that FX traces no shape arithmetic
        self.widen = width + self.pad  # channels q, k and v gain

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The extra channels of q (pieces ``[B, N, nh, *]``) and of k (``[1 or B, N, nh or 1, *]``), in order."""
        raise NotImplementedError

    def forward(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q_extra, k_extra = self.channels(x, positions)
        B, H, N, _ = q.shape
        zero = q.new_zeros(())

        def widen(t: Tensor, extra: list[Tensor], pad: int) -> Tensor:
            pieces = [t.transpose(1, 2), *(e.to(t.dtype).expand(B, N, H, -1) for e in extra)]
            return torch.cat([*pieces, zero.expand(B, N, H, pad)], -1).transpose(1, 2)  # [B, nh, N, D + E]

        return widen(q, q_extra, self.pad), widen(k, k_extra, self.pad), widen(v, [], self.widen)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, parabolas={self.parabolas}"


@register_notrace_module
class PaPELayer(ParabolaLayer):
    """One layer's PaPE: learned directions (``position``) and the projection of each query's coefficients (``ab``)."""

    def __init__(self, dim: int, num_heads: int, parabolas: int = PARABOLAS) -> None:
        super().__init__(dim, num_heads, check_parabolas(parabolas), 5)
        self.position = nn.Linear(2, num_heads * parabolas, bias=False)
        self.ab = nn.Linear(dim, 2 * num_heads * parabolas, bias=False)

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        pos = positions.to(x.dtype)  # [b, N, 2] (x, y)
        p = self.position(pos).unflatten(-1, (self.num_heads, -1))  # [b, N, nh, F]
        ab = self.ab(x).unflatten(-1, (2, self.num_heads, -1))  # [B, N, 2, nh, F]
        a = F.softplus(ab[:, :, 0])
        c = torch.addcmul(-ab[:, :, 1], a, p, value=2)  # [B, N, nh, F] the key position's coefficient
        w = self.position.weight.to(x.dtype).unflatten(0, (self.num_heads, -1))  # [nh, F, 2]
        wx, wy = w.unbind(-1)
        square = torch.stack((wx * wx, 2 * wx * wy, wy * wy), -1)  # [nh, F, 3]: p^2 in x^2, xy, y^2
        q_extra = [torch.einsum("bnhf,hfk->bnhk", a, -square), torch.einsum("bnhf,hfk->bnhk", c, w)]  # [B, N, nh, 3], 2
        px, py = pos.unbind(-1)
        return q_extra, [torch.stack((px * px, px * py, py * py, px, py), -1)[:, :, None]]  # k: [b, N, 1, 5]


@register_notrace_module
class PaPERILayer(ParabolaLayer):
    """One layer's PaPE-RI: a fixed random scale per head (saved, as officially) and each query's curvature."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__(dim, num_heads, 1, 3)
        bound = math.sqrt(1 / 2)  # the official sqrt(1 / num_positions), two coordinates
        self.register_buffer("position_scales", (2 * torch.rand(1, num_heads, 1, 1) - 1) * bound)
        self.a = nn.Linear(dim, num_heads, bias=False)

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        p = positions.to(x.dtype)[:, :, None] * self.position_scales.to(x.dtype).view(1, 1, -1, 1)  # [b, N, nh, 2]
        a = F.softplus(self.a(x))[..., None]  # [B, N, nh, 1]
        return [a, 2 * a * p], [-p.square().sum(-1, keepdim=True), p]


class Parabolas(BlockInput):
    """Every token's position ``[1 or B, P + N, 2]``, from which each block's ``attn.pape`` widens q, k and v."""

    def __init__(self, positions: Tensor) -> None:
        self.positions = positions

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(attn, x)
        layer = getattr(attn, "pape", None)  # None: the layer removed, attention without the parabolas
        return (q, k, v) if layer is None else layer(x, q, k, v, self.positions)


@register_notrace_module
class ParabolicEncoding(PositionEncoding):
    """PaPE or PaPE-RI: every token's official position, handed to each block's ``ParabolaLayer``."""

    policies = ("extrapolate", "interpolate", "normalized")
    what = "{kind}, a parabolic bias"
    uses = {"extrapolate": "positions as they are", "interpolate": "positions scaled to the training grid",
            "normalized": "positions divided by the grid, PaPE's normalize option"}

    def __init__(self, kind: str, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None, parabolas: int | None = None) -> None:
        super().__init__(check_choice(kind, PAPE_KINDS, "parabolic encoding"), depth, train_grid, policy)
        if kind == "pape_ri" and parabolas is not None:
            raise ValueError(f"parabolas={parabolas!r} sets PaPE (encoding='pape'); PaPE-RI has one parabola per "
                             "head, in the Euclidean offset: leave it unset.")
        self.parabolas = None if kind == "pape_ri" else check_parabolas(PARABOLAS if parabolas is None else parabolas)

    def attach_(self, blocks: nn.ModuleList, dim: int, num_heads: int) -> None:
        """Each block's attention gets its own layer (``pape``: the official checkpoints' weights are per layer)."""
        for blk in blocks:
            blk.attn.pape = PaPELayer(dim, num_heads, self.parabolas) if self.parabolas else PaPERILayer(dim, num_heads)

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return pape_positions(coord, grids, self.policy_name, self.train_grid)

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> Tensor:
        """Every token's position ``[1 or B, P + N, 2]``, prefix tokens at the origin."""
        coords = positions.coords.reshape(-1, positions.coords.shape[-2], 2)  # [1 or B, N, 2]
        return F.pad(coords.float(), (0, 0, num_prefix_tokens, 0))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        return [Parabolas(self(positions, num_prefix_tokens))] * self.depth

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", parabolas={self.parabolas}" if self.parabolas else "")


@register("pape_ri")
@register("pape", options=("parabolas",))
def _parabolic(spec: EncodingSpec) -> PositionEncoding:
    return ParabolicEncoding(spec.kind, spec.depth, spec.train_grid, spec.policy, **spec.options)
