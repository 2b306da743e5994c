"""Twins of timm's Gemma 4 vision encoders (``timm.models.gemma4_vit``, timm 1.0.31): ``vit_rope_gemma4_vit_*``. Gemma
4's vision tower (arXiv:2607.02770; transformers' ``Gemma4VisionModel``) adds a learned table per axis, sandwich
RMSNorms, q/k/v norms, attention without ``1 / sqrt(D)``, axial RoPE in its own layout (x: each head's first half, y:
its second) and a pooler averaging 3x3 blocks into soft tokens. The twin folds the pixel scaling into the patch
convolution, the post-norms into the LayerScale slots, E2B/E4B's clamps into ``ClippedLinear`` (docs/models.md)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import SwiGLU, get_device_dtype, register_notrace_module, trunc_normal_
from timm.models.gemma4_vit import Gemma4VitClassifier
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models.qwen3_vit import PatchMerger
from vit_rope.models.twins import ProjectorTwin, conversion_notes, timm_tower
from vit_rope.weights import Converted, check_twin, depth_of

SOURCE = "timm's Gemma 4 ViT (timm.models.gemma4_vit)"
ARCH = {"167m": dict(embed_dim=768, depth=16, num_heads=12, mlp_ratio=4.0, use_clipped_linears=True),
         "570m": dict(embed_dim=1152, depth=27, num_heads=16, mlp_ratio=4304 / 1152, standardize=True)}
_COMMON = dict(img_size=768, patch_size=16, class_token=False, qkv_bias=False, proj_bias=False, qk_norm=True,
               norm_layer=partial(RmsNorm, eps=1e-6), act_layer="gelu_tanh", mlp_layer=SwiGLU, encoding="axial",
               rope_theta=100.0, resolution_policy="extrapolate", qk_layout="gemma4", num_classes=0)
_HEADS = (("", "avg"), ("_enc", "soft"))  # timm's classifier, its encoder (soft tokens)
GEMMA4: dict[str, dict[str, Any]] = {f"gemma4_vit_{size}{suffix}": dict(_COMMON, **arch, global_pool=pool)
                                     for size, arch in ARCH.items() for suffix, pool in _HEADS}


@register_notrace_module  # one call under FX: its forward loops over its bounds
class ClippedLinear(nn.Linear):
    """``nn.Linear`` with input and output clamped (Gemma 4's ``Gemma4ClippableLinear``); ``split``: the output rows of
    each fused source (q, k, v), each with its own input bounds ``[G, in_features]``; output bounds per row; infinite
    until a checkpoint sets them. Per feature, not scalars, for the ONNX export (docs/models.md)."""

    def __init__(self, linear: nn.Linear, split: tuple[int, ...] | None = None) -> None:
        dd = get_device_dtype(linear)
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, **dd)
        self.weight, self.bias = linear.weight, linear.bias  # the model's init, shared
        self.split = tuple(split or (linear.out_features,))
        for name, size in (("input", (len(self.split), linear.in_features)), ("output", (linear.out_features,))):
            self.register_buffer(f"{name}_min", torch.full(size, -float("inf"), **dd))
            self.register_buffer(f"{name}_max", torch.full(size, float("inf"), **dd))

    def forward(self, x: Tensor) -> Tensor:
        biases = (None,) * len(self.split) if self.bias is None else self.bias.split(self.split)
        parts = [F.linear(x.clamp(low, high), w, b) for low, high, w, b in zip(  # each source's rows, its own bounds
            self.input_min, self.input_max, self.weight.split(self.split), biases, strict=True)]
        return (torch.cat(parts, -1) if len(parts) > 1 else parts[0]).clamp(self.output_min, self.output_max)


class SoftTokenPool(nn.Module):
    """Gemma 4's vision pooler: the mean of each ``k x k`` block of patch tokens (blocks row-major, as Qwen-VL's
    merger gathers them), times ``sqrt(C)``, then ``(x - std_bias) * std_scale`` where the model ``standardize``s."""

    merge, merge_naflex = PatchMerger.merge, PatchMerger.merge_naflex  # read merge_size only

    def __init__(self, dim: int, merge_size: int = 3, standardize: bool = False) -> None:
        super().__init__()
        self.merge_size, self.scale = merge_size, dim**0.5
        self.register_buffer("std_bias", torch.zeros(dim) if standardize else None)
        self.register_buffer("std_scale", torch.ones(dim) if standardize else None)

    def forward(self, x: Tensor, grid: tuple[int, int] | None, coord: Tensor | None = None,
                valid: Tensor | None = None, pre_logits: bool = False) -> tuple[Tensor, Tensor | None]:
        """Soft tokens of tokens on ``grid`` or at ``coord`` (NaFlex; padding 0), with validity; no pre-logits stage."""
        x, valid = (self.merge(x, grid), None) if valid is None else self.merge_naflex(x, coord, valid)
        x = x.unflatten(-1, (self.merge_size**2, -1)).mean(-2) * self.scale  # [B, M, C]
        if self.std_bias is not None:
            x = (x - self.std_bias) * self.std_scale
        return x if valid is None else x * valid[..., None], valid


class Gemma4VisionTransformer(ProjectorTwin):
    """``ProjectorTwin`` with Gemma 4's position table (``position_embedding_size`` rows per axis), sandwich norms, v
    norm, clamps (``use_clipped_linears``: E2B/E4B's 167m) and pooler (``"soft"``; ``standardize``: 570m's)."""

    FAMILY, TOKENS, PROJECTOR = "Gemma 4", "soft", "pooler"

    def __init__(self, global_pool: str = "avg", encoder_pool: str = "", pooling_kernel_size: int = 3,
                 standardize: bool = False, use_clipped_linears: bool = False, position_embedding_size: int = 10240,
                 **kwargs: Any) -> None:
        eps = getattr(kwargs.get("norm_layer"), "keywords", {}).get("eps", 1e-6)
        num_classes = kwargs.pop("num_classes", 0)
        super().__init__(global_pool, encoder_pool, num_classes=0, pos_embed="none", **kwargs)
        dd, dim = get_device_dtype(self), self.embed_dim
        self.pos_embed_xy = nn.Parameter(trunc_normal_(torch.empty(2, position_embedding_size, dim, **dd), std=0.02))
        for block in self.blocks:
            attn = block.attn
            block.ls1, block.ls2 = RmsNorm(dim, eps, **dd), RmsNorm(dim, eps, **dd)  # the post-norms of the sandwich
            attn.v_norm, attn.scale = RmsNorm(attn.head_dim, eps, affine=False, **dd), 1.0  # q, k, v normalised
            if use_clipped_linears:
                kv = attn.num_kv_heads * attn.head_dim
                for path in ("attn.qkv", "attn.proj", "mlp.fc1_g", "mlp.fc1_x", "mlp.fc2"):  # Gemma 4's clamped ones
                    owner, name = block.get_submodule(path.split(".")[0]), path.split(".")[1]
                    split = (attn.num_heads * attn.head_dim, kv, kv) if path == "attn.qkv" else None
                    setattr(owner, name, ClippedLinear(getattr(owner, name), split))
        soft = "soft" in (global_pool, encoder_pool)
        self.pooler = SoftTokenPool(dim, pooling_kernel_size, standardize).to(**dd) if soft else None
        self.fc_norm = RmsNorm(dim, eps, affine=False, **dd)  # no weights; *_enc's soft tokens skip it
        self.reset_classifier(num_classes)

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"pos_embed_xy"}

    def _prefix_and_ape(self, tokens: Tensor, coord: Tensor, grids: Tensor, grid: tuple[int, int] | None) -> Tensor:
        """Each patch token plus row ``x`` of the x table and row ``y`` of the y table (``coord`` (y, x))."""
        coord = coord.clamp(min=0)  # [N, 2] or [B, N, 2]: NaFlex padding may be negative
        rows = F.embedding(coord[..., 1], self.pos_embed_xy[0]) + F.embedding(coord[..., 0], self.pos_embed_xy[1])
        return super()._prefix_and_ape(tokens + rows, coord, grids, grid)


def is_gemma4(state_dict: dict[str, Any]) -> bool:
    """timm's Gemma 4 files: the position table under timm's name (classifiers under ``encoder.``)."""
    return any(key.removeprefix("encoder.") == "patch_embed.position_embedding_table" for key in state_dict)


def describe_gemma4(state_dict: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The twin a timm Gemma 4 file describes (by its prefix, width or standardisation) and what its weights decide."""
    prefix = "encoder." if "encoder.patch_embed.position_embedding_table" in state_dict else ""
    table = state_dict[f"{prefix}patch_embed.position_embedding_table"]
    dim, head_dim = int(table.shape[-1]), int(state_dict[f"{prefix}blocks.0.attn.q_norm.weight"].shape[0])
    args: dict[str, Any] = dict(
        embed_dim=dim, depth=depth_of(state_dict, f"{prefix}blocks"), num_heads=dim // head_dim,
        position_embedding_size=int(table.shape[1]), standardize=f"{prefix}std_bias" in state_dict,
        mlp_ratio=state_dict[f"{prefix}blocks.0.mlp.gate_proj.linear.weight"].shape[0] / dim,
        num_kv_heads=int(state_dict[f"{prefix}blocks.0.attn.k_proj.linear.weight"].shape[0]) // head_dim,
        use_clipped_linears=f"{prefix}blocks.0.attn.q_proj.input_min" in state_dict)
    if "head.weight" in state_dict:
        args["num_classes"] = int(state_dict["head.weight"].shape[0])
    size = next((size for size, arch in ARCH.items() if arch["embed_dim"] == dim),  # else: the args decide
                "570m" if args["standardize"] else "167m")
    return f"vit_rope_gemma4_vit_{size}{'' if prefix else '_enc'}", args


