"""The model's side of its position encoding, which it knows by no kind's name: ``rope.*`` keys, policies, decay."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import nn

from vit_rope.encodings.base import NoEncoding, PositionEncoding


def encoding_key(key: str) -> str:
    """A checkpoint key in our layout: ``rope.*`` (RoPE-ViT's) becomes ``pos_encoding.*``, also under ``module.``."""
    return re.sub(r"^(module\.)?rope\.", r"\1pos_encoding.", key)


def encoding_keys(state: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """``state`` through ``encoding_key`` if ``model`` (or an EMA's) is ours, not for timm's ports (``rope.freqs``)."""
    ours = isinstance(getattr(getattr(model, "module", model), "pos_encoding", None), PositionEncoding)
    return {encoding_key(key) if ours else key: value for key, value in state.items()}


def resolution_encoding(model: nn.Module) -> PositionEncoding | None:
    """The encoding whose resolution policies apply (other families' ``resolution_rope``), or ``None`` for none."""
    if not isinstance(encoding := getattr(model, "pos_encoding", None), PositionEncoding):  # not a vit_rope ViT
        return getattr(model, "resolution_rope", None)
    return None if isinstance(encoding, NoEncoding) else encoding


def submodule_no_decay(model: nn.Module) -> set[str]:
    """Every parameter a submodule of ``model`` names in its ``no_weight_decay()``, wherever the kind put it."""
    return {f"{path}.{name}" for path, module in model.named_modules() if path and hasattr(module, "no_weight_decay")
            for name in module.no_weight_decay()}


def rename_rope_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A ``load_state_dict`` pre-hook: a checkpoint's encoding under ``rope.`` renamed in place (``encoding_key``)."""
    for key in [key for key in state_dict if key.startswith(prefix + "rope.")]:
        state_dict[prefix + encoding_key(key[len(prefix):])] = state_dict.pop(key)
