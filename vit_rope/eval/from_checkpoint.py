"""One loader for every checkpoint vit_rope reads: ``create_from_checkpoint(path, **overrides)`` builds the model a
file or folder describes and loads it.

What decides the model, format by format (each recognised by its marker, ``vit_rope.models.formats``):

- a ``train.py`` checkpoint: its model name, ``model_kwargs`` and training size (``load_trained``; EMA weights when
  it saved them);
- a transformers DINOv3 folder (``config.json`` + ``model.safetensors``): its config (``hf_dinov3.create_from_hf``);
- PaPE's official folder (``config.json`` + ``model.pt``): its config (``pape_weights.create_from_pape``);
- LookHere's official file: its ``config`` and width (``vit_rope_<size>_patch16_lookhere_224``, ``official=True``);
- LieRE's official ``RoPEViT`` (a Lightning checkpoint or its state dict): its tensors' shapes
  (``liere_weights.liere_args``; the training size, which it does not save, 224 px unless ``img_size`` is given);
- Meta's DINOv3 and timm's DINOv3 files: their width, SwiGLU or not, and qkv bias (``vit_rope_<size>_patch16_dinov3``
  with ``_qkvb`` where the file has q / v biases);
- timm's RoPE-ViT ports and RoPE-ViT's own files (the ``naver_in1k`` weights): their width, learned mixed frequencies
  or not (``_mixed``), and a position embedding or not (``_ape``);
- files whose keys name no model (timm's ViT and DeiT-III, our own state dicts, timm's other Eva families, whose keys
  the families share): ``model=`` names it, and the error says so.

``overrides`` are ``timm.create_model`` arguments (``num_classes``, ``img_size``, ``resolution_policy``, ...) and
``model=`` the vit_rope model to build where the file does not say or to build another that takes its weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
from torch import nn

from vit_rope.eval.loading import is_training_checkpoint, load_trained
from vit_rope.models import hf_dinov3, liere_weights, pape_weights
from vit_rope.models.dinov3 import SIZES as DINOV3_SIZES
from vit_rope.models.dinov3 import architecture, dinov3_name
from vit_rope.models.formats import checkpoint_format
from vit_rope.models.lookhere_weights import is_lookhere_checkpoint, official_file_args
from vit_rope.models.weights_file import mapped_file, read_weights, unwrap_state_dict
from vit_rope.models.widths import width

ROPE_VIT_SIZES = ("tiny", "small", "base", "large")  # vit_rope_<size>_patch16_{axial,mixed}[_ape]_224


def _size(state_dict: Mapping[str, Any], sizes: tuple[str, ...]) -> str | None:
    """The size of ``sizes`` whose width is the file's (its patch embedding's rows), ``None`` for none."""
    weight = state_dict.get("patch_embed.proj.weight")
    widths = {width(size.removesuffix("_plus"))["embed_dim"]: size for size in sizes}
    return None if weight is None else widths.get(int(weight.shape[0]))


def _shape(state_dict: Mapping[str, Any]) -> dict[str, int]:
    """The file's number of blocks and classes (its classifier's rows), as ``depth`` and ``num_classes``."""
    blocks = {int(match.group(1)) for key in state_dict if (match := re.match(r"blocks\.(\d+)\.", key))}
    head = state_dict.get("head.weight")
    return {**({"depth": max(blocks) + 1} if blocks else {}),
            **({"num_classes": int(head.shape[0])} if head is not None else {})}


def _dinov3(state_dict: Mapping[str, Any]) -> str | None:
    swiglu = any(re.search(r"\.mlp\.(w12|w1|fc1_g)\.", key) for key in state_dict)
    size = _size(state_dict, tuple(size for size in DINOV3_SIZES if architecture(size)["swiglu"] == swiglu))
    qkv_bias = any(key.endswith((".attn.q_bias", ".attn.qkv.bias")) for key in state_dict)
    return None if size is None else dinov3_name(size, qkv_bias)


def _rope_vit(state_dict: Mapping[str, Any]) -> str | None:
    """The RoPE-ViT model of timm's ports and RoPE-ViT's own files: mixed by their learned frequencies (one tensor
    ``freqs`` or ``rope.freqs``), +APE by their position embedding; ``None`` for an axial file without one, which a
    plain ViT / DeiT-III file cannot be told from."""
    mixed = any(key in state_dict for key in ("freqs", "rope.freqs"))
    ape = "pos_embed" in state_dict
    size = _size(state_dict, ROPE_VIT_SIZES)
    if size is None or not (mixed or ape):
        return None
    return f"vit_rope_{size}_patch16_{'mixed' if mixed else 'axial'}{'_ape' if ape else ''}_224"


def describe(path: str | Path) -> tuple[str | None, dict[str, Any]]:
    """The model name and arguments (depth, classes, what its format adds) that the weights file ``path`` describes;
    ``None`` for the name where its keys do not say (timm's ViT, DeiT-III, axial RoPE-ViT ports, our own state dicts,
    timm's Eva families, widths of no registered size)."""
    obj = mapped_file(path)
    if obj is None:  # not readable memory-mapped: the full read gives the state dict or says what keeps it from it
        obj = read_weights(path)
    if is_lookhere_checkpoint(obj):
        size = _size(obj["weights"], ROPE_VIT_SIZES)
        name = None if size is None else f"vit_rope_{size}_patch16_lookhere_224"
        return name, {**_shape(obj["weights"]), **official_file_args(path)}
    state_dict = unwrap_state_dict(obj) if isinstance(obj, dict) else {}
    fmt = checkpoint_format(state_dict)
    if fmt.name == liere_weights.FORMAT:  # its shapes say the whole architecture
        return liere_weights.liere_args(state_dict)
    name = None
    if fmt.name == "Meta's DINOv3" or (fmt.name == "timm's Eva" and "reg_token" in state_dict
                                        and "pos_embed" not in state_dict):
        name = _dinov3(state_dict)
    elif fmt.name == "timm's Eva":  # a timm ViT or DeiT-III file has our keys: it cannot be told from ours
        name = _rope_vit(state_dict)
    return name, _shape(state_dict)


def create_from_checkpoint(path: str | Path, model: str | None = None, **overrides: Any) -> nn.Module:
    """The model that ``path`` (a weights file, a ``train.py`` checkpoint or a transformers DINOv3 folder)
    describes, built and loaded; ``model`` names the vit_rope model where the file does not (or another that takes
    its weights), ``overrides`` are ``timm.create_model`` arguments. Weights the file lacks are initialised with a
    warning and listed in ``model.load_report``, as ``vit_rope.load_weights`` does.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file's format is unknown, its keys name no model and ``model`` is not given, or the weights
            do not fit the model; the message names what was found and what to pass.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint at {path}: give a weights file, a train.py checkpoint or a "
                                "transformers DINOv3 folder (config.json + model.safetensors).")
    if pape_weights.pape_config(path) is not None:  # PaPE's official folder (or its model.pt beside config.json)
        if model is None:
            return pape_weights.create_from_pape(path, **overrides)
        path = pape_weights.weights_path(path)  # the weights, into the model named
    elif path.is_dir() or hf_dinov3.hf_config(path) is not None:  # a transformers DINOv3 folder (or its weights)
        if model is None:
            return hf_dinov3.create_from_hf(path, **overrides)
        path = hf_dinov3.weights_path(path)  # the weights, into the model named
    if is_training_checkpoint(path):
        if model is not None or overrides:
            raise ValueError(f"{path} is a train.py checkpoint, which rebuilds its model as it was trained; "
                             f"model= and {sorted(overrides)} do not apply: set a policy after loading "
                             "(model.set_resolution_policy) or fine-tune with train.py --pretrained.")
        return load_trained(path).model
    name, args = describe(path)
    if model is None and name is None:
        raise ValueError(f"The keys of {path} do not say which model it is (timm's ViT or DeiT-III, an axial RoPE-ViT "
                         "port, a vit_rope state dict, one of timm's Eva families, which share their keys, or a width "
                         "of no registered size): pass model= and the arguments that differ, e.g. "
                         "create_from_checkpoint(path, model='vit_rope_small_patch16_axial_224').")
    # the file's class count in the overlay too: timm keeps the file's classifier, or starts a new one (with a
    # warning) where overrides ask for another count
    overlay = dict(file=str(path), custom_load=False, **{k: v for k, v in args.items() if k == "num_classes"})
    return timm.create_model(model or name, pretrained=True, pretrained_cfg_overlay=overlay, **{**args, **overrides})