_RENAMES = ((r"\.norm2\.", ".ls1."), (r"\.norm3\.", ".norm2."), (r"\.norm4\.", ".ls2."), (r"\.o_proj\.", ".proj."),
            (r"\.gate_proj\.", ".fc1_g."), (r"\.up_proj\.", ".fc1_x."), (r"\.down_proj\.", ".fc2."),
            (r"\.linear\.weight$", ".weight"), (r"^patch_embed\.position_embedding_table$", "pos_embed_xy"),
            (r"^std_", "pooler.std_"))
_QKV = re.compile(r"(blocks\.\d+\.attn\.)([qkv])_proj\.(?:linear\.)?(weight|(in|out)put_m(in|ax))")


def from_gemma4(state_dict: dict[str, Tensor], model: nn.Module, source: str = SOURCE) -> Converted:
    """timm's Gemma 4 state dict in our keys and q/k layout, clamp bounds per fused source and row."""
    check_twin(model, isinstance(model, Gemma4VisionTransformer), source,
               "the vit_rope_gemma4_vit_* twins (and vit_rope.from_timm of timm's model)", "gemma4", "Gemma 4's layout")
    sd = {key.removeprefix("encoder."): value for key, value in state_dict.items()}
    attn = model.blocks[0].attn
    if "blocks.0.attn.q_proj.input_min" in sd and not isinstance(attn.qkv, ClippedLinear):
        raise ValueError(f"The checkpoint ({source}) clamps its linears (use_clipped_linears, E2B/E4B's 167m tower), "
                         "which this model does not: build it with use_clipped_linears=True.")
    index, (nh, nkv) = qk_permutation("gemma4", attn.head_dim), (attn.num_heads, attn.num_kv_heads)
    out, dropped, fused = {}, [], {}
    for key, value in sd.items():
        if key == "patch_embed.input_proj.weight":  # [C_out, C P P] of 2 x - 1: a convolution of x with a bias
            p, c = model.patch_embed.patch_size, model.patch_embed.proj.in_channels
            out["patch_embed.proj.weight"], out["patch_embed.proj.bias"] = 2 * value.reshape(-1, c, *p), -value.sum(1)
            continue
        if key.startswith("std_") and (model.pooler is None or model.pooler.std_bias is None):
            dropped.append(key)
            continue
        if re.fullmatch(r"blocks\.\d+\.attn\.[qk]_norm\.weight", key):
            value = value.index_select(0, index.to(value.device))
        if key.endswith(("_min", "_max")):  # a bound per output row [out], per input feature [1, in]
            rows, cols = sd[re.sub(r"(in|out)put_m(in|ax)$", "linear.weight", key)].shape
            value = value.reshape(1).expand(rows) if "output_m" in key else value.reshape(1, 1).expand(1, cols)
            value = value.clone()
        if m := _QKV.fullmatch(key):  # fused below: bounds [3, in] (one row per source) and [rows]
            fused.setdefault(f"{m[1]}qkv.{m[3]}", {})[m[2]] = value
            continue
        for pattern, new in _RENAMES:
            key = re.sub(pattern, new, key)
        out[key] = value
    for key, parts in fused.items():
        value = torch.cat([parts[n] for n in "qkv"])
        out[key] = permute_qk_rows(value, index, nh, nkv) if key.endswith("weight") else value
    return out, conversion_notes(source, "q/k/v fused, q/k rows and norm scales of every head permuted from Gemma 4's "
                                 "axis halves to interleaved pairs; pixel scaling 2 x - 1 folded into the patch "
                                 "convolution", dropped, "standardising soft-token pooler; the "
                                 "vit_rope_gemma4_vit_570m_enc twin keeps it")


