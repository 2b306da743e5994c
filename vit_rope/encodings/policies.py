"""Resolution policies and training-time coordinate augmentation for 2D RoPE (docs/models.md), per axis with the scale
``s = new / training`` grid size:

- ``extrapolate``: integer positions, the grid simply grows (RoPE-ViT, Heo et al., ECCV 2024, arXiv:2403.13298);
- ``interpolate``: positions scaled into the training range (EVA-02, Fang et al. 2023; timm's ``ref_feat_shape``);
- ``ntk``: NTK-aware base scaling per axis, ``b' = b * s ** (d / (d - 2))`` (bloc97, 2023);
- ``yarn``: YaRN's (Peng et al. 2023, arXiv:2309.00071) blend with a temperature, its ramp in turns over the image;
- ``normalized``: coordinates in ``2 pi [-1, 1]``: axial RoPE with theta = 100 is then DINOv3's (arXiv:2508.10104).

Also the bias kinds' patch offsets as a policy scales them (``policy_scale``, ``policy_offsets``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from vit_rope.checks import check_choice

POLICIES = ("extrapolate", "interpolate", "ntk", "yarn", "normalized")
# positions without frequencies (attention biases, rotations from learned generators): as they are, or scaled
POSITION_POLICIES = ("extrapolate", "interpolate")


@dataclass(frozen=True)
class ResolutionPolicy:
    """How RoPE positions and frequencies follow the input grid. With ``yarn``, pairs making fewer turns than
    ``yarn_alpha`` across the training grid interpolate, more than ``yarn_beta`` extrapolate (a linear ramp between),
    and ``yarn_temperature`` sharpens attention by ``(0.1 ln s + 1) ** 2``."""

    name: str = "extrapolate"
    yarn_alpha: float = 0.5
    yarn_beta: float = 2.0
    yarn_temperature: bool = True

    def __post_init__(self) -> None:
        check_choice(self.name, POLICIES, "RoPE resolution policy")
        if not 0 <= self.yarn_alpha < self.yarn_beta:
            raise ValueError(f"yarn needs 0 <= yarn_alpha < yarn_beta, got {self.yarn_alpha} and {self.yarn_beta}.")

    @classmethod
    def create(cls, policy: str | dict | ResolutionPolicy) -> ResolutionPolicy:
        """A policy from a name, a dict of the fields (as in a YAML config) or a policy."""
        if isinstance(policy, ResolutionPolicy):
            return policy
        if isinstance(policy, str):
            return cls(policy)
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(policy) - set(valid))
        if unknown:
            raise ValueError(f"Unknown RoPE policy options {unknown}: valid are {valid}.")
        return cls(**policy)


class PolicyChoice:
    """A module's resolution policy (``resolution``, named ``policy_name``), one of ``policies``, the default first;
    setting ``policy`` checks that it applies, ``None`` taking the default."""

    policies: tuple[str, ...] = POLICIES
    kind: str
    resolution: ResolutionPolicy
    # for ``refusal``: what the kind is, and what each policy it takes does for it
    what = "{kind}"
    uses: dict[str, str] = {}

    @property
    def policy(self) -> ResolutionPolicy:
        return self.resolution

    @policy.setter
    def policy(self, policy: str | dict | ResolutionPolicy | None) -> None:
        policy = ResolutionPolicy.create(self.policies[0] if policy is None else policy)
        self.check_policy(policy.name)
        self.resolution = policy

    @property
    def policy_name(self) -> str:
        return self.resolution.name

    def check_policy(self, policy: str) -> str:
        if policy not in self.policies:
            raise ValueError(self.refusal(policy))
        return policy

    def refusal(self, policy: str) -> str:
        others = ", ".join(name for name in POLICIES if name not in self.policies)
        use = (f"{name!r}" + (f" ({self.uses[name]})" if name in self.uses else "") for name in self.policies)
        return (f"Policy {policy!r} does not apply to {self.what.format(kind=self.kind)}: {others} rescale RoPE "
                f"frequencies, which it has none of. Use {' or '.join(use)}.")


def per_sample(values: Tensor, positions: Tensor) -> Tensor:
    """One value per grid ``[1 or B, 2]`` shaped to broadcast against ``positions`` ``[N, 2]`` or ``[B, N, 2]``: one
    route for both, so that a NaFlex sample's positions equal its image's to the bit."""
    return values[0] if positions.dim() == 2 else values[:, None, :]


def grid_sizes(grids: Tensor, train_grid: tuple[int, int] | None) -> tuple[Tensor, Tensor | None]:
    """The sizes (w, h) of ``grids`` ``[1 or B, 2]`` (h, w) and of the training grid (if any), as floats."""
    size = grids.flip(-1).float()  # [1 or B, 2] (w, h)
    return size, None if train_grid is None else size.new_tensor([float(train_grid[1]), float(train_grid[0])])


def place_positions(coord: Tensor, grids: Tensor, kind: str, policy: str, train_grid: tuple[int, int] | None,
                    normalize: str = "separate", offset: float = 0.0) -> Tensor:
    """Positions (x, y) of the patches at ``coord`` (y, x) of ``grids`` as ``policy`` places them for the RoPE
    ``kind``: integer positions shifted by ``offset``, the ``normalized`` policy's, or DINOv3's normalised ones."""
    size, train = grid_sizes(grids, train_grid)
    xy, size = coord.flip(-1).float(), per_sample(size, coord)  # [..., N, 2] (x, y); [2] or [B, 1, 2] (w, h)
    if kind == "dinov3":  # the grid's step, or the training grid's
        reference = size if policy == "normalized" or train is None else train.expand_as(size)
        if normalize != "separate":  # one step for both axes, the shorter or the longer side's
            side = reference.amin(-1, keepdim=True) if normalize == "min" else reference.amax(-1, keepdim=True)
            reference = side.expand_as(reference)
        return (xy + 0.5) / reference * 2.0 - 1.0
    xy = xy + offset
    if policy == "normalized":
        return 2 * math.pi * ((xy + 0.5) / size * 2 - 1)  # cell centres mapped to [-1, 1], as DINOv3
    return xy


def policy_scale(grids: Tensor, train_grid: tuple[int, int] | None, policy: str) -> Tensor | None:
    """What the policy multiplies offsets by per grid: training / input size under ``interpolate``, else None."""
    if policy != "interpolate" or train_grid is None:
        return None
    size, train = grid_sizes(grids, train_grid)
    return train / size


def policy_offsets(grid: tuple[int, int], train_grid: tuple[int, int] | None, policy: str, device: torch.device,
                   dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor | None]:
    """Every key-minus-query offset ``(dx, dy)`` of ``grid`` ``[(2h - 1) (2w - 1), 2]``, in the order of a table
    ``[2h - 1, 2w - 1]`` indexed by ``(dy + h - 1, dx + w - 1)``, as the policy scales them; that scale ``[1, 2]``."""
    h, w = grid
    scale = policy_scale(torch.tensor([grid], device=device), train_grid, policy)
    dy, dx = torch.meshgrid(torch.arange(1 - h, h, device=device), torch.arange(1 - w, w, device=device), indexing="ij")
    offsets = torch.stack((dx, dy), dim=-1).reshape(-1, 2).to(dtype)
    return (offsets if scale is None else offsets * scale[0].to(dtype)), scale


def policy_frequencies(freqs: Tensor, grids: Tensor | None, train_grid: tuple[int, int] | None,
                       policy: ResolutionPolicy, theta: float, head_dim: int) -> tuple[Tensor, Tensor | None]:
    """Frequencies on ``grids`` (``[2, H, D/2]`` unchanged, else ``[1 or B, 2, H, D/2]``) and the temperature (yarn's
    ``[1 or B, 1, 1, 1]``, else ``None``). Scaling a pair's frequency scales its positions, so every policy is a factor
    per axis and pair between ``1 / s`` (interpolate) and 1 (extrapolate), exactly 1 at the training grid."""
    if policy.name in ("extrapolate", "normalized") or grids is None or train_grid is None:
        return freqs, None
    size, train = grid_sizes(grids.to(freqs.device), train_grid)
    scale = (size / train)[:, :, None, None]  # [1 or B, 2, 1, 1] (x, y)
    if policy.name == "interpolate":
        return freqs * (1.0 / scale), None
    scale = scale.clamp(min=1.0)  # ntk and yarn only ever compress, as in language models
    magnitude = freqs.detach().abs().float().clamp(min=1e-12)
    if policy.name == "ntk":
        # axial pair i of an axis with d channels has w = theta ** (-2i / d); b' = b s^(d/(d-2)) scales it by
        # s ** (-2i / (d - 2)). The exponent is written through w so that learned (mixed) frequencies follow too.
        d = head_dim // 2
        exponent = (-torch.log(magnitude) / math.log(theta) * d / (d - 2)).clamp(0.0, 1.0)
        return freqs * scale.pow(-exponent), None
    # yarn: turns of each pair across the training extent (w, h) of each axis
    turns = train[:, None, None] * magnitude / (2 * math.pi)
    keep = ((turns - policy.yarn_alpha) / (policy.yarn_beta - policy.yarn_alpha)).clamp(0.0, 1.0)
    temperature = None
    if policy.yarn_temperature:
        temperature = (0.1 * torch.log(torch.sqrt(scale[:, 0] * scale[:, 1])) + 1.0)[:, None]  # [b, 1, 1, 1]
    return freqs * ((1 - keep) / scale + keep), temperature


@dataclass(frozen=True)
class CoordAugment:
    """Training-time augmentation of patch coordinates (in patch units): DINOv3's uniform ``shift`` per axis, per-axis
    log-uniform ``jitter`` and shared ``rescale`` of the scale, and uniform ``subpixel`` noise per patch (each off at
    its default); ``per_image`` draws per image, else per batch, as DINOv3 and timm's ``RotaryEmbeddingDinoV3`` draw."""

    shift: float = 0.0
    jitter: float = 1.0
    rescale: float = 1.0
    subpixel: float = 0.0
    per_image: bool = True

    def __post_init__(self) -> None:
        if self.shift < 0 or self.subpixel < 0 or self.jitter < 1 or self.rescale < 1:
            raise ValueError(f"Coordinate augmentation needs shift >= 0, subpixel >= 0, jitter >= 1 and rescale >= 1; "
                             f"got {self}.")

    @property
    def active(self) -> bool:
        return self.shift > 0 or self.jitter > 1 or self.rescale > 1 or self.subpixel > 0


