"""The position encoding of a vit_rope model: which kinds there are, how each is built, and the model's side of it.

Every kind is a ``PositionEncoding`` (``vit_rope.layers.encoding``), built here from the model's arguments:

- RoPE (``vit_rope.layers.rope``, ``RotaryEncoding``): ``axial`` and ``golden`` (fixed frequencies, one ``RoPE2D``
  for all blocks), ``mixed`` (RoPE-ViT, Heo et al. ECCV 2024: learned frequencies, one ``RoPE2D`` per block),
  ``dinov3`` (DINOv3's normalised coordinates);
- ``string`` (Cayley-STRING, Schenck et al. ICML 2025: ``vit_rope.layers.cayley_string``): a learned orthogonal basis
  per layer and head, held by each block's attention, over one of the RoPE kinds above;
- attention biases instead of a rotation, ``lookhere`` (Fuller et al. NeurIPS 2024) and ``alibi`` (2D-ALiBi, CROMA,
  NeurIPS 2023): one ``AttnBias`` for all blocks, which caches its tables per grid (``vit_rope.layers.attn_bias``);
- rotations from learned generators instead of RoPE's pairs, ``comrope_ap`` and ``comrope_ld`` (ComRoPE, Yu et al. CVPR
  2025: ``vit_rope.layers.comrope``) and ``liere`` (LieRE, Ostmeier et al. ICML 2025: ``vit_rope.layers.liere``),
  with their options in ``encoding_options``;
- ``pape`` and ``pape_ri`` (PaPE, PaPE-RI, Koo Øhrstrøm et al. 2026: ``vit_rope.layers.pape``): a parabolic bias
  that each query's content shapes, written into q and k as extra channels by a layer in each block's attention;
- ``none``: no position encoding (``NoEncoding``), the control of the encodings study.

A rotation lives at the model's ``rope`` attribute (the state-dict keys ``rope.<block>.freqs`` that RoPE-ViT's and
timm's checkpoints carry); any other kind at ``pos_encoding``; ``model.pos_encoding`` names the model's encoding
whatever its kind. A new kind is one ``PositionEncoding`` subclass and one entry of ``BUILDERS``.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vit_rope.layers.attn_bias import BIAS_KINDS, AttnBias
from vit_rope.layers.cayley_string import CayleyString
from vit_rope.layers.comrope import COMROPE_KINDS, ComRoPE
from vit_rope.layers.encoding import NoEncoding, PositionEncoding
from vit_rope.layers.liere import LieRE
from vit_rope.layers.pape import PAPE_KINDS, ParabolicEncoding
from vit_rope.layers.policies import CoordAugment, ResolutionPolicy
from vit_rope.layers.pos_embed import AbsoluteEncoding
from vit_rope.layers.rope import KINDS as ROPE_KINDS
from vit_rope.layers.rope import RoPE2D, check_head_dim, check_kind
from vit_rope.layers.rope_encoding import RotaryEncoding


@dataclass(frozen=True)
class EncodingSpec:
    """What every kind is built from: the model's shape, its training grid, the policy and the kind's options.

    Attributes:
        kind: the encoding (``KINDS``); ``base`` is the RoPE kind that builds the tables (STRING's base kind).
        depth: blocks; num_heads: attention heads; head_dim: channels per head.
        train_grid: the patch grid of training, or ``ref_grid`` where policies scale against another.
        policy: the resolution policy (``None``: the kind's own).
        rope_options: the RoPE options given, ``RoPE2D``'s arguments (each the model's ``rope_*`` argument without
            its prefix): ``{"theta": 1e4}``.
        ref_grid: the model's ``rope_ref_grid`` if given (then ``train_grid``), which only RoPE kinds take.
        lh_config: LookHere's configuration, or ``None``.
        options: the kind's own options (the model's ``encoding_options``), checked by its builder.
    """

    kind: str
    base: str | None
    depth: int
    num_heads: int
    head_dim: int
    train_grid: tuple[int, int]
    policy: str | dict | ResolutionPolicy | None
    rope_options: dict[str, Any]
    ref_grid: tuple[int, int] | None
    lh_config: str | dict | None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


def _options(spec: EncodingSpec, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The kind's ``encoding_options``; refuses names it does not take, saying which it does."""
    unknown = sorted(set(spec.options) - set(allowed))
    if unknown:
        takes = f"takes {', '.join(allowed)}" if allowed else "takes none"
        raise ValueError(f"encoding_options {unknown} do not apply to the {spec.kind} encoding, which {takes}.")
    return dict(spec.options)


