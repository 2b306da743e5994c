"""DINOv3 backbones (Simeoni et al. 2025, arXiv:2508.10104) as vit_rope models, and their weights in our layout.

DINOv3's ViTs are timm ``VisionTransformer`` blocks with a class token, 4 register ("storage") tokens, LayerScale,
no position embedding, a LayerNorm of eps 1e-5, optionally no qkv bias and SwiGLU MLPs, and DINOv3's RoPE
(``vit_rope.layers.dinov3_rope``). timm ports them in ``eva.py``; here they are ``RoPEVisionTransformer`` with
``rope_kind="dinov3"``, so every tool of the package (fused rotation, Triton kernels, policies, export, evaluation)
reaches them. Weights load from timm's ``Eva`` state dicts and from Meta's original checkpoints:

- timm: ``attn.q_bias`` and ``attn.v_bias`` -> one qkv bias with a zero key bias (DINOv3 trains none); its
  ``gamma_1`` / ``gamma_2`` LayerScale is renamed by ``vit_rope.models.checkpoint`` as for timm's RoPE-ViT ports;
- Meta: ``storage_tokens`` -> ``reg_token``; the masked qkv bias keeps its key part at zero; SwiGLU ``w1, w2, w3`` ->
  timm's ``fc1_g, fc1_x, fc2``; ``mask_token``, ``rope_embed.periods``, ``bias_mask`` and ``local_cls_norm`` are
  training-only or rebuilt;
- both: the q and k rows of every head are permuted from rotate-half to interleaved pairs
  (``interleave_permutation``), which leaves every attention score as it was.

HF transformers' DINOv3 files convert onto timm's keys first (``vit_rope.models.hf_dinov3``); LingBot-Vision's
backbones, DINOv3's architecture, are registered with the other Eva twins (``vit_rope.models.eva_families``).

Left out: the 7B model's specifics (untied norms and the layer options timm's ``vit_7b_patch16_dinov3`` adds).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, SwiGLU
from torch import Tensor, nn

from vit_rope.layers.dinov3_rope import interleave_permutation

# timm's DINOv3 widths (vit_*_patch16_dinov3[_qkvb]); the +variants have SwiGLU MLPs.
ARCHS: dict[str, dict[str, Any]] = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "small_plus": dict(embed_dim=384, depth=12, num_heads=6, swiglu=True),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}


def dinov3_name(size: str, qkv_bias: bool) -> str:
    """timm's DINOv3 name with ``vit_rope_`` in front: ``vit_rope_small_patch16_dinov3[_qkvb]``."""
    return f"vit_rope_{size}_patch16_dinov3{'_qkvb' if qkv_bias else ''}"


def model_args(size: str, qkv_bias: bool) -> dict[str, Any]:
    """Keyword arguments of ``RoPEVisionTransformer`` for DINOv3 ``size`` (timm's defaults, global average pooling)."""
    arch = dict(ARCHS[size])
    swiglu = arch.pop("swiglu", False)
    return dict(
        img_size=256,  # DINOv3's pretraining size, the training grid of the `extrapolate` policy
        patch_size=16,
        qkv_bias=qkv_bias,
        init_values=1e-5,
        class_token=True,
        reg_tokens=4,
        global_pool="avg",  # timm's default for its port; DINOv3 itself reads the class token (global_pool="token")
        fc_norm=False,
        norm_layer=partial(LayerNorm, eps=1e-5),
        rope_kind="dinov3",
        **({"mlp_layer": partial(SwiGLU, align_to=8), "act_layer": nn.SiLU} if swiglu else {}),
        **arch,
    )


def is_dinov3(state_dict: dict[str, Any]) -> bool:
    """Whether ``state_dict`` is a DINOv3 ViT as timm (``Eva``) or Meta saves it."""
    return "storage_tokens" in state_dict or any(key.endswith(".gamma_1") for key in state_dict)


_META_SWIGLU = {"w1": "fc1_g", "w2": "fc1_x", "w3": "fc2"}
_DROPPED = re.compile(r"(^mask_token$|^rope_embed\.|^rope\.|\.bias_mask$|^local_cls_norm\.)")


def from_dinov3(state_dict: dict[str, Tensor], num_heads: int) -> dict[str, Tensor]:
    """A timm-``Eva`` or Meta DINOv3 state dict in our keys and channel layout (see the module docstring), but for
    timm's LayerScale names, which ``vit_rope.models.checkpoint`` renames for every timm source."""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if _DROPPED.search(key) or key.endswith(("attn.k_bias", "attn.v_bias")):  # they join q_bias below
            continue
        key = key.replace("storage_tokens", "reg_token")  # gamma_1/2 -> ls1/2.gamma: checkpoint's generic rename
        key = re.sub(r"\.mlp\.(w[123])\.", lambda m: f".mlp.{_META_SWIGLU[m.group(1)]}.", key)
        if key.endswith("attn.q_bias"):  # timm: q and v biases, the key bias a zero buffer (HF may train one)
            k_bias = state_dict.get(key.replace("q_bias", "k_bias"), torch.zeros_like(value))
            value = torch.cat((value, k_bias, state_dict[key.replace("q_bias", "v_bias")]))
            key = key.replace("q_bias", "qkv.bias")
        elif key.endswith("attn.qkv.bias"):  # Meta: the key bias is masked to zero in the forward
            q, _, v = value.chunk(3)
            value = torch.cat((q, torch.zeros_like(q), v))
        if key.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            value = _interleave_qk(value, num_heads)
        out[key] = value
    return out


def _interleave_qk(value: Tensor, num_heads: int) -> Tensor:
    """Rows of a qkv weight ``[3C, C]`` or bias ``[3C]``: q and k heads from rotate-half to interleaved pairs."""
    q, k, v = value.unflatten(0, (3, num_heads, -1)).unbind(0)  # [nh, D, ...] each
    index = interleave_permutation(q.shape[1]).to(value.device)
    return torch.stack((q.index_select(1, index), k.index_select(1, index), v)).flatten(0, 2)
