"""DINOv3 backbones (Simeoni et al. 2025, arXiv:2508.10104) as ``RoPEVisionTransformer`` with ``encoding="dinov3"``;
their weights (timm's ``Eva`` state dicts, Meta's checkpoints) in our layout, each head's q and k rows permuted from
rotate-half to interleaved pairs. Left out: the 7B model's specifics (untied norms, layer options)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, SwiGLU
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.models.widths import width
from vit_rope.weights import ROPE_BUFFERS

SIZES = ("small", "small_plus", "base", "large")  # timm's vit_*_patch16_dinov3[_qkvb]
# DINOv3's pretraining size (Meta's train configs: global_crops_size: 256; timm's input_size), the training grid of
# the `extrapolate` policy; the img_size=224 of Meta's hub and transformers' config.json enters no forward
PRETRAIN_SIZE = 256


def architecture(size: str) -> dict[str, Any]:
    """Width, depth, heads of DINOv3 ``size`` and whether its MLP is SwiGLU (the ``_plus`` sizes)."""
    return dict(width(size.removesuffix("_plus")), swiglu=size.endswith("_plus"))


def dinov3_name(size: str, qkv_bias: bool) -> str:
    """timm's DINOv3 name with ``vit_rope_`` in front: ``vit_rope_small_patch16_dinov3[_qkvb]``."""
    return f"vit_rope_{size}_patch16_dinov3{'_qkvb' if qkv_bias else ''}"


def model_args(size: str, qkv_bias: bool) -> dict[str, Any]:
    """Keyword arguments of ``RoPEVisionTransformer`` for DINOv3 ``size`` (timm's defaults, global average pooling)."""
    arch = architecture(size)
    swiglu = arch.pop("swiglu")
    return dict(
        img_size=PRETRAIN_SIZE, patch_size=16, qkv_bias=qkv_bias, init_values=1e-5, class_token=True, reg_tokens=4,
        global_pool="avg",  # timm's default for its port; DINOv3 itself reads the class token (global_pool="token")
        fc_norm=False, norm_layer=partial(LayerNorm, eps=1e-5), encoding="dinov3",
        **({"mlp_layer": partial(SwiGLU, align_to=8), "act_layer": nn.SiLU} if swiglu else {}), **arch,
    )


def fuse_qkv_bias(q_bias: Tensor, v_bias: Tensor, k_bias: Tensor | None = None) -> Tensor:
    """One qkv bias of q and v biases, a missing ``k_bias`` zero (DINOv3 and EVA-02 train none; transformers' may)."""
    return torch.cat((q_bias, torch.zeros_like(v_bias) if k_bias is None else k_bias, v_bias))


DINOV3_QK = "DINOv3: q/k rows of every head permuted from rotate-half to interleaved pairs"  # the conversion's note
_META_SWIGLU = {"w1": "fc1_g", "w2": "fc1_x", "w3": "fc2"}
_DROPPED = re.compile(r"(^mask_token$|\.bias_mask$|^local_cls_norm\.)")  # masking (pretraining), Meta's extra norm


def from_dinov3(state_dict: dict[str, Tensor], num_heads: int) -> dict[str, Tensor]:
    """A timm ``Eva`` or Meta DINOv3 state dict in our keys and layout, LayerScale's ``gamma_*`` renamed later."""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if ROPE_BUFFERS.match(key) or _DROPPED.search(key) or key.endswith(("attn.k_bias", "attn.v_bias")):
            continue  # the k and v biases join q_bias below
        key = key.replace("storage_tokens", "reg_token")  # gamma_1/2 -> ls1/2.gamma: checkpoint's generic rename
        key = re.sub(r"\.mlp\.(w[123])\.", lambda m: f".mlp.{_META_SWIGLU[m.group(1)]}.", key)
        if key.endswith("attn.q_bias"):  # timm: q and v biases, the key bias a zero buffer (HF may train one)
            value = fuse_qkv_bias(value, state_dict[key.replace("q_bias", "v_bias")],
                                  state_dict.get(key.replace("q_bias", "k_bias")))
            key = key.replace("q_bias", "qkv.bias")
        elif key.endswith("attn.qkv.bias"):  # Meta: the key bias is masked to zero in the forward
            q, _, v = value.chunk(3)
            value = fuse_qkv_bias(q, v)
        if key.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            value = permute_qk_rows(value, qk_permutation("rotate_half", value.shape[0] // (3 * num_heads)), num_heads)
        out[key] = value
    return out
