"""The timm ``Eva`` backbones that have a vit_rope twin (one table per family, timm name -> twin arguments) and their
state dicts in the twins' keys and q/k layout: EVA-02 (arXiv:2303.11331), Perception Encoder (arXiv:2504.13181), timm's
SBB RoPE ViTs, Sapiens2 (arXiv:2604.21681) and LingBot-Vision (arXiv:2607.05247). ``check_family`` refuses another
family's checkpoint, naming its twin: shapes may fit where layouts differ (SBB and DINOv3 share keys)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, SwiGLU
from timm.models.eva import default_cfgs as eva_cfgs
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.layers.eva import PackedSwiGLU
from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models import dinov3
from vit_rope.models.widths import width
from vit_rope.weights import ROPE_BUFFERS


def _arch(size: str, img_size: int, patch_size: int, **kwargs: Any) -> dict[str, Any]:
    """The twin of a timm model of ``size`` (``vit_rope.models.widths``); ``kwargs`` may override its depth."""
    return dict(width(size), img_size=img_size, patch_size=patch_size, **kwargs)


# EVA-02: cat RoPE with 'ij' indexing on the 16x16 reference grid, class token and its APE row, no LayerScale
_EVA02 = dict(class_token=True, qkv_bias=True, pos_embed="learn", no_embed_class=False, encoding="axial",
              rope_theta=1e4, rope_ref_grid=(16, 16), resolution_policy="interpolate", qk_layout="eva_ij",
              act_layer=nn.SiLU, mlp_ratio=4 * 2 / 3, global_pool="avg")
_PACKED = dict(_EVA02, mlp_layer=PackedSwiGLU)  # tiny, small: GluMlp with the gate first
_SWIGLU = dict(_EVA02, mlp_layer=SwiGLU, scale_mlp_norm=True)  # base, large: SwiGLU with its norm
_CLIP = dict(_SWIGLU, scale_attn_norm=True, global_pool="token")
EVA02: dict[str, dict[str, Any]] = {
    **{f"eva02_{size}_patch14_{img}": _arch(size, img, 14, **(_PACKED if size in ("tiny", "small") else _SWIGLU))
       for img, sizes in ((224, ("tiny", "small", "base", "large")), (336, ("tiny", "small")), (448, ("base", "large")))
       for size in sizes},
    "eva02_base_patch16_clip_224": _arch("base", 224, 16, **_CLIP),
    "eva02_large_patch14_clip_224": _arch("large", 224, 14, **_CLIP),
    "eva02_large_patch14_clip_336": _arch("large", 336, 14, **_CLIP),
}

# Perception Encoder: cat RoPE with 'xy' indexing (our layout), patches at 1..n (class token at 0)
_PE = dict(class_token=True, qkv_bias=True, pre_norm=True, pos_embed="learn", no_embed_class=False, encoding="axial",
           rope_theta=1e4, rope_grid_offset=1.0, resolution_policy="interpolate", qk_layout="eva_xy",
           norm_layer=partial(LayerNorm, eps=1e-5))
_CORE = dict(_PE, global_pool="map", attn_pool_num_heads=8, attn_pool_mlp_ratio=4.0, pool_include_prefix=True)
_DENSE = dict(_PE, global_pool="avg", final_norm=False, fc_norm=False, rope_ref_grid=(32, 32))  # lang/spatial: no norms
_GIGANTIC = dict(class_token=False, rope_grid_offset=0.0, mlp_ratio=8960 / 1536)

PERCEPTION_ENCODER: dict[str, dict[str, Any]] = {
    "vit_pe_core_tiny_patch16_384": _arch("tiny", 384, 16, **_CORE, rope_ref_grid=(24, 24)),
    "vit_pe_core_small_patch16_384": _arch("small", 384, 16, **_CORE, rope_ref_grid=(24, 24)),
    "vit_pe_core_base_patch16_224": _arch("base", 224, 16, **_CORE, rope_ref_grid=(14, 14)),
    "vit_pe_core_large_patch14_336": _arch("large", 336, 14, **_CORE, rope_ref_grid=(24, 24)),
    "vit_pe_core_gigantic_patch14_448": _arch("gigantic", 448, 14, **(_CORE | _GIGANTIC), rope_ref_grid=(32, 32)),
    "vit_pe_lang_large_patch14_448": _arch("large", 448, 14, **_DENSE, init_values=0.1, depth=23),
    "vit_pe_lang_gigantic_patch14_448": _arch("gigantic", 448, 14, **(_DENSE | _GIGANTIC), init_values=0.1, depth=47),
    "vit_pe_spatial_tiny_patch16_512": _arch("tiny", 512, 16, **_DENSE),
    "vit_pe_spatial_small_patch16_512": _arch("small", 512, 16, **_DENSE),
    "vit_pe_spatial_base_patch16_512": _arch("base", 512, 16, **_DENSE),
    "vit_pe_spatial_large_patch14_448": _arch("large", 448, 14, **_DENSE),
    "vit_pe_spatial_gigantic_patch14_448": _arch("gigantic", 448, 14, **(_DENSE | _GIGANTIC), init_values=0.1),
}

# timm's SBB RoPE ViTs: no class token, registers, no APE, LayerScale, average pool, fc_norm; 'ij' cat RoPE, native grid
_SBB = dict(class_token=False, pos_embed="none", init_values=1e-5, global_pool="avg", encoding="axial", rope_theta=1e4,
            rope_ref_grid=(16, 16), resolution_policy="interpolate", qk_layout="eva_ij")
SBB: dict[str, dict[str, Any]] = {
    f"vit_{size}_patch16_rope_reg{regs}_gap_256": _arch(size, 256, 16, **_SBB, reg_tokens=regs,
                                                       qkv_bias=size != "mediumd")
    for size, regs in (("medium", 1), ("mediumd", 1), ("betwixt", 4), ("base", 1))
}

# Sapiens2: DINOv3's RoPE (rotate-half); timm's RmsNorm, faster in inference, as block and q/k norms
_SAPIENS2 = dict(img_size=(1024, 768), patch_size=16, class_token=True, reg_tokens=8, pos_embed="none", qkv_bias=True,
                 qk_norm=True, norm_layer=partial(RmsNorm, eps=1e-6), mlp_layer=PackedSwiGLU, mlp_ratio=4.0,
                 init_values=1.0, layer_scale="attn", global_pool="token", encoding="dinov3", rope_theta=100.0,
                 rope_coord_aug=dict(rescale=2.0, per_image=False), qk_layout="rotate_half")


def _sapiens2(size: str) -> dict[str, Any]:
    """Half the heads as key / value heads in every block but the first and last 8."""
    arch = width(size)
    depth, heads = arch["depth"], arch["num_heads"]
    kv_heads = tuple(heads if i < 8 or i >= depth - 8 else heads // 2 for i in range(depth))
    return dict(_SAPIENS2, **arch, num_kv_heads=kv_heads)


SAPIENS2: dict[str, dict[str, Any]] = {
    f"vit_{size}_patch16_sapiens2": _sapiens2(size) for size in ("base", "large", "huge", "giant", "5b")}

# LingBot-Vision: DINOv3's backbones (weights load as DINOv3's), class-token pooling at 512 px; giant: SwiGLU 8/3
_LINGBOT = dict(global_pool="token", img_size=512)
LINGBOT: dict[str, dict[str, Any]] = {
    **{f"vit_{size}_patch16_lingbot": dict(dinov3.model_args(size, True), **_LINGBOT) for size in ("small", "base",
                                                                                                   "large")},
    "vit_giant_patch16_lingbot": dict(dinov3.model_args("small_plus", False), **width("giant"), mlp_ratio=8 / 3,
                                      **_LINGBOT),
}

FAMILIES: dict[str, dict[str, dict[str, Any]]] = {"EVA-02": EVA02, "Perception Encoder": PERCEPTION_ENCODER,
                                                  "SBB RoPE ViT": SBB, "Sapiens2": SAPIENS2, "LingBot-Vision": LINGBOT}


def twin_name(timm_name: str) -> str:
    """Our name for a timm model: ``vit_base_patch16_rope_reg1_gap_256`` -> ``vit_rope_base_patch16_reg1_gap_256``."""
    return "vit_rope_" + timm_name.removeprefix("vit_").replace("_rope", "")


def twin_cfgs() -> dict[str, dict[str, Any]]:
    """``{twin.tag: cfg}``: timm's own (the same weights, read through our checkpoint filter), but for any input size;
    ``min_input_size`` is eight patches a side, so that timm's model tests pick a multiple of the patch size."""
    return {f"{twin_name(name)}.{tag}": dict(cfg.to_dict(), fixed_input_size=False,
                                             min_input_size=(3, 8 * args["patch_size"], 8 * args["patch_size"]))
            for table in FAMILIES.values() for name, args in table.items() for tag, cfg in eva_cfgs[name].cfgs.items()}


