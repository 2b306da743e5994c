"""DINOv3 (arXiv:2508.10104) as Hugging Face transformers saves it (``DINOv3ViTModel`` folders, most downloads), without
transformers; ``check_hf_config`` holds a model to what only the config shows (RoPE theta, norm eps, activation)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any, NoReturn

import torch
from timm.layers import LayerNorm, LayerScale, SwiGLU, to_2tuple
from torch import Tensor, nn

from vit_rope.models.dinov3 import DINOV3_QK, PRETRAIN_SIZE, SIZES, architecture, dinov3_name, from_dinov3
from vit_rope.weights import Converted, check_config_fields

HF_FORMAT = "Hugging Face transformers' DINOv3ViTModel"
MODEL_TYPE = "dinov3_vit"
# DINOv3ViTConfig's defaults (transformers 5.24): transformers leaves values equal to them out of config.json
_DEFAULTS: dict[str, Any] = dict(
    patch_size=16, hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
    hidden_act="gelu", layer_norm_eps=1e-5, rope_theta=100.0, num_channels=3, query_bias=True, key_bias=False,
    value_bias=True, proj_bias=True, mlp_bias=True, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0,
    pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=2.0)
_OTHER_TYPES = {  # transformers' other ViT-like model types users hold, and what they are
    "dinov2": "DINOv2 (a learned absolute position embedding, no RoPE)",
    "dinov2_with_registers": "DINOv2 with registers (a learned absolute position embedding, no RoPE)",
    "dinov3_convnext": "DINOv3's ConvNeXt (a CNN, no attention)",
    "vit": "a ViT with a learned absolute position embedding (no RoPE)",
}
_SUPPORTED = f"vit_rope loads transformers' DINOv3 ViTs (model_type {MODEL_TYPE!r}) only"
_LAYER = re.compile(r"^(?:model\.)?layer\.(\d+)\.")  # transformers 5 saves model.layer.i, 4.x saved layer.i
_RENAMES = (("attention.o_proj.", "attn.proj."), ("layer_scale1.lambda1", "gamma_1"), ("mlp.down_proj.", "mlp.fc2."),
            ("layer_scale2.lambda1", "gamma_2"), ("embeddings.cls_token", "cls_token"),
            ("embeddings.register_tokens", "reg_token"), ("embeddings.patch_embeddings.", "patch_embed.proj."))


def refuse_other_hf(state_dict: dict[str, Tensor], model: nn.Module) -> NoReturn:
    """The converter of transformers' ViT / DINOv2 weights, which no vit_rope model takes: an error naming them."""
    raise ValueError(f"The checkpoint looks like Hugging Face transformers' ViT or DINOv2 "
                     f"(embeddings.patch_embeddings.projection, encoder.layer.*): {_SUPPORTED}; a DINOv2 or ViT "
                     "runs in timm's own models (vit_*_patch14_dinov2, vit_*_patch16_224); no vit_rope twin.")