def _rotary(spec: EncodingSpec) -> PositionEncoding:
    if spec.lh_config is not None:
        raise ValueError(f"lh_config sets LookHere (encoding='lookhere') and does nothing for {spec.kind!r}.")
    _options(spec, ())
    return RotaryEncoding(spec.depth, spec.base == "mixed", spec.kind == "string", head_dim=spec.head_dim,
                          num_heads=spec.num_heads, kind=spec.base, train_grid=spec.train_grid, policy=spec.policy,
                          **spec.rope_options)


def _no_rope_options(spec: EncodingSpec) -> None:
    """Refuse RoPE options given to a kind without RoPE; a value that is RoPE2D's own default changes nothing."""
    defaults = inspect.signature(RoPE2D).parameters
    given = [f"rope_{name}={value!r}" for name, value in spec.rope_options.items()
             if value != defaults[name].default]
    given = ", ".join(given + ([] if spec.ref_grid is None else [f"rope_ref_grid={spec.ref_grid!r}"]))
    if given:
        raise ValueError(f"{given} configure RoPE; the {spec.kind} encoding has no RoPE and would ignore them: "
                         "leave them unset.")


def _bias(spec: EncodingSpec) -> PositionEncoding:
    _no_rope_options(spec)
    _options(spec, ())
    return AttnBias(spec.kind, spec.num_heads, spec.depth, spec.train_grid, spec.policy, spec.lh_config)


def _none(spec: EncodingSpec) -> PositionEncoding:
    _no_rope_options(spec)
    if spec.lh_config is not None:
        raise ValueError("lh_config sets LookHere (encoding='lookhere') and does nothing without an encoding.")
    _options(spec, ())
    return NoEncoding(spec.depth, spec.train_grid)


def _generated(spec: EncodingSpec) -> PositionEncoding:
    """ComRoPE or LieRE: rotations from learned generators, with their options (``ComRoPE``'s or ``LieRE``'s
    arguments)."""
    _no_rope_options(spec)
    if spec.lh_config is not None:
        raise ValueError(f"lh_config sets LookHere (encoding='lookhere') and does nothing for {spec.kind!r}.")
    if spec.kind == "liere":
        options = _options(spec, ("generator_dim", "per_head", "per_layer"))
        return LieRE(spec.depth, spec.num_heads, spec.head_dim, spec.train_grid, spec.policy, **options)
    options = _options(spec, ("block_size", "init_std", "cls_position"))
    return ComRoPE(spec.kind, spec.depth, spec.num_heads, spec.head_dim, spec.train_grid, spec.policy, **options)


def _parabolic(spec: EncodingSpec) -> PositionEncoding:
    """PaPE or PaPE-RI, with PaPE's ``parabolas`` per head (``encoding_options``)."""
    _no_rope_options(spec)
    if spec.lh_config is not None:
        raise ValueError(f"lh_config sets LookHere (encoding='lookhere') and does nothing for {spec.kind!r}.")
    options = _options(spec, ("parabolas",) if spec.kind == "pape" else ())
    return ParabolicEncoding(spec.kind, spec.depth, spec.train_grid, spec.policy, **options)


# kind -> builder of its PositionEncoding: a new kind is one entry here and its class
BUILDERS: dict[str, Callable[[EncodingSpec], PositionEncoding]] = {
    **dict.fromkeys((*ROPE_KINDS, "string"), _rotary), **dict.fromkeys(BIAS_KINDS, _bias), "none": _none,
    **dict.fromkeys((*COMROPE_KINDS, "liere"), _generated), **dict.fromkeys(PAPE_KINDS, _parabolic),
}
KINDS = tuple(BUILDERS)


