"""The position encoding of a vit_rope model: which kind, the modules that hold it, and what each block gets.

One concept for every kind the models offer, so that the ViT class (``vit_rope.models.vit``) only runs blocks:

- RoPE (``vit_rope.layers.rope``): ``axial`` and ``golden`` (fixed frequencies, one ``RoPE2D`` for all blocks, its
  tables built once per forward), ``mixed`` (RoPE-ViT, Heo et al. ECCV 2024: learned frequencies, one ``RoPE2D`` per
  block), ``dinov3`` (DINOv3's normalised coordinates);
- ``string`` (Cayley-STRING, Schenck et al. ICML 2025: ``vit_rope.layers.string``): a learned orthogonal basis per
  layer and head, held by each block's attention, over one of the RoPE kinds above;
- attention biases instead of a rotation, ``lookhere`` (Fuller et al. NeurIPS 2024) and ``alibi`` (2D-ALiBi, CROMA,
  NeurIPS 2023): one ``AttnBias`` for all blocks, which caches its tables per grid (``vit_rope.layers.attn_bias``).

Every kind lives at the model's ``rope`` attribute (a module, or a ``ModuleList`` of one per block), the state-dict
keys that checkpoints carry.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.layers.attn_bias import BIAS_KINDS, AttnBias
from vit_rope.layers.naflex import Lattice
from vit_rope.layers.policies import CoordAugment, ResolutionPolicy, augment_positions
from vit_rope.layers.rope import RoPE2D, check_head_dim, check_kind
from vit_rope.layers.string import CayleyString

# RoPE2D's arguments -> the model arguments that set them
ROPE_ARGS = {"theta": "rope_theta", "min_period": "rope_min_period", "max_period": "rope_max_period",
             "normalize": "rope_normalize_coords", "fraction": "rope_fraction", "init": "rope_mixed_init",
             "offset": "rope_grid_offset"}


def check_encoding(rope_kind: str, rope_string_base: str | None, embed_dim: int, num_heads: int) -> str | None:
    """The RoPE kind that builds the tables (``rope_string_base`` under ``string``, ``axial`` if unset), or ``None``
    for a bias kind; raises ``ValueError`` for an unknown kind, a ``rope_string_base`` without ``string``, or a width
    that the kind cannot split into heads and pairs."""
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}.")
    if rope_string_base is not None and rope_kind != "string":
        raise ValueError(f"rope_string_base={rope_string_base!r} names the RoPE under Cayley-STRING "
                         f"(rope_kind='string'); rope_kind={rope_kind!r} would ignore it: leave it unset.")
    if rope_kind in BIAS_KINDS:
        return None
    if rope_kind == "string":
        base_kind = check_kind(rope_string_base or "axial", what="rope_string_base (the RoPE under Cayley-STRING)")
    else:
        base_kind = check_kind(rope_kind, models=True)
    check_head_dim(embed_dim // num_heads)
    return base_kind


def check_no_rope_args(rope_kind: str, ref_grid: tuple[int, int] | None, rope_args: dict[str, Any]) -> None:
    """Raise a ``ValueError`` naming the model arguments that configure RoPE (``rope_args``: ``RoPE2D``'s, away from
    its defaults; ``rope_ref_grid``) given to a model of the attention bias ``rope_kind``, which would ignore them."""
    defaults = inspect.signature(RoPE2D).parameters
    given = [f"{ROPE_ARGS[name]}={value!r}" for name, value in rope_args.items() if value != defaults[name].default]
    given += [f"rope_ref_grid={ref_grid}"] if ref_grid is not None else []
    if given:
        raise ValueError(f"{', '.join(given)} configure RoPE; the {rope_kind} bias has no RoPE and would ignore "
                         "them: leave them unset.")


def policy_kind(model: nn.Module) -> str | None:
    """The kind whose resolution policies apply to ``model`` (``layers.policies.kind_policies``): its RoPE table's
    kind (STRING's base kind for a STRING model), its attention-bias kind, or ``None`` for a model with neither
    (timm's ViTs, CNNs)."""
    return getattr(model, "rope_string_base", None) or getattr(model, "rope_kind", None)


class PositionEncodingMixin:
    """The position-encoding half of ``RoPEVisionTransformer``: built by ``_init_encoding`` after timm's
    ``VisionTransformer.__init__`` (it needs the blocks and the patch grid), then asked once per forward for every
    block's encoding (``_encodings``)."""

    __jit_unused_properties__ = ["rope_policy"]
    # rope_per_block: one RoPE2D per block (mixed) or one for all (fixed frequencies). A constant, so that TorchScript
    # compiles only the branch that applies: its isinstance on RoPE2D takes the type of the first RoPE2D it scripted
    # in the process, so after a mixed model's (a parameter) an axial model's (a buffer) no longer counted as RoPE2D.
    __constants__ = ["rope_per_block"]

    def _init_encoding(self, rope_kind: str, base_kind: str | None, num_heads: int,
                       rope_coord_aug: dict | CoordAugment | None, lh_config: str | dict | None,
                       policy: str | dict | ResolutionPolicy | None, ref_grid: tuple[int, int] | None = None,
                       **rope_args: Any) -> None:
        """Build the encoding of ``rope_kind`` (``base_kind`` from ``check_encoding``); ``rope_args`` are
        ``RoPE2D``'s (theta, periods, normalisation, fraction, init, offset).

        ``ref_grid``: the grid RoPE's policies scale against instead of the patch grid (timm ``Eva``'s
        ``ref_feat_shape``: EVA-02 at 336 px still places its 24x24 patches on the 16x16 grid it was trained on, which
        is the ``interpolate`` policy against ``ref_grid``). The APE keeps resampling from the patch grid."""
        head_dim = self.embed_dim // num_heads
        self.rope_kind = rope_kind
        self.coord_aug = rope_coord_aug if isinstance(rope_coord_aug, CoordAugment) else CoordAugment(
            **(rope_coord_aug or {})
        )
        self.rope_string_base = base_kind if rope_kind == "string" else None
        if rope_kind == "string":  # P = I at creation: the base kind exactly
            if any(blk.attn.num_kv_heads != num_heads for blk in self.blocks):
                raise ValueError("Cayley-STRING (rope_kind='string') folds into [3, nh, D] q/k/v rows; grouped-query "
                                 "attention (num_kv_heads) has fewer: use another rope_kind or leave num_kv_heads "
                                 "unset.")
            for blk in self.blocks:
                blk.attn.string = CayleyString(num_heads, head_dim)
        self.rope_per_block = base_kind == "mixed"  # learned frequencies: one module per block
        train_grid = self.patch_embed.grid_size
        if base_kind is None:
            check_no_rope_args(rope_kind, ref_grid, rope_args)
            self.rope = AttnBias(rope_kind, num_heads, len(self.blocks), train_grid, policy, lh_config)
            return
        if lh_config is not None:
            raise ValueError(f"lh_config sets LookHere (rope_kind='lookhere') and does nothing for {rope_kind!r}.")
        train_grid = train_grid if ref_grid is None else (int(ref_grid[0]), int(ref_grid[1]))
        rope_args.update(head_dim=head_dim, num_heads=num_heads, kind=base_kind, train_grid=train_grid, policy=policy)
        self.rope: nn.Module = (nn.ModuleList(RoPE2D(**rope_args) for _ in self.blocks) if self.rope_per_block
                                else RoPE2D(**rope_args))

    @property
    def rope_policy(self) -> ResolutionPolicy:
        return self.rope_modules()[0].policy

    def set_rope_policy(self, policy: str | dict | ResolutionPolicy | None, **options: Any) -> None:
        """Choose how RoPE follows input sizes other than the training one (see ``vit_rope.layers.policies``); ``None``
        restores the default (``extrapolate``, DINOv3's ``normalized``), as ``rope_policy=None`` at creation.

        Example: ``model.set_rope_policy("yarn", yarn_beta=4.0)``.
        """
        if isinstance(policy, str):
            policy = ResolutionPolicy.create(dict(name=policy, **options))
        elif options:
            raise ValueError(f"Policy options {sorted(options)} go with a policy name, as in "
                             f"set_rope_policy('yarn', yarn_beta=4.0); got the policy {policy!r}.")
        for rope in self.rope_modules():
            rope.policy = policy

    def rope_modules(self) -> list[RoPE2D | AttnBias]:
        """The RoPE2D modules: one shared (axial) or one per block (mixed); or the one ``AttnBias``."""
        return list(self.rope) if self.rope_per_block else [self.rope]

    def __prepare_scriptable__(self) -> PositionEncodingMixin:
        """``torch.jit.script`` calls this first: the bias models keep their tables in a Python cache, which TorchScript
        cannot compile, so they say so rather than fail deep in the compiler."""
        if isinstance(self.rope, AttnBias):
            raise RuntimeError(f"TorchScript does not support the {self.rope_kind} models (their bias tables live in a "
                               "Python cache); export them with vit_rope.export (ONNX) or run them eagerly.")
        return self

    @torch.jit.ignore
    def encoding_no_weight_decay(self) -> set[str]:
        """The mixed frequencies (RoPE-ViT trains them without weight decay) and STRING's ``S``."""
        nwd = {f"rope.{i}.freqs" for i in range(len(self.rope))} if self.rope_per_block else set()
        return nwd | {f"{name}.skew" for name, module in self.named_modules() if isinstance(module, CayleyString)}

    @torch.jit.ignore
    def fold_string_(self) -> None:
        """Write each layer's STRING basis ``P`` into its qkv projection and drop ``S``: the same function, at the
        cost of the base kind with no bookkeeping at all (ONNX export calls it on a copy). Training goes on as the
        base kind."""
        for blk in self.blocks:
            if blk.attn.string is not None:
                blk.attn.string.fold_into_(blk.attn.qkv)
                blk.attn.string = None

    def _positions(self, x: Tensor, keep: Tensor | None, grid: tuple[int, int]) -> Tensor | None:
        """Per-image positions ``[B, N, 2]`` under coordinate augmentation (training) and patch dropout, else
        ``None`` (every image on the plain grid, which ``RoPE2D`` places itself)."""
        augment = self.training and self.coord_aug.active
        if not augment and keep is None:
            return None
        positions = self.rope_modules()[0].grid_positions(*grid, x.device)  # [N, 2]
        if augment:
            positions = augment_positions(positions, x.shape[0], self.coord_aug)  # [B, N, 2], one draw per image
        if keep is not None:
            positions = positions.expand(x.shape[0], -1, -1).gather(1, keep[..., None].expand(-1, -1, 2))  # [B, K, 2]
        return positions

    def _encodings(self, positions: Tensor | None, grid: tuple[int, int] | Tensor, valid: Tensor | None = None,
                   lattice: Lattice | None = None) -> Iterator[dict[str, Any]]:
        """Each block's position encoding, as keyword arguments of ``RoPEBlock``: ``rope`` tables (axial ones built
        once and shared, mixed ones when their block needs them), or an attention ``bias`` and its ``bias_scale``.
        A NaFlex batch (``grid`` ``[B, 2]``) gives per-sample tables, gathered from its ``lattice`` when there is one.

        RoPE tables are not cached between calls: building one costs about 0.1% of a ViT-S forward on CPU
        (``benchmarks/rope_kernel.py``, row ``build_tables``), and a cache would have to follow grad modes
        (tables made under ``inference_mode`` cannot be saved for backward), policies, devices and dtypes, and be
        bounded for servers that see many sizes. A bias table is ``N x N`` per head, which ``AttnBias`` caches for
        plain grids on those keys.
        """
        P = self.num_prefix_tokens
        naflex = isinstance(grid, Tensor)  # a NaFlex batch: one grid per sample
        if isinstance(self.rope, AttnBias):
            tables = self.rope.sample_tables(positions, P, grid, valid) if naflex else self.rope(positions, P, grid)
            # indexed, not iterated: FX records the tables as one call whose items it can index but not unpack
            scales = self.rope.scales
            return ({"bias": tables[i], "bias_scale": scale} if scale else {} for i, scale in enumerate(scales))

        def tables(rope: RoPE2D) -> tuple[Tensor, Tensor]:
            return rope.sample_tables(positions, P, grid, lattice) if naflex else rope(positions, P, grid)

        ropes = map(tables, self.rope) if self.rope_per_block else repeat(tables(self.rope))
        return ({"rope": rope} for rope in ropes)