EVA_LAYOUTS = ("eva_ij", "eva_xy", "rotate_half")  # rotate_half: Sapiens2 (DINOv3's own twins go through dinov3.py)
_SEPARATE = re.compile(r"^(blocks\.\d+\.attn\.)([qkv])_proj\.(weight|bias)$")


def is_eva(state_dict: dict[str, Any]) -> bool:
    """The marker of timm's ``Eva`` files (DeiT-III's and RoPE-ViT's files share ``gamma_1``, and load the same way)."""
    return any(key.endswith((".attn.q_bias", ".attn.q_proj.weight", ".gamma_1")) for key in state_dict)


def from_eva(state_dict: dict[str, Tensor], model: nn.Module) -> tuple[dict[str, Tensor], tuple[str, ...]]:
    """``state_dict`` in the keys and q/k layout of ``model``, with what was converted."""
    head_dim = model.blocks[0].attn.head_dim
    index = qk_permutation(model.qk_layout, head_dim)
    permute = not torch.equal(index, torch.arange(head_dim))
    out, separate, notes = {}, {}, set()  # the state dict, each block's q / k / v parts, what was converted
    for key, value in state_dict.items():
        if ROPE_BUFFERS.match(key) or key.endswith(".attn.k_bias"):
            notes.add("RoPE buffers dropped (rebuilt per input)")
            continue
        if match := _SEPARATE.match(key):  # q_proj / k_proj / v_proj, fused below
            separate.setdefault(match.group(1), {})[match.group(2) + match.group(3)[0]] = value
            continue
        if key.endswith("attn.v_bias"):  # joins q_bias
            continue
        if key.endswith("attn.q_bias"):
            value = dinov3.fuse_qkv_bias(value, state_dict[key.replace("q_bias", "v_bias")])
            key = key.replace("q_bias", "qkv.bias")
            notes.add("q_bias / v_bias -> qkv.bias with a zero key bias")
        out[key] = value
    for prefix, parts in separate.items():
        out[prefix + "qkv.weight"] = torch.cat((parts["qw"], parts["kw"], parts["vw"]))
        if "qb" in parts:  # EVA-02 trains no key bias
            out[prefix + "qkv.bias"] = dinov3.fuse_qkv_bias(parts["qb"], parts["vb"], parts.get("kb"))
        notes.add("separate q_proj / k_proj / v_proj -> fused qkv")
    if permute:
        for key in [k for k in out if k.endswith(("attn.qkv.weight", "attn.qkv.bias"))]:
            attn = model.blocks[int(key.split(".")[1])].attn
            out[key] = permute_qk_rows(out[key], index, attn.num_heads, attn.num_kv_heads)
        for key in [k for k in out if re.search(r"attn\.[qk]_norm\.(weight|bias)$", k)]:
            out[key] = out[key].index_select(0, index)  # a per-channel affine follows its channels
        notes.add(f"q/k rows of every head permuted from timm's {model.qk_layout} layout to interleaved x-first pairs")
    return out, tuple(f"timm Eva: {note}" for note in sorted(notes))


