"""2D rotary position embeddings (RoPE) for Vision Transformers: the ``RoPE2D`` module and its kinds' frequencies.

RoFormer (Su et al., 2021, arXiv:2104.09864) rotates each channel pair of q and k by an angle proportional to the
token position; RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) gives pair ``i`` of a patch at ``(x, y)`` the angle
``x * wx_i + y * wy_i``, on interleaved pairs. The kinds differ only in the frequencies ``(wx, wy)``: axial and mixed
RoPE-ViT's, axial's alternate ladder Pixtral's (arXiv:2410.07073); golden: J. Xiong, "On N-dimensional Rotary
Positional Embeddings", 2025, https://jerryxio.ng/posts/nd-rope/; DINOv3's (Simeoni et al. 2025, arXiv:2508.10104)
periods. p-RoPE (Barbero et al., ICLR 2025, arXiv:2410.06205) leaves the slowest pairs unrotated."""

from __future__ import annotations

import math

import torch
from timm.layers import register_notrace_module
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import image_coords
from vit_rope.encodings.policies import POLICIES, PolicyChoice, ResolutionPolicy, place_positions, policy_frequencies
from vit_rope.layers.lattice import Lattice, gather_rows
from vit_rope.layers.rotary import grid_tables, rope_angles, rope_tables

KINDS = ("axial", "mixed", "golden", "dinov3")
DEFAULT_THETA = {"axial": 100.0, "mixed": 10.0, "golden": 100.0, "dinov3": 100.0}
# DINOv3's RoPE: coordinates normalised to the grid (its own) or kept at the training step; nothing else applies
DINOV3_POLICIES = ("normalized", "extrapolate")
NORMALIZE = ("separate", "min", "max")
GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))  # 2 pi / phi^2, about 137.5 degrees
MIXED_INITS = ("rope-vit", "golden")


def check_head_dim(head_dim: int) -> int:
    """``head_dim`` if 2D RoPE can use it: two axes times pairs of channels need ``4 | head_dim``."""
    if head_dim <= 0 or head_dim % 4:
        lower, upper = head_dim - head_dim % 4, head_dim - head_dim % 4 + 4
        raise ValueError(f"2D RoPE needs a head_dim divisible by 4 (pairs of channels for each of the x and y axes), "
                         f"got head_dim={head_dim}. Change embed_dim / num_heads so that head_dim is {lower or 4} or "
                         f"{upper}.")
    return head_dim


def check_fraction(fraction: float) -> float:
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # NaN fails too
        raise ValueError(f"rope_fraction must be in [0, 1] (the share of channel pairs rotated, p-RoPE): got "
                         f"{fraction}. 1 rotates every pair (plain RoPE), 0 none.")
    return fraction


def _magnitudes(head_dim: int, theta: float, step: int = 4) -> Tensor:
    """``theta ** (-step k / head_dim)`` for ``k < head_dim / step``: by default one frequency per pair of each axis."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, step, dtype=torch.float32) / head_dim))


def axial_frequencies(head_dim: int, theta: float = 100.0, alternate: bool = False) -> Tensor:
    """Axial RoPE ``(wx, wy)`` ``[2, 1, D/2]``; ``alternate``: Pixtral's, x and y on alternate rungs."""
    ladder = _magnitudes(check_head_dim(head_dim), theta, 2)  # [D/2]; its even rungs are the default's [D/4]
    return axial_layout(ladder[1::2] if alternate else ladder[0::2], ladder[0::2])


def axial_layout(magnitude: Tensor, magnitude_y: Tensor | None = None) -> Tensor:
    """``(wx, wy)`` ``[2, 1, 2 F]`` of ``F`` magnitudes per axis: x drives the first ``F`` pairs, y the last."""
    zeros = torch.zeros_like(magnitude)
    y = magnitude if magnitude_y is None else magnitude_y
    return torch.stack((torch.cat((magnitude, zeros)), torch.cat((zeros, y))))[:, None, :]


