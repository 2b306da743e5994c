"""LieRE's official image classifiers (github.com/StanfordMIMI/LieRE, ``models/rope_vit.py``) as vit_rope models.

A checkpoint is our ``vit_rope_*_patch16_liere_224`` of the arguments its shapes give, at 224 px (``TRAIN_SIZE``);
generators saved per layer reduce to layer 0's, which the official forward turns every block by (docs/models.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import nn

from vit_rope.weights import Converted, Description, Format, renamed_keys

FORMAT_NAME = "LieRE's official RoPEViT"
MARKER = "position_encoder.generator_raw_params"
HEAD_DIM = 64  # FlexibleAttention: "Only support 64 head size for now."
TRAIN_SIZE = 224  # lightning_conf/imagenet_224.yaml: the size the format does not save
# the official keys (after transformer.layers.{i}.) -> ours (after blocks.{i}.)
_LAYER_KEYS = {"0.norm.": "norm1.", "0.fn.to_qkv.": "attn.qkv.", "0.fn.to_out.0.": "attn.proj.", "1.norm.": "norm2.",
               "1.fn.net.0.": "mlp.fc1.", "1.fn.net.3.": "mlp.fc2."}
_TOP_KEYS = {"mlp_head.0.": "norm.", "mlp_head.1.": "head.", "to_patch_embedding.1.": "patch_embed.proj.",
             MARKER: "pos_encoding.generator_raw_params"}


def _plain(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    return {key.removeprefix("model."): value for key, value in state_dict.items()}


def is_liere_checkpoint(state_dict: Any) -> bool:
    return any(key.removeprefix("model.") == MARKER for key in state_dict)


def liere_args(state_dict: Mapping[str, Any]) -> Description:
    """The ``timm.create_model`` arguments of an official checkpoint, from its shapes (the whole architecture)."""
    sd = _plain(state_dict)
    needed = ("cls_token", "to_patch_embedding.1.weight", "transformer.layers.0.1.fn.net.0.weight",
              "mlp_head.1.weight", MARKER)
    missing = [key for key in needed if key not in sd]
    if missing:
        raise ValueError(f"The checkpoint has {MARKER} but lacks {', '.join(missing)}: {FORMAT_NAME}s have all of "
                         f"{', '.join(needed)}. Save the whole model's state_dict.")
    dim = int(sd["cls_token"].shape[-1])
    patch = math.isqrt(int(sd["to_patch_embedding.1.weight"].shape[1]) // 3)
    if 3 * patch * patch != sd["to_patch_embedding.1.weight"].shape[1] or dim % HEAD_DIM:
        raise ValueError(f"The checkpoint's patch embedding takes {sd['to_patch_embedding.1.weight'].shape[1]} "
                         f"values and its width is {dim}: vit_rope builds {FORMAT_NAME}s of square RGB patches "
                         f"(3 p^2 values) and heads of {HEAD_DIM} channels.")
    heads = dim // HEAD_DIM
    depth = 1 + max(int(m[1]) for key in sd if (m := re.match(r"transformer\.layers\.(\d+)\.", key)))
    generators = sd[MARKER]  # [2, L, G, g, g]
    size = generators.shape[-1]
    options = {"generator_dim": int(size), "per_head": int(generators.shape[2]) == heads * (HEAD_DIM // size)}
    hidden = int(sd["transformer.layers.0.1.fn.net.0.weight"].shape[0])
    kwargs = dict(embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim, patch_size=patch,
                  img_size=TRAIN_SIZE, num_classes=int(sd["mlp_head.1.weight"].shape[0]), qkv_bias=False,
                  init_values=0.0,  # no LayerScale (timm.create_model drops arguments that are None)
                  norm_layer=partial(nn.LayerNorm, eps=1e-5), class_token=True, global_pool="token",
                  encoding="liere", encoding_options=options)
    return None, kwargs


def from_liere(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    """An official checkpoint in our keys for the LieRE ``model``, with notes; the caller checks shapes."""
    if getattr(model, "encoding_kind", None) != "liere":
        raise ValueError(f"The checkpoint is {FORMAT_NAME} with LieRE generators; the model has encoding="
                         f"{getattr(model, 'encoding_kind', None)!r}: load it into a vit_rope_*_patch16_liere_224 "
                         "model (create_from_checkpoint builds the one it describes).")
    sd = _plain(state_dict)
    table = sd.pop("pos_embedding", None)
    if table is not None and table.abs().max() > 0:
        raise ValueError(f"The checkpoint's pos_embedding is not zero (max |value| {float(table.abs().max()):.3g}): "
                         "a LieRE model trained with absolute encodings as well, which vit_rope does not build.")
    notes = [f"{FORMAT_NAME}: keys renamed to ours, the linear patch embedding as a convolution"]
    out = renamed_keys(sd, _TOP_KEYS, "transformer.layers.", _LAYER_KEYS)
    patches = out.get("patch_embed.proj.weight")
    if patches is not None:  # [D, p * p * 3], pixels in (p1 p2 c) order -> [D, 3, p, p]
        patch = math.isqrt(patches.shape[1] // 3)
        out["patch_embed.proj.weight"] = patches.view(patches.shape[0], patch, patch, 3).permute(0, 3, 1, 2)
    generators = out.get("pos_encoding.generator_raw_params")
    if generators is not None and generators.shape[1] > 1 and not model.pos_encoding.per_layer:
        out["pos_encoding.generator_raw_params"] = generators[:, :1]
        notes.append("generators per layer reduced to layer 0's, which the official forward turns every block by")
    return out, tuple(notes)


FORMAT = Format(FORMAT_NAME, f"'{MARKER}'", is_liere_checkpoint, from_liere, liere_args)
