"""timm ``Eva`` state dicts (EVA-02, arXiv:2303.11331; Perception Encoder, arXiv:2504.13181; timm's SBB RoPE ViTs;
Sapiens2, arXiv:2604.21681) in the keys and q/k layout of their vit_rope twins (``vit_rope.models.eva_families``).

q / v biases or separate q / k / v projections become one fused ``qkv``; the q and k rows of every head (and the
``q_norm`` / ``k_norm`` affine after them) are permuted from the model's ``qk_layout`` into our interleaved, x-first
pairs. A checkpoint of another family's twin is refused by name (``check_family``): the shapes could fit while the
function would not (an SBB ViT and a DINOv3 backbone share their keys but not their layout).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.models.dinov3 import fuse_qkv_bias
from vit_rope.models.eva_families import FAMILIES, twin_name
from vit_rope.weights import ROPE_BUFFERS

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
    out: dict[str, Tensor] = {}
    separate: dict[str, dict[str, Tensor]] = {}
    notes: set[str] = set()
    for key, value in state_dict.items():
        if ROPE_BUFFERS.match(key) or key.endswith(".attn.k_bias"):
            notes.add("RoPE buffers dropped (rebuilt per input)")
            continue
        match = _SEPARATE.match(key)
        if match:  # q_proj / k_proj / v_proj, fused below
            separate.setdefault(match.group(1), {})[match.group(2) + match.group(3)[0]] = value
            continue
        if key.endswith("attn.v_bias"):  # joins q_bias
            continue
        if key.endswith("attn.q_bias"):
            value = fuse_qkv_bias(value, state_dict[key.replace("q_bias", "v_bias")])
            key = key.replace("q_bias", "qkv.bias")
            notes.add("q_bias / v_bias -> qkv.bias with a zero key bias")
        out[key] = value
    for prefix, parts in separate.items():
        out[prefix + "qkv.weight"] = torch.cat((parts["qw"], parts["kw"], parts["vw"]))
        if "qb" in parts:  # EVA-02 trains no key bias
            out[prefix + "qkv.bias"] = fuse_qkv_bias(parts["qb"], parts["vb"], parts.get("kb"))
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
    """The family a state dict (timm's or a twin's) looks like by its tokens, embeddings and MLP; ``None`` for the
    others (RoPE-ViT, plain ViTs, LookHere)."""
    keys = set(state_dict)
    layer_scale = any(key.endswith((".gamma_1", ".ls1.gamma")) for key in keys)
    cls, reg, ape = "cls_token" in keys, "reg_token" in keys or "storage_tokens" in keys, "pos_embed" in keys
    if "norm_pre.weight" in keys and ape:
        return "Perception Encoder"
    if "blocks.0.attn.q_norm.weight" in keys and reg and not ape:
        return "Sapiens2"
    if reg and not ape:
        return ("DINOv3" if layer_scale else None) if cls else "SBB RoPE ViT"
    if cls and ape and not reg and not layer_scale and _swiglu(state_dict):
        return "EVA-02"
    return None


def _swiglu(state_dict: dict[str, Any]) -> bool:
    fc1 = state_dict.get("blocks.0.mlp.fc1.weight")
    return "blocks.0.mlp.fc1_g.weight" in state_dict or (fc1 is not None and fc1.shape[0] != 4 * fc1.shape[1])


def check_family(state_dict: dict[str, Any], model: nn.Module) -> None:
    """Refuse a checkpoint of one family given to another family's twin, naming the twin that takes it."""
    seen, expected = checkpoint_family(state_dict), checkpoint_family(model.state_dict())
    if seen is None or expected is None or seen == expected:
        return
    patch = state_dict.get("patch_embed.proj.weight")
    dim = None if patch is None else patch.shape[0]
    depth = len({key.split(".")[1] for key in state_dict if key.startswith("blocks.")})
    if seen == "DINOv3":
        qkvb = "" if not any(k.endswith(("attn.q_bias", "attn.qkv.bias")) for k in state_dict) else "_qkvb"
        twins = [f"a vit_rope_*_patch16_dinov3{qkvb} model of width {dim}"]
    else:
        twins = [twin_name(name) for name, args in FAMILIES[seen].items()
                 if args["embed_dim"] == dim and args["depth"] == depth] or [f"a {seen} twin of width {dim}"]
    raise ValueError(f"The checkpoint looks like a {seen} backbone (width {dim}, depth {depth}), but the model is a "
                     f"{expected} twin: load it into {' or '.join(twins)} (vit_rope.from_timm names the twin of a "
                     "timm model).")