def checkpoint_family(state_dict: dict[str, Any]) -> str | None:
    """The family a state dict (timm's or a twin's) looks like by its tokens, embeddings and MLP, or ``None``."""
    keys = set(state_dict)
    layer_scale = any(key.endswith((".gamma_1", ".ls1.gamma")) for key in keys)
    cls, reg, ape = "cls_token" in keys, "reg_token" in keys or "storage_tokens" in keys, "pos_embed" in keys
    fc1 = state_dict.get("blocks.0.mlp.fc1.weight")
    swiglu = "blocks.0.mlp.fc1_g.weight" in keys or (fc1 is not None and fc1.shape[0] != 4 * fc1.shape[1])
    if "norm_pre.weight" in keys and ape:
        return "Perception Encoder"
    if "blocks.0.attn.q_norm.weight" in keys and reg and not ape:
        return "Sapiens2"
    if reg and not ape:
        return ("DINOv3" if layer_scale else None) if cls else "SBB RoPE ViT"
    return "EVA-02" if cls and ape and not reg and not layer_scale and swiglu else None


def check_family(state_dict: dict[str, Any], model: nn.Module) -> None:
    """Refuse a checkpoint of one family given to another family's twin, naming the twin that takes it."""
    seen, expected = checkpoint_family(state_dict), checkpoint_family(model.state_dict())
    if seen is None or expected is None or seen == expected:
        return
    patch = state_dict.get("patch_embed.proj.weight")
    dim = None if patch is None else patch.shape[0]
    depth = len({key.split(".")[1] for key in state_dict if key.startswith("blocks.")})
    qkvb = "_qkvb" if any(k.endswith(("attn.q_bias", "attn.qkv.bias")) for k in state_dict) else ""
    twins = [f"a vit_rope_*_patch16_dinov3{qkvb} model of width {dim}"] if seen == "DINOv3" else [
        twin_name(name) for name, args in FAMILIES[seen].items() if args["embed_dim"] == dim and args["depth"] == depth
    ] or [f"a {seen} twin of width {dim}"]
    raise ValueError(f"The checkpoint looks like a {seen} backbone (width {dim}, depth {depth}), but the model is a "
                     f"{expected} twin: load it into {' or '.join(twins)} (vit_rope.from_timm names the twin of a "
                     "timm model).")
