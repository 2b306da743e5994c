"""Gemma 4's vision tower as transformers saves it (``Gemma4VisionModel`` folders, or whole Gemma 4s), without
transformers: timm's weights (``gemma4_vit``) under transformers' names, patch projection columns in (y, x, channel)
order as its image processor flattens a patch; ``check_hf_config`` checks what the weights cannot show."""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

from torch import Tensor, nn

from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models.gemma4_vit import ARCH, ClippedLinear, Gemma4VisionTransformer, describe_gemma4, from_gemma4
from vit_rope.weights import Converted, Description, check_config_fields

HF_FORMAT = "Hugging Face transformers' Gemma4VisionModel"
MODEL_TYPES = ("gemma4_vision", "gemma4")  # the tower alone; the whole model, whose vision_config is the tower's
_DEFAULTS: dict[str, Any] = dict(  # Gemma4VisionConfig's (transformers 5.24), which config.json may leave out
    hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
    head_dim=64, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, attention_bias=False,
    rope_parameters=None, pooling_kernel_size=3, patch_size=16, position_embedding_size=10240,
    use_clipped_linears=False, standardize=False)
_TOWER = re.compile(r"^(?:model\.)?vision_(?:tower|model)\.")
_NAMES = (("patch_embedder.", "patch_embed."), ("encoder.layers.", "blocks."), (".input_layernorm.", ".norm1."),
          (".post_attention_layernorm.", ".norm2."), (".pre_feedforward_layernorm.", ".norm3."),
          (".post_feedforward_layernorm.", ".norm4."), (".self_attn.", ".attn."))


def is_hf_gemma4(state_dict: dict[str, Any]) -> bool:
    return any(key.endswith("patch_embedder.position_embedding_table") for key in state_dict)


def to_timm_keys(state_dict: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """The tower's weights under timm's names and column order, and the keys of the rest of a whole Gemma 4."""
    out, other = {}, []
    tower = any(_TOWER.match(key) for key in state_dict)
    for key, value in state_dict.items():
        if (tower and not _TOWER.match(key)) or "rotary_emb." in key:
            other += [] if "rotary_emb." in key else [key]  # RoPE buffers are rebuilt
            continue
        key = _TOWER.sub("", key)
        for old, new in _NAMES:
            key = key.replace(old, new)
        if key == "patch_embed.input_proj.weight":  # [C_out, P P 3] (y, x, channel) -> (channel, y, x)
            p = math.isqrt(value.shape[1] // 3)
            value = value.reshape(-1, p, p, 3).permute(0, 3, 1, 2).flatten(1)
        out[key] = value
    return out, other


def from_hf_gemma4(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """A ``Gemma4VisionModel`` (or whole Gemma 4) state dict in our keys and layout, for a Gemma 4 twin."""
    timm_keys, other = to_timm_keys(state_dict)
    converted, notes = from_gemma4(timm_keys, model, HF_FORMAT)
    notes += (f"{HF_FORMAT}: keys renamed to timm's, the patch projection's columns from (y, x, channel) order",)
    if other:
        parts = sorted({".".join(key.split(".")[:2]) for key in other})
        notes += (f"{HF_FORMAT}: {len(other)} keys of the rest of Gemma 4 dropped ({', '.join(parts)}): the twin is "
                  "its vision tower",)
    return converted, notes


def describe_hf_gemma4(state_dict: dict[str, Any]) -> Description:
    """The ``*_enc`` twin (the tower's output is its soft tokens) and the arguments the weights decide."""
    return describe_gemma4(to_timm_keys(state_dict)[0])


def _vision_config(config: dict[str, Any]) -> dict[str, Any]:
    """The tower's config with transformers' defaults filled in; a ``ValueError`` for another model type."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json has model_type {model_type!r}: {HF_FORMAT} folders have {MODEL_TYPES[0]!r} "
                         f"(or {MODEL_TYPES[1]!r} for a whole Gemma 4).")
    vision = config.get("vision_config") if model_type == "gemma4" else config
    if not vision:
        raise ValueError("config.json is a whole Gemma 4 without vision_config: it has no vision tower to load.")
    return {**_DEFAULTS, **vision}


def gemma4_args_from_hf_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``vit_rope_gemma4_vit_*_enc`` twin and keyword arguments that build the tower of a config.json's dict."""
    c = _vision_config(config)
    rope = c["rope_parameters"] or {}
    refused = {"hidden_activation": c["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_tanh"),
               "attention_bias": bool(c["attention_bias"]),
               "rope_parameters.rope_type": rope.get("rope_type", "axial") != "axial",
               "head_dim": c["head_dim"] * c["num_attention_heads"] != c["hidden_size"]}
    if field := next((field for field, bad in refused.items() if bad), None):
        raise ValueError(f"config.json has {field}={c.get(field.split('.')[0])!r}, which the vit_rope_gemma4_vit_* "
                         "twins do not model (GELU-tanh, no biases, axial RoPE, head_dim = hidden_size / "
                         "num_attention_heads, as every Gemma 4 tower).")
    size = next((size for size, arch in ARCH.items() if arch["embed_dim"] == c["hidden_size"]), "167m")
    kwargs = dict(embed_dim=c["hidden_size"], depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                  num_kv_heads=c["num_key_value_heads"], mlp_ratio=c["intermediate_size"] / c["hidden_size"],
                  patch_size=c["patch_size"], position_embedding_size=c["position_embedding_size"],
                  pooling_kernel_size=c["pooling_kernel_size"], use_clipped_linears=bool(c["use_clipped_linears"]),
                  standardize=bool(c["standardize"]), rope_theta=float(rope.get("rope_theta", 100.0)),
                  norm_layer=partial(RmsNorm, eps=c["rms_norm_eps"]), num_classes=0)
    return f"vit_rope_gemma4_vit_{size}_enc", kwargs


def check_hf_config(config: dict[str, Any], model: nn.Module) -> None:
    """Raise unless ``model`` is the tower of ``config``, naming the first field that differs and the twin that fits."""
    name, kwargs = gemma4_args_from_hf_config(config)
    if not isinstance(model, Gemma4VisionTransformer) or model.global_pool != "soft":
        raise ValueError(f"config.json describes {HF_FORMAT}, whose weights load into {name} (soft tokens); the model "
                         f"is a {type(model).__name__} with global_pool="
                         f"{getattr(model, 'global_pool', None)!r}.")
    c, block, pooler = _vision_config(config), model.blocks[0], model.pooler
    fields = {  # field: (the file's value, the model's)
        "hidden_size": (c["hidden_size"], model.embed_dim),
        "num_hidden_layers": (c["num_hidden_layers"], len(model.blocks)),
        "num_attention_heads": (c["num_attention_heads"], block.attn.num_heads),
        "num_key_value_heads": (c["num_key_value_heads"], block.attn.num_kv_heads),
        "intermediate_size": (c["intermediate_size"], block.mlp.fc2.in_features),
        "patch_size": (c["patch_size"], model.patch_embed.patch_size[0]),
        "pooling_kernel_size": (c["pooling_kernel_size"], pooler.merge_size),
        "standardize": (bool(c["standardize"]), pooler.std_bias is not None),
        "use_clipped_linears": (bool(c["use_clipped_linears"]), isinstance(block.attn.qkv, ClippedLinear)),
        "position_embedding_size": (c["position_embedding_size"], model.pos_embed_xy.shape[1]),
        "rope_theta": (kwargs["rope_theta"], model.pos_encoding[0].theta),
        "rms_norm_eps": (c["rms_norm_eps"], block.norm1.eps),
    }
    check_config_fields(fields, f"{name} with the folder's sizes")