def architecture(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The twin's name and keyword arguments that a built timm Gemma 4 ``model`` decides."""
    name, enc, block, args = timm_tower(
        model, Gemma4VitClassifier, "soft", "Gemma 4's GELU-tanh MLP, square patches and embed_dim / num_heads heads",
        lambda enc, block: {
            "act_layer": not (isinstance(block.mlp.act, nn.GELU) and block.mlp.act.approximate == "tanh"),
            "patch_size (not square)": enc.patch_size[0] != enc.patch_size[1],
            "head_dim (not embed_dim / num_heads)": block.attn.head_dim * block.attn.num_heads != enc.embed_dim})
    args.update(img_size=tuple(model.pretrained_cfg.get("input_size", (3, 768, 768))[1:]), patch_size=enc.patch_size[0],
                num_kv_heads=block.attn.num_kv_heads, mlp_ratio=block.mlp.gate_proj.linear.out_features / enc.embed_dim,
                rope_theta=float(enc.rotary_emb.rope_theta), norm_layer=partial(RmsNorm, eps=block.norm1.eps),
                pooling_kernel_size=enc.pooling_kernel_size, standardize=enc.std_bias is not None,
                use_clipped_linears=enc.use_clipped_linears,
                position_embedding_size=enc.patch_embed.position_embedding_size)
    return f"vit_rope_{name}", args