def augment_positions(positions: Tensor, batch_size: int, aug: CoordAugment, generator: torch.Generator | None = None
                      ) -> Tensor:
    """Positions with a coordinate transform per image, or one per batch as DINOv3 draws it (its calls, ``(h, w)``)."""
    B, device = batch_size, positions.device
    if not aug.per_image:
        def draw(size: int, bound: float) -> Tensor:
            return torch.empty(size, device=device).uniform_(-bound, bound, generator=generator)

        offset = draw(2, aug.shift) if aug.shift > 0 else torch.zeros(2, device=device)
        scale = draw(2, math.log(aug.jitter)).exp() if aug.jitter > 1 else torch.ones(2, device=device)
        if aug.rescale > 1:
            scale = scale * draw(1, math.log(aug.rescale)).exp()
        positions = (positions + offset.flip(0)) * scale.flip(0)  # [N, 2]: one transform for the batch, (x, y)
        if aug.subpixel > 0:
            noise = torch.rand(B, *positions.shape[-2:], generator=generator, device=device) * 2 - 1
            positions = positions + noise * aug.subpixel  # [B, N, 2]
        return positions

    def uniform(*shape: int, bound: float) -> Tensor:
        return (torch.rand(*shape, generator=generator, device=device) * 2 - 1) * bound

    out = positions.expand(B, *positions.shape[-2:])  # [B, N, 2]
    if aug.shift > 0:
        out = out + uniform(B, 1, 2, bound=aug.shift)
    if aug.jitter > 1:
        out = out * uniform(B, 1, 2, bound=math.log(aug.jitter)).exp()
    if aug.rescale > 1:
        out = out * uniform(B, 1, 1, bound=math.log(aug.rescale)).exp()
    if aug.subpixel > 0:
        out = out + uniform(*out.shape, bound=aug.subpixel)
    return out
