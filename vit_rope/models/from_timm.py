"""``vit_rope.from_timm``: a model timm loaded as its vit_rope twin with the same weights, which our tools reach."""

from __future__ import annotations

import re
from typing import Any

import timm
from torch import nn

from vit_rope.models import deepseek_vit, gemma4_vit, pixtral, qwen2_5_vl, qwen3_vit
from vit_rope.models.checkpoint import load_state_dict
from vit_rope.models.eva_families import FAMILIES, twin_name
from vit_rope.models.vit import RoPEVisionTransformer

SUPPORTED = ("EVA-02 (eva02_*_patch14_*, eva02_*_clip_*), Perception Encoder (vit_pe_{core,lang,spatial}_*), SBB RoPE "
             "ViT (vit_*_patch16_rope_reg*_gap_256), Sapiens2 (vit_*_patch16_sapiens2), LingBot-Vision "
             "(vit_*_patch16_lingbot), DINOv3 (vit_*_patch16_dinov3[_qkvb]), Qwen3-VL (qwen3_vit_*), DeepSeek-V4 "
             "(deepseek_vit_*), Gemma 4 (gemma4_vit_*); transformers' PixtralVisionModel and its "
             f"LlavaForConditionalGeneration, Qwen2.5-VL tower ({qwen2_5_vl.HF_CLASS})")
_DINOV3 = re.compile(r"vit_\w+_patch16_dinov3(_qkvb)?")


def from_timm(model: nn.Module) -> RoPEVisionTransformer:
    """The vit_rope twin of ``model`` (``SUPPORTED``) with its weights, device, dtype and mode; see ``load_report``."""
    config = getattr(model, "config", None)  # a transformers model
    if getattr(config, "model_type", None) in pixtral.MODEL_TYPES:
        return _twin(model, *pixtral.pixtral_args_from_config(config.to_dict()), f"transformers {type(model).__name__}")
    if type(model).__name__ == qwen2_5_vl.HF_CLASS:  # transformers' model: its config decides the twin
        return _twin(model, *qwen2_5_vl.args_from_config(config.to_diff_dict()), f"transformers' {qwen2_5_vl.HF_CLASS}")
    timm_name = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    for twins, architecture in ((qwen3_vit.QWEN3, qwen3_vit.architecture), (gemma4_vit.GEMMA4, gemma4_vit.architecture),
                                (deepseek_vit.DEEPSEEK, deepseek_vit.architecture)):  # timm's VLM towers
        if timm_name in twins:
            return _twin(model, *architecture(model), f"timm {timm_name}")
    supported = timm_name is not None and (any(timm_name in table for table in FAMILIES.values())
                                           or (_DINOV3.fullmatch(timm_name) and timm.is_model(twin_name(timm_name))))
    if not supported:
        ports = " For timm's RoPE-ViT ports (vit_*_patch16_rope_*), create the vit_rope model of the same size and " \
            "kind and load the port's weights with vit_rope.load_weights(model, file)." \
            if timm_name is not None and "_rope_" in timm_name else ""
        raise ValueError(f"from_timm got {timm_name or type(model).__name__}, which has no vit_rope twin. Supported: "
                         f"{SUPPORTED}.{ports}")
    # the twin's arguments the built model decides, even off its entry point: sizes, head, RoPE grid and offset
    args: dict[str, Any] = dict(img_size=tuple(model.patch_embed.img_size), embed_dim=model.embed_dim,
                                depth=len(model.blocks), num_heads=model.blocks[0].attn.num_heads,
                                num_classes=model.num_classes, global_pool=model.global_pool,
                                in_chans=model.patch_embed.proj.in_channels)
    kv_heads = [getattr(block.attn, "num_kv_heads", None) for block in model.blocks]  # AttentionRope's
    if None not in kv_heads:
        args.update(num_kv_heads=tuple(kv_heads))
    rope = getattr(model, "rope", None)
    if getattr(rope, "ref_feat_shape", None) is not None:  # cat RoPE; DINOv3's normalises coordinates instead
        args.update(rope_ref_grid=tuple(rope.ref_feat_shape), rope_grid_offset=float(rope.grid_offset))
    return _twin(model, twin_name(timm_name), args, f"timm {timm_name}")


def _twin(model: nn.Module, name: str, args: dict[str, Any], source: str) -> RoPEVisionTransformer:
    """Twin ``name`` built with ``args``, holding ``model``'s weights (``source``), on its device, dtype and mode."""
    twin = timm.create_model(name, **args)
    load_state_dict(twin, model.state_dict(), source=source)
    param = next(model.parameters())
    return twin.to(device=param.device, dtype=param.dtype).train(model.training)