def to_timm_keys(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ``DINOv3ViTModel`` state dict under timm ``Eva``'s DINOv3 names: q/k/v fused into ``qkv`` (a missing q or v
    bias as zeros beside a present one, a trained key bias as ``k_bias``), the MLP's projections as timm's."""
    gated = any(".mlp.gate_proj." in key for key in state_dict)
    renames = (*_RENAMES, ("mlp.gate_proj.", "mlp.fc1_g."), ("mlp.up_proj.", "mlp.fc1_x." if gated else "mlp.fc1."))
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if key in ("embeddings.mask_token", "rope_embeddings.inv_freq") or re.search(r"\.[qkv]_proj\.", key):
            continue  # masking is pretraining only, the RoPE is rebuilt; q/k/v are fused below
        key = _LAYER.sub(r"blocks.\1.", key)
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value
    for key in state_dict:
        if match := re.fullmatch(r"((?:model\.)?layer\.(\d+)\.attention\.)q_proj\.weight", key):
            prefix, block = match.group(1), f"blocks.{match.group(2)}.attn."
            out[block + "qkv.weight"] = torch.cat([state_dict[f"{prefix}{n}_proj.weight"] for n in "qkv"])
            biases = {n: state_dict.get(f"{prefix}{n}_proj.bias") for n in "qkv"}
            if any(bias is not None for bias in biases.values()):  # q and v (a missing one zero), k where trained
                zeros = torch.zeros_like(state_dict[key][:, 0])
                out.update({f"{block}{n}_bias": zeros if bias is None else bias for n, bias in biases.items()
                            if n != "k" or bias is not None})
    return out


def from_hf_dinov3(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """A ``DINOv3ViTModel`` state dict in our keys and channel layout, for an ``encoding="dinov3"`` model."""
    if getattr(model, "encoding_kind", None) != "dinov3":
        raise ValueError(f"The checkpoint is {HF_FORMAT}, which loads into the vit_rope_*_patch16_dinov3* models; this "
                         f"model has encoding={getattr(model, 'encoding_kind', None)!r}. With the folder's "
                         "config.json, vit_rope.create_from_checkpoint(folder) builds the model that fits.")
    return from_dinov3(to_timm_keys(state_dict), model.blocks[0].attn.num_heads), (
        f"{HF_FORMAT}: keys renamed to timm's, separate q / k / v projections fused", DINOV3_QK)


def _size(c: dict[str, Any]) -> str:
    """Which of ``dinov3.SIZES`` has the width, head count and MLP kind of config ``c`` (defaults filled in)."""
    shapes = {size: tuple(architecture(size)[key] for key in ("embed_dim", "num_heads", "swiglu")) for size in SIZES}
    shape = (c["hidden_size"], c["num_attention_heads"], bool(c["use_gated_mlp"]))
    if shape not in shapes.values():
        sizes = ", ".join(f"{size} {fits}" for size, fits in shapes.items())
        raise ValueError(f"config.json has (hidden_size, num_attention_heads, use_gated_mlp) = {shape}, which no "
                         f"vit_rope DINOv3 model has: the sizes are {sizes} (the 7B and huge_plus are not ported).")
    return next(size for size, fits in shapes.items() if fits == shape)


def dinov3_args_from_hf_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``vit_rope_*_dinov3*`` model and keyword arguments that build the ``DINOv3ViTModel`` of a config.json's
    dict: class-token pooling as HF's pooler, no classifier, coordinate augmentation drawn once per batch."""
    c = {**_DEFAULTS, **config}
    model_type = c.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        looks = _OTHER_TYPES.get(model_type, "not a DINOv3 ViT")
        raise ValueError(f"config.json has model_type {model_type!r}, {looks}: {_SUPPORTED}.")
    gated = bool(c["use_gated_mlp"])
    if c["hidden_act"] != ("silu" if gated else "gelu") or not (c["proj_bias"] and c["mlp_bias"]):
        raise ValueError(f"config.json has hidden_act={c['hidden_act']!r}, use_gated_mlp={gated}, proj_bias="
                         f"{c['proj_bias']}, mlp_bias={c['mlp_bias']}: vit_rope's DINOv3 models have GELU MLPs or "
                         "SiLU-gated ones (use_gated_mlp), with biases, as Meta's DINOv3.")
    size = _size(c)
    mlp_ratio = c["intermediate_size"] / c["hidden_size"]
    hidden = int(c["hidden_size"] * mlp_ratio)  # our MLP's width, rounded up to 8 for SwiGLU (align_to)
    if hidden + (-hidden % 8 if gated else 0) != c["intermediate_size"]:
        raise ValueError(f"config.json has intermediate_size={c['intermediate_size']}, which a ratio of "
                         f"hidden_size={c['hidden_size']} cannot give (SwiGLU widths are multiples of 8).")
    qkv_bias = any(c[key] for key in ("query_bias", "key_bias", "value_bias"))
    aug = dict(shift=c["pos_embed_shift"] or 0.0, jitter=c["pos_embed_jitter"] or 1.0,
               rescale=c["pos_embed_rescale"] or 1.0)
    kwargs = dict(depth=c["num_hidden_layers"], num_classes=0, global_pool="token", img_size=PRETRAIN_SIZE,
                  patch_size=to_2tuple(c["patch_size"]), in_chans=c["num_channels"], mlp_ratio=mlp_ratio,
                  init_values=c["layerscale_value"], rope_theta=float(c["rope_theta"]))
    if aug != dict(shift=0.0, jitter=1.0, rescale=1.0):
        kwargs["rope_coord_aug"] = dict(aug, per_image=False)
    if c["layer_norm_eps"] != 1e-5:
        kwargs["norm_layer"] = partial(LayerNorm, eps=c["layer_norm_eps"])
    return dinov3_name(size, qkv_bias), kwargs


def check_hf_config(config: dict[str, Any], model: nn.Module) -> None:
    """Raise unless ``model`` is the ``DINOv3ViTModel`` of ``config``, naming the field that differs and the fit."""
    name, kwargs = dinov3_args_from_hf_config(config)
    c, depth = {**_DEFAULTS, **config}, kwargs["depth"]
    fits = name if depth == architecture(_size(c))["depth"] else f"{name} with depth={depth}"
    if getattr(model, "encoding_kind", None) != "dinov3":
        raise ValueError(f"config.json describes {HF_FORMAT}, whose weights load into {fits}; this model has "
                         f"encoding={getattr(model, 'encoding_kind', None)!r}.")
    block = model.blocks[0]
    fields = {  # field: (the file's value, as compared; the model's)
        "hidden_size": (c["hidden_size"], model.embed_dim),
        "num_hidden_layers": (c["num_hidden_layers"], len(model.blocks)),
        "num_attention_heads": (c["num_attention_heads"], block.attn.num_heads),
        "num_register_tokens": (c["num_register_tokens"], model.num_reg_tokens),
        "use_gated_mlp": (bool(c["use_gated_mlp"]), isinstance(block.mlp, SwiGLU)),
        "intermediate_size": (c["intermediate_size"], block.mlp.fc2.in_features),
        "layerscale_value (LayerScale)": (True, isinstance(block.ls1, LayerScale)),
        "rope_theta": (float(c["rope_theta"]), model.pos_encoding[0].theta),
        "patch_size": (to_2tuple(c["patch_size"]), tuple(model.patch_embed.patch_size)),
        "layer_norm_eps": (c["layer_norm_eps"], model.norm.eps),
        "query_bias/key_bias/value_bias (qkv bias)": (name.endswith("_qkvb"), block.attn.qkv.bias is not None),
    }
    check_config_fields(fields, fits)