def check_encoding(kind: str, rope_string_base: str | None, embed_dim: int, num_heads: int) -> str | None:
    """The RoPE kind that builds the tables (``rope_string_base`` under ``string``, ``axial`` if unset), or ``None``
    for a kind without RoPE; raises ``ValueError`` for an unknown kind, a ``rope_string_base`` without ``string``, or a
    width that the kind cannot split into heads and pairs."""
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}.")
    if rope_string_base is not None and kind != "string":
        raise ValueError(f"rope_string_base={rope_string_base!r} names the RoPE under Cayley-STRING "
                         f"(encoding='string'); encoding={kind!r} would ignore it: leave it unset.")
    if kind not in KINDS:
        raise ValueError(f"Unknown position encoding {kind!r}: choose one of {', '.join(KINDS)}.")
    if BUILDERS[kind] is not _rotary:
        return None
    if kind == "string":
        base = check_kind(rope_string_base or "axial", what="rope_string_base (the RoPE under Cayley-STRING)")
    else:
        base = check_kind(kind)
    check_head_dim(embed_dim // num_heads)
    return base


def renamed(name: str, value: Any, old_name: str, old_value: Any) -> Any:
    """The value of the model argument ``name``, or of its deprecated name ``old_name`` (with a warning), which wins
    when both are given: the registered models give ``name``, and a config written before the rename the old one."""
    if old_value is None:
        return value
    warnings.warn(f"{old_name} is deprecated: use {name} (it names every position encoding, attention biases "
                  "included).", FutureWarning, stacklevel=4)
    return old_value


def resolution_encoding(model: nn.Module) -> PositionEncoding | None:
    """The position encoding of ``model`` whose resolution policies matter (its ``policies``, ``check_policy``), or
    ``None`` for a model that has none to choose: timm's ViTs, CNNs, no encoding."""
    encoding = getattr(model, "pos_encoding", None) if isinstance(model, PositionEncodingMixin) else None
    return None if encoding is None or isinstance(encoding, NoEncoding) else encoding


class PositionEncodingMixin:
    """The position-encoding half of ``RoPEVisionTransformer``: built by ``_init_encoding`` after timm's
    ``VisionTransformer.__init__`` (it needs the blocks and the patch grid)."""

    __jit_unused_properties__ = ["resolution_policy", "rope_policy", "rope_kind"]
    # constants, so that TorchScript compiles only the branch that applies: its isinstance on RoPE2D takes the type of
    # the first RoPE2D it scripted in the process, so after a mixed model's (a parameter) an axial model's (a buffer)
    # no longer counted as RoPE2D
    __constants__ = ["rope_per_block", "rotary"]

    def _init_encoding(self, kind: str, base: str | None, num_heads: int, coord_aug: dict | CoordAugment | None,
                       lh_config: str | dict | None, policy: str | dict | ResolutionPolicy | None,
                       rope_options: dict[str, Any], ref_grid: tuple[int, int] | None = None,
                       options: dict[str, Any] | None = None) -> None:
        """Build the encoding of ``kind`` (``base`` from ``check_encoding``) from the given RoPE options
        (``EncodingSpec.rope_options``).

        ``ref_grid``: the grid the policies scale against instead of the patch grid (timm ``Eva``'s
        ``ref_feat_shape``: EVA-02 at 336 px still places its 24x24 patches on the 16x16 grid it was trained on, which
        is the ``interpolate`` policy against ``ref_grid``). The APE keeps resampling from the patch grid."""
        head_dim = self.embed_dim // num_heads
        self.encoding_kind = kind
        self.coord_aug = coord_aug if isinstance(coord_aug, CoordAugment) else CoordAugment(**(coord_aug or {}))
        self.rope_string_base = base if kind == "string" else None
        train_grid = tuple(self.patch_embed.grid_size) if ref_grid is None else (int(ref_grid[0]), int(ref_grid[1]))
        spec = EncodingSpec(kind, base, len(self.blocks), num_heads, head_dim, train_grid, policy, rope_options,
                            ref_grid, lh_config, dict(options or {}))
        encoding = BUILDERS[kind](spec)
        encoding.attach_(self.blocks, self.embed_dim, num_heads)
        self.rotary = isinstance(encoding, RotaryEncoding)
        self.rope_per_block = self.rotary and encoding.per_block
        if self.rotary:
            self.rope = encoding  # RoPE-ViT's and timm's state-dict keys: rope.<block>.freqs
        else:
            self.pos_encoding = encoding
        # the +APE models' table is timm's pos_embed; what the embedding adds from it is an encoding too
        own = 0 if self.no_embed_class else self.num_prefix_tokens
        self.ape = None if self.pos_embed is None else AbsoluteEncoding(own)

    def __getattr__(self, name: str) -> Any:
        """``pos_encoding`` of a RoPE model is its ``rope``; ``rope`` of a model without RoPE is the deprecated name
        of its ``pos_encoding``."""
        modules = self.__dict__.get("_modules", {})
        if name == "pos_encoding" and "rope" in modules:
            return modules["rope"]
        if name == "rope" and "pos_encoding" in modules:
            warnings.warn("model.rope of a model without RoPE is deprecated: use model.pos_encoding.", FutureWarning,
                          stacklevel=2)
            return modules["pos_encoding"]
        return super().__getattr__(name)

    @property
    def rope_kind(self) -> str:
        """Deprecated name of ``encoding_kind``."""
        warnings.warn("model.rope_kind is deprecated: use model.encoding_kind.", FutureWarning, stacklevel=2)
        return self.encoding_kind

    @property
    def resolution_policy(self) -> ResolutionPolicy:
        return self.pos_encoding.policy

    @property
    def rope_policy(self) -> ResolutionPolicy:
        """Deprecated name of ``resolution_policy``."""
        warnings.warn("model.rope_policy is deprecated: use model.resolution_policy.", FutureWarning, stacklevel=2)
        return self.resolution_policy

    def set_resolution_policy(self, policy: str | dict | ResolutionPolicy | None, **options: Any) -> None:
        """Choose how positions follow input sizes other than the training one (see ``vit_rope.layers.policies``);
        ``None`` restores the default (``extrapolate``, DINOv3's ``normalized``), as ``policy=None`` at creation.

        Example: ``model.set_resolution_policy("yarn", yarn_beta=4.0)``.
        """
        if isinstance(policy, str):
            policy = ResolutionPolicy.create(dict(name=policy, **options))
        elif options:
            raise ValueError(f"Policy options {sorted(options)} go with a policy name, as in "
                             f"set_resolution_policy('yarn', yarn_beta=4.0); got the policy {policy!r}.")
        self.pos_encoding.policy = policy

    def set_rope_policy(self, policy: str | dict | ResolutionPolicy | None, **options: Any) -> None:
        """Deprecated name of ``set_resolution_policy``."""
        warnings.warn("set_rope_policy is deprecated: use set_resolution_policy.", FutureWarning, stacklevel=2)
        self.set_resolution_policy(policy, **options)

    def __prepare_scriptable__(self) -> PositionEncodingMixin:
        """``torch.jit.script`` calls this first: models whose encoding does not script (``scriptable``: Python caches,
        ``BlockInput``) say so rather than fail deep in the compiler."""
        if not self.pos_encoding.scriptable:
            raise RuntimeError(f"TorchScript does not support the {self.encoding_kind} models (the scripted forward "
                               "builds RoPE tables only); export them with vit_rope.export (ONNX) or run them "
                               "eagerly.")
        return self

    @torch.jit.ignore
    def encoding_no_weight_decay(self) -> set[str]:
        """The encoding's (RoPE-ViT trains mixed frequencies without weight decay) and STRING's ``S``."""
        prefix = "rope" if self.rotary else "pos_encoding"
        nwd = {f"{prefix}.{name}" for name in self.pos_encoding.no_weight_decay()}
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
        if self.rotary:
            self.rope.string = False