def mixed_frequencies(head_dim: int, num_heads: int, theta: float = 10.0, generator: torch.Generator | None = None
                      ) -> Tensor:
    """RoPE-ViT's initial mixed frequencies ``[2, nh, D/2]``: axial RoPE in a random frame per head."""
    mag = _magnitudes(check_head_dim(head_dim), theta)  # [D/4]
    phi = torch.rand(num_heads, 1, generator=generator) * (2 * math.pi)  # [nh, 1]
    angles = torch.cat((phi.expand(-1, mag.numel()), (phi + math.pi / 2).expand(-1, mag.numel())), dim=-1)
    mag = torch.cat((mag, mag))  # [D/2]
    return torch.stack((mag * torch.cos(angles), mag * torch.sin(angles)))  # [2, nh, D/2]


def golden_frequencies(head_dim: int, num_heads: int, theta: float = 100.0) -> Tensor:
    """Xiong's golden-angle schedule ``[2, nh, D/2]``: pair ``f`` of head ``h`` points at ``(h * D/2 + f) *
    GOLDEN_ANGLE``, the directions continuing from head to head so that the heads differ."""
    pairs = check_head_dim(head_dim) // 2
    mag = theta ** (-torch.arange(pairs, dtype=torch.float64) / (pairs - 1))  # [D/2], log-spaced from 1 to 1/theta
    index = torch.arange(num_heads * pairs, dtype=torch.float64).reshape(num_heads, pairs)  # [nh, D/2]
    angle = torch.remainder(index * GOLDEN_ANGLE, 2 * math.pi)  # fp64 before the sum grows large
    return torch.stack((mag * torch.cos(angle), mag * torch.sin(angle))).float()  # [2, nh, D/2]


def rotated_pairs(freqs: Tensor, fraction: float) -> Tensor:
    """p-RoPE's mask ``[1, H, D/2]``: 1 on each head's ``round(fraction * D/2)`` top ``|w|`` (stable: x, y alike)."""
    magnitude = freqs.detach().float().norm(dim=0)  # [H, D/2]
    keep = round(check_fraction(fraction) * magnitude.shape[-1])
    order = torch.sort(magnitude, dim=-1, descending=True, stable=True).indices[:, :keep]  # [H, keep]
    return torch.zeros_like(magnitude).scatter_(-1, order, 1.0)[None]  # [1, H, D/2]


