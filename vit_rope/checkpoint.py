"""Loading the weights users already have into vit_rope models.

Three sources are understood, told apart by their keys:

- timm's ports of RoPE-ViT (``vit_*_patch16_rope[_mixed][_ape]_224`` in ``timm/models/eva.py``), the way users bring
  the published ``naver_in1k`` weights (Heo et al., ECCV 2024, arXiv:2403.13298): LayerScale is ``gamma_1/2``
  and the mixed frequencies are one ``rope.freqs`` tensor ``[2, depth, nh, D/2]``;
- the original RoPE-ViT checkpoints (naver-ai/rope-vit ``deit/models_v2_rope.py``): ``freqs`` ``[2, depth, nh*D/2]``
  plus grid buffers;
- plain timm ViT / DeiT-III checkpoints, to fine-tune with RoPE: RoPE frequencies keep their initialisation, a
  missing LayerScale becomes the identity, and the position embedding is dropped or kept (resampled) by variant.

Nothing that depends on the input resolution is loaded: RoPE tables are rebuilt for every input.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from timm.layers import resample_abs_pos_embed, resample_patch_embed
from timm.models import load_state_dict
from torch import Tensor, nn

_CONTAINER_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module")
_DROPPED = re.compile(r"^(freqs_t_[xy]|freqs_cis|rope\.(bands|pos_embed.*|t_[xy]))$")  # resolution-dependent buffers


def _unwrap(state_dict: dict[str, Any]) -> dict[str, Tensor]:
    for key in _CONTAINER_KEYS:
        if isinstance(state_dict.get(key), dict):
            return _unwrap(state_dict[key])
    return {k.removeprefix("module."): v for k, v in state_dict.items()}


def _split_mixed_freqs(freqs: Tensor, model: nn.Module) -> dict[str, Tensor]:
    """``[2, depth, nh, D/2]`` (timm) or ``[2, depth, nh * D/2]`` (RoPE-ViT) -> one ``[2, nh, D/2]`` per block."""
    if not isinstance(getattr(model, "rope", None), nn.ModuleList):
        raise ValueError(
            f"The checkpoint has learned mixed RoPE frequencies {tuple(freqs.shape)}, but the model is not a mixed "
            "RoPE model: load it into a vit_rope_*_mixed* model."
        )
    target = model.rope[0].freqs.shape  # [2, nh, D/2]
    depth = freqs.shape[1]
    if depth != len(model.rope) or freqs[:, 0].numel() != target.numel():
        raise ValueError(
            f"Mixed RoPE frequencies of shape {tuple(freqs.shape)} do not fit a model with depth {len(model.rope)} "
            f"and per-layer frequencies {tuple(target)}: pick the model of the same size as the checkpoint."
        )
    freqs = freqs.reshape(2, depth, *target[1:])
    return {f"rope.{i}.freqs": freqs[:, i].clone() for i in range(depth)}


def _fit_pos_embed(pos_embed: Tensor, model: nn.Module) -> Tensor:
    """Strip the source's prefix rows if the model has none, and resample to the model's grid (bicubic)."""
    grid = model.patch_embed.grid_size
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    src_len = pos_embed.shape[1]
    src_prefix = next(p for p in range(src_len) if math.isqrt(src_len - p) ** 2 == src_len - p)  # square grids
    if src_prefix and not num_prefix:
        pos_embed, src_prefix = pos_embed[:, src_prefix:], 0
    src_side = math.isqrt(pos_embed.shape[1] - src_prefix)
    return resample_abs_pos_embed(
        pos_embed, new_size=grid, old_size=(src_side, src_side), num_prefix_tokens=src_prefix, verbose=False
    )


def convert_state_dict(state_dict: dict[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """Map a timm RoPE-ViT port, an original RoPE-ViT, a timm ViT/DeiT-III or a vit_rope state dict onto ``model``.

    Raises:
        ValueError: the checkpoint does not fit the model; the message lists the missing and unexpected keys.
    """
    state_dict = _unwrap(state_dict)
    target = model.state_dict()
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if _DROPPED.match(key):
            continue
        if key in ("rope.freqs", "freqs"):
            out.update(_split_mixed_freqs(value, model))
            continue
        key = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key)  # EVA / DeiT-III naming of LayerScale
        if key == "pos_embed":
            if getattr(model, "pos_embed", None) is None:
                continue  # RoPE-only model: the absolute embedding is dropped
            value = _fit_pos_embed(value, model)
        elif key == "patch_embed.proj.weight" and value.shape[-2:] != target[key].shape[-2:]:
            value = resample_patch_embed(value, list(target[key].shape[-2:]), verbose=False)
        out[key] = value

    for key, value in target.items():
        if key in out:
            continue
        if re.fullmatch(r"rope\.\d+\.freqs", key):
            out[key] = value  # a checkpoint without RoPE: keep the model's initial frequencies
        elif re.fullmatch(r"blocks\.\d+\.ls[12]\.gamma", key):
            out[key] = torch.ones_like(value)  # no LayerScale in the checkpoint: the identity scale keeps its function

    classifier = ("head.weight", "head.bias")
    missing = sorted(set(target) - set(out) - set(classifier))
    unexpected = sorted(set(out) - set(target))
    if missing or unexpected:
        raise ValueError(
            f"The checkpoint does not fit {type(model).__name__}: missing keys {missing or 'none'}; unexpected keys "
            f"{unexpected or 'none'}. Check that the model name (size, axial/mixed, +APE) matches the checkpoint."
        )
    return out


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """timm ``pretrained_filter_fn``: lets ``create_model(..., pretrained=True)`` take any supported source."""
    return convert_state_dict(state_dict, model)


def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a ``.pth`` / ``.pt`` / ``.bin`` (``torch.load(weights_only=True)``) or ``.safetensors`` file into ``model``.

    The classifier is loaded only when its shape matches, so a 1000-class checkpoint can seed a 10-class model.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    state_dict = convert_state_dict(load_state_dict(str(path), use_ema=True, weights_only=True), model)
    target = model.state_dict()
    for key in ("head.weight", "head.bias"):
        if key in state_dict and key in target and state_dict[key].shape != target[key].shape:
            del state_dict[key]
    model.load_state_dict(state_dict, strict=False)  # convert_state_dict already checked every key but the head
    return model
