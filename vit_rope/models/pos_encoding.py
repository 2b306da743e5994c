"""The model's side of its position encoding (``vit_rope.encodings``'s builder's): the model knows no kind by name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import nn

from vit_rope.encodings import EncodingSpec, build
from vit_rope.encodings.ape import AbsoluteEncoding
from vit_rope.encodings.base import NoEncoding, PositionEncoding
from vit_rope.encodings.policies import CoordAugment, ResolutionPolicy


def encoding_key(key: str) -> str:
    """A checkpoint key in our layout: ``rope.*`` (RoPE-ViT's) becomes ``pos_encoding.*``, also under ``module.``."""
    return re.sub(r"^(module\.)?rope\.", r"\1pos_encoding.", key)


def encoding_keys(state: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """``state`` through ``encoding_key`` if ``model`` (or an EMA's) is ours, not for timm's ports (``rope.freqs``)."""
    ours = isinstance(getattr(model, "module", model), PositionEncodingMixin)
    return {encoding_key(key) if ours else key: value for key, value in state.items()}


def resolution_encoding(model: nn.Module) -> PositionEncoding | None:
    """The encoding whose resolution policies apply (other families' ``resolution_rope``), or ``None`` for none."""
    if not isinstance(model, PositionEncodingMixin):
        return getattr(model, "resolution_rope", None)
    return None if isinstance(model.pos_encoding, NoEncoding) else model.pos_encoding


class PositionEncodingMixin:
    """``RoPEVisionTransformer``'s encoding, built after timm's ``__init__``: it needs the blocks and patch grid."""

    def _init_encoding(self, kind: str, num_heads: int, coord_aug: dict | CoordAugment | None,
                       policy: str | dict | ResolutionPolicy | None, rope_options: dict[str, Any],
                       ref_grid: tuple[int, int] | None = None, options: dict[str, Any] | None = None,
                       ape_resampling: str = "bicubic") -> None:
        """``ref_grid``: the grid policies scale against, not the patch grid (timm Eva's ``ref_feat_shape``)."""
        self.encoding_kind = kind
        self.coord_aug = coord_aug if isinstance(coord_aug, CoordAugment) else CoordAugment(**(coord_aug or {}))
        train_grid = tuple(self.patch_embed.grid_size) if ref_grid is None else (int(ref_grid[0]), int(ref_grid[1]))
        spec = EncodingSpec(kind, len(self.blocks), num_heads, self.embed_dim // num_heads, train_grid, policy,
                            rope_options, ref_grid, dict(options or {}))
        self.pos_encoding = build(spec)
        self.pos_encoding.attach_(self.blocks, self.embed_dim, num_heads)
        self.register_load_state_dict_pre_hook(_encoding_keys)
        own = 0 if self.no_embed_class else self.num_prefix_tokens
        self.ape = None if self.pos_embed is None else AbsoluteEncoding(own, ape_resampling)  # +APE: timm's pos_embed

    @property
    def resolution_policy(self) -> ResolutionPolicy:
        return self.pos_encoding.policy

    def set_resolution_policy(self, policy: str | dict | ResolutionPolicy | None, **options: Any) -> None:
        """How positions follow other sizes (``policy=`` at creation), e.g. ``("yarn", yarn_beta=4.0)``."""
        if isinstance(policy, str):
            policy = ResolutionPolicy.create(dict(name=policy, **options))
        elif options:
            raise ValueError(f"Policy options {sorted(options)} go with a policy name, as in "
                             f"set_resolution_policy('yarn', yarn_beta=4.0); got the policy {policy!r}.")
        self.pos_encoding.policy = policy

    def fold_encoding_(self) -> None:
        """Fold the encoding into the blocks' weights where that is the same, cheaper function (STRING's into qkv)."""
        self.pos_encoding.fold_(self.blocks)


def submodule_no_decay(model: nn.Module) -> set[str]:
    """Every parameter a submodule of ``model`` names in its ``no_weight_decay()``, wherever the kind put it."""
    return {f"{path}.{name}" for path, module in model.named_modules() if path and hasattr(module, "no_weight_decay")
            for name in module.no_weight_decay()}


def _encoding_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict`` of a checkpoint with the encoding under ``rope.`` (``encoding_key``)."""
    for key in [key for key in state_dict if key.startswith(prefix + "rope.")]:
        state_dict[prefix + encoding_key(key[len(prefix):])] = state_dict.pop(key)