def dinov3_frequencies(head_dim: int, base: float = 100.0, min_period: float | None = None,
                       max_period: float | None = None) -> Tensor:
    """Frequencies ``2 pi / p_j`` as ``(wx, wy)`` ``[2, 1, D/2]``; the periods together replace ``base``'s."""
    quarter = head_dim // 4
    if (min_period is None) != (max_period is None):
        raise ValueError(f"DINOv3 RoPE needs both min_period and max_period or neither, got {min_period} and "
                         f"{max_period}.")
    if min_period is not None and max_period is not None:
        if not 0 < min_period <= max_period:
            raise ValueError(f"DINOv3 RoPE needs 0 < min_period <= max_period, got {min_period} and {max_period}.")
        periods = min_period * (max_period / min_period) ** torch.linspace(0, 1, quarter, dtype=torch.float32)
    else:
        periods = base ** (2.0 * torch.arange(quarter, dtype=torch.float32) / (head_dim // 2))
    return axial_layout(2 * math.pi / periods)  # [D/4] per axis


def policy_tables(positions: Tensor, frequencies: tuple[Tensor, Tensor | None], num_prefix_tokens: int
                  ) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` of ``positions`` from a policy's frequencies and temperature (``policy_frequencies``)."""
    freqs, temperature = frequencies
    if freqs.dim() == 4 and freqs.shape[0] == 1:  # one grid for the batch: the shared frequencies' cheaper paths
        freqs = freqs[0]
    cos, sin = rope_tables(rope_angles(positions, freqs), num_prefix_tokens)
    if temperature is not None:  # prefix rows too: every logit scales by temperature ** 2
        if cos.dim() == 3:
            temperature = temperature[0]
        cos, sin = cos * temperature, sin * temperature
    return cos, sin


# FX: these branch on shapes (proxies under symbolic tracing), so the trace records each as one call; RoPE2D stays whole
torch.fx.wrap("place_positions")
torch.fx.wrap("policy_frequencies")
torch.fx.wrap("policy_tables")


@register_notrace_module
class RoPE2D(PolicyChoice, nn.Module):
    """One 2D RoPE's frequencies (fixed: a non-persistent buffer, rebuilt on load; mixed: a parameter without weight
    decay) and their tables. The model's ``rope_*`` arguments (docs/models.md); ``fraction`` (p-RoPE) is a fixed mask,
    so unrotated learned pairs get gradient 0; ``grid_offset`` is Perception Encoder's 1 (its class token at 0)."""

    def __init__(self, head_dim: int, num_heads: int, kind: str = "axial", theta: float | None = None,
                 train_grid: tuple[int, int] | None = None, policy: str | dict | ResolutionPolicy | None = None,
                 min_period: float | None = None, max_period: float | None = None, normalize_coords: str = "separate",
                 fraction: float = 1.0, mixed_init: str = "rope-vit", grid_offset: float = 0.0,
                 alternate_axes: bool = False) -> None:
        super().__init__()
        self.kind = check_choice(kind, KINDS, "RoPE kind")
        if alternate_axes and kind != "axial":
            raise ValueError(f"alternate_axes=True puts axial RoPE's x and y on alternate frequencies (Pixtral's); the "
                             f"{kind!r} kind has its own frequencies: use encoding='axial' or leave it False.")
        self.alternate_axes = bool(alternate_axes)
        if kind == "dinov3" and grid_offset:
            raise ValueError(f"grid_offset={grid_offset} shifts integer patch positions; DINOv3's RoPE "
                             "(encoding='dinov3') places patch centres in [-1, 1] itself: leave the offset at 0.")
        self.grid_offset = float(grid_offset)
        if kind != "dinov3" and (min_period is not None or max_period is not None or normalize_coords != "separate"):
            raise ValueError(f"min_period={min_period}, max_period={max_period} and normalize_coords="
                             f"{normalize_coords!r} set DINOv3's RoPE (encoding='dinov3') and do nothing for {kind!r}: "
                             "leave them unset, or use a *_dinov3 model.")
        self.head_dim = check_head_dim(head_dim)
        self.num_heads = num_heads
        self.theta = float(DEFAULT_THETA[kind] if theta is None else theta)
        if not math.isfinite(self.theta) or self.theta <= 0:  # a base <= 0 or NaN would make every output NaN
            raise ValueError(f"RoPE theta (rope_theta) must be a finite number > 0, got {self.theta}. Leave it None "
                             f"for RoPE-ViT's values ({DEFAULT_THETA['axial']:g} axial, {DEFAULT_THETA['mixed']:g} "
                             "mixed).")
        self.train_grid = None if train_grid is None else (int(train_grid[0]), int(train_grid[1]))
        self.normalize_coords = check_choice(normalize_coords, NORMALIZE, "DINOv3 coordinate normalisation")
        self.periods = (min_period, max_period)
        self.policy = policy
        if mixed_init not in MIXED_INITS or (mixed_init != "rope-vit" and kind != "mixed"):
            raise ValueError(f"RoPE mixed_init={mixed_init!r}: mixed frequencies start as one of "
                             f"{', '.join(MIXED_INITS)}; other kinds (here {kind!r}) take the default 'rope-vit' only.")
        self.mixed_init, self.fraction = mixed_init, check_fraction(fraction)
        if kind == "mixed":
            self.freqs = nn.Parameter(self._initial_frequencies())
        else:
            self.register_buffer("freqs", self._initial_frequencies(), persistent=False)
        self.register_buffer("rotated", rotated_pairs(self.freqs, self.fraction), persistent=False)  # [1, H, D/2]

    def _initial_frequencies(self) -> Tensor:
        if self.kind == "dinov3":
            return dinov3_frequencies(self.head_dim, self.theta, *self.periods)
        if self.kind == "golden" or self.mixed_init == "golden":
            return golden_frequencies(self.head_dim, self.num_heads, self.theta)
        if self.kind == "mixed":
            return mixed_frequencies(self.head_dim, self.num_heads, self.theta)
        return axial_frequencies(self.head_dim, self.theta, self.alternate_axes)

    @property
    def policies(self) -> tuple[str, ...]:
        return DINOV3_POLICIES if self.kind == "dinov3" else POLICIES

    def refusal(self, policy: str) -> str:
        return (f"RoPE policy {policy!r} does not apply to DINOv3's RoPE, whose coordinates are normalised to [-1, 1] "
                "at every size (interpolation is built in, and ntk / yarn rescale frequencies against a training grid "
                "of integer positions that it does not have). Use 'normalized' (DINOv3's own) or 'extrapolate' (the "
                "training step between patches, so larger images reach beyond [-1, 1]).")

    @property
    def learnable(self) -> bool:
        return isinstance(self.freqs, nn.Parameter)

    def reset_parameters(self) -> None:
        """Redraw mixed directions (timm's ``init_weights`` calls this); fixed frequencies are rebuilt as they were."""
        with torch.no_grad():
            self.freqs.copy_(self._initial_frequencies())

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        """Positions ``[..., N, 2]`` (x, y) of the patches at ``coord`` (y, x) of ``grids`` ``[1 or B, 2]`` (h, w)."""
        return place_positions(coord, grids, self.kind, self.resolution.name, self.train_grid,
                               self.normalize_coords, self.grid_offset)

    def forward(self, positions: Tensor, num_prefix_tokens: int = 0, grids: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[(B,) H, P + N, D/2]`` of placed ``positions``; ``grids``: what the policy scales by."""
        return policy_tables(positions, self.frequencies(grids), num_prefix_tokens)

    def lattice_tables(self, lattice: Lattice) -> tuple[Tensor, Tensor]:
        """Tables ``[B, H, P + N, D/2]`` of a NaFlex batch on integer coordinates, gathered from its bounding grid's."""
        height, width = lattice.grid
        cells = self.place(*image_coords(height, width, self.rotated.device))  # [h * w, 2] (x, y), row-major
        freqs = self.pair_frequencies()
        if torch.is_grad_enabled() and freqs.requires_grad:  # the direct tables: a backward cheaper than the axes'
            cos, sin = rope_tables(rope_angles(cells, freqs), 1)
        else:  # the first row's x and the first column's y
            cos, sin = grid_tables(cells[:width, 0], cells[::width, 1], freqs, 1)  # [H, 1 + h * w, D/2]
        return gather_rows(cos, lattice.rows), gather_rows(sin, lattice.rows)

    def frequencies(self, grids: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return policy_frequencies(self.pair_frequencies(), grids, self.train_grid, self.resolution, self.theta,
                                  self.head_dim)

    def pair_frequencies(self) -> Tensor:
        """The frequencies ``[2, H, D/2]`` in use: p-RoPE's unrotated pairs at 0."""
        return self.freqs * self.rotated

    def no_weight_decay(self) -> set[str]:
        return {"freqs"} if self.learnable else set()

    def extra_repr(self) -> str:
        return (f"kind={self.kind}, head_dim={self.head_dim}, num_heads={self.num_heads}, theta={self.theta}, "
                f"train_grid={self.train_grid}, policy={self.resolution.name}"
                + (f", fraction={self.fraction}" if self.fraction != 1.0 else "")
                + (f", grid_offset={self.grid_offset}" if self.grid_offset else "")
                + (", alternate_axes=True" if self.alternate_axes else "")
                + (f", mixed_init={self.mixed_init}" if self.learnable else "")
                + (f", normalize_coords={self.normalize_coords}, periods={self.periods}" if self.kind == "dinov3"
                   else ""))

