"""Twins of timm's DeepSeek vision encoders (``timm.models.deepseek_vit``, timm 1.0.31): ``vit_rope_deepseek_vit_*``.

DeepSeek-V4 / V4.1's vision tower (arXiv:2609.19969; DeepSeek's ``inference/vision.py``): a pre-norm ViT, axial 2D RoPE
alone, and an "aligner" of 3x3 token blocks, here the Qwen3-VL twin with ``Aligner`` (docs/models.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch.nn.functional as F
from timm.layers import get_device_dtype
from timm.models import deepseek_vit as timm_deepseek
from torch import Tensor, nn

from vit_rope.layers.eva import PackedSwiGLU
from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models.qwen3_vit import PatchMerger, Qwen3VisionTransformer, scatter_blocks
from vit_rope.models.twins import ROTATE_HALF, projector_width, timm_tags, timm_tower, tower_keys
from vit_rope.weights import Converted, Description, check_twin, depth_of

SOURCE = "timm's DeepSeek ViT (timm.models.deepseek_vit)"


class BiasFreeSwiGLU(PackedSwiGLU):
    """DeepSeek's packed SwiGLU without biases: timm's ``Block`` gives the MLP ``proj_bias``, which DeepSeek's lacks."""

    def __init__(self, in_features: int, hidden_features: int, **kwargs: Any) -> None:
        super().__init__(in_features, hidden_features, **dict(kwargs, bias=False))


_ARCH = dict(img_size=546, patch_size=14, embed_dim=1024, depth=32, num_heads=16, mlp_ratio=2816 / 1024,
             class_token=False, qkv_bias=True, norm_layer=partial(RmsNorm, eps=1e-6), mlp_layer=BiasFreeSwiGLU,
             pos_embed="none", encoding="axial", rope_theta=1e4, resolution_policy="extrapolate",
             qk_layout="rotate_half", num_classes=0)
_HEADS = {"": dict(global_pool="avg"), "_align": dict(global_pool="avg", encoder_pool="align"),
          "_enc": dict(global_pool="align")}
# timm name -> twin arguments (the aligner's width: the weights' tag's, ``llm_width``)
DEEPSEEK: dict[str, dict[str, Any]] = {f"deepseek_vit_412m{suffix}": dict(_ARCH, **head)
                                       for suffix, head in _HEADS.items()}
llm_width = partial(projector_width, timm_deepseek._resolve_deepseek_out_features, "aligner_out_features")  # by tag


class Aligner(PatchMerger):
    """DeepSeek's projector (timm's ``DeepseekVitAligner``), ``PatchMerger`` without norm: the grid zero-padded to
    multiples of ``r``, each ``r x r`` block joined channel-major (``F.unfold``'s order, not Qwen's), fc1, GELU, fc2."""

    def __init__(self, dim: int, downsample_ratio: int = 3, out_features: int = 0,
                 norm_layer: Callable[[int], nn.Module] | None = None, **dd: Any) -> None:
        nn.Module.__init__(self)  # norm_layer unused: DeepSeek's aligner has no norm
        self.merge_size, self.out_features = downsample_ratio, out_features
        self.norm = nn.Identity()
        self.fc1 = nn.Linear(dim * downsample_ratio**2, out_features, **dd)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(out_features, out_features, **dd)

    def merge(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """Tokens ``[B, h * w, C]`` of a row-major ``grid`` as ``[B, ceil(h / r) ceil(w / r), C r^2]``."""
        (h, w), r, (B, _, C) = grid, self.merge_size, x.shape
        x = F.pad(x.transpose(1, 2).reshape(B, C, h, w), (0, -w % r, 0, -h % r))  # [B, C, h', w']
        x = x.reshape(B, C, x.shape[2] // r, r, x.shape[3] // r, r).permute(0, 2, 4, 1, 3, 5)  # [B, h', w', C, r, r]
        return x.flatten(3).flatten(1, 2)

    def merge_naflex(self, x: Tensor, coord: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """A NaFlex batch's tokens at ``coord`` (y, x) unshuffled per sample as ``merge`` each image, with validity."""
        r = self.merge_size
        rows, cols = (-(-((c * valid).amax(1, keepdim=True) + 1) // r) for c in (coord[..., 0], coord[..., 1]))
        blocks, valid = scatter_blocks(x, coord, valid, r, cols, int((rows * cols).max()))  # [B, M, r^2, C]
        return blocks.transpose(2, 3).flatten(2), valid  # channel-major


class DeepseekVisionTransformer(Qwen3VisionTransformer):
    """The Qwen3-VL twins' heads with DeepSeek's final RMSNorm and aligner (``"align"``) to ``aligner_out_features``."""

    FAMILY, TOKENS, MERGER = "DeepSeek", "align", Aligner

    def __init__(self, global_pool: str = "avg", encoder_pool: str = "", downsample_ratio: int = 3,
                 aligner_out_features: int = 0, **kwargs: Any) -> None:
        if "align" in (global_pool, encoder_pool) and aligner_out_features <= 0:
            widths = {tag: llm_width("deepseek_vit_412m_align", tag) for tag in timm_tags("deepseek_vit_412m_align")}
            raise ValueError(f"The DeepSeek aligner maps to the language model's width: pass aligner_out_features "
                             f"(timm's tags set it: {widths}), got {aligner_out_features}.")
        norm_layer = kwargs.get("norm_layer", _ARCH["norm_layer"])
        super().__init__(global_pool, encoder_pool, downsample_ratio, aligner_out_features, **kwargs)
        dd = get_device_dtype(self)
        self.norm = norm_layer(self.embed_dim, **dd)  # DeepSeek's final norm (Qwen3-VL's ViT has none)
        self.fc_norm = norm_layer(self.head_hidden_size, affine=False, **dd)  # as Qwen3-VL's, but an RMSNorm


def is_deepseek(state_dict: dict[str, Any]) -> bool:
    """timm's DeepSeek files (the classifiers' ``encoder.`` without the position tables of Qwen3-VL's and Gemma 4's, the
    encoders' ``aligner.``) and DeepSeek's own shards (``vision.*``, as timm's filter tells them)."""
    tables = ("encoder.pos_embed", "encoder.patch_embed.position_embedding_table")
    return ("encoder.patch_embed.proj.weight" in state_dict and not any(key in state_dict for key in tables)) or \
        "aligner.fc1.weight" in state_dict or any(key.startswith("vision.") for key in state_dict)


def describe_deepseek(state_dict: dict[str, Any]) -> Description:
    """The twin a DeepSeek file describes (prefix, aligner), its sizes (heads: width / 64, no file says; 1024 / 16)."""
    prefix = next(p for p in ("encoder.", "vision.", "") if f"{p}patch_embed.proj.weight" in state_dict)
    patch = state_dict[f"{prefix}patch_embed.proj.weight"]  # [C, 3, p, p], DeepSeek's own [C, 3 p p]
    width = int(patch.shape[0])
    fc2 = next(v for k, v in state_dict.items() if re.fullmatch(rf"{prefix}blocks\.0\.mlp\.(fc2|w2)\.weight", k))
    args: dict[str, Any] = dict(embed_dim=width, depth=depth_of(state_dict, f"{prefix}blocks"),
                                num_heads=max(1, width // 64), mlp_ratio=fc2.shape[1] / width,
                                patch_size=int(patch.shape[-1] if patch.ndim == 4 else math.isqrt(patch.shape[1] // 3)))
    fc1 = next((v for k, v in state_dict.items() if re.fullmatch(r"(encoder\.)?aligner\.(fc1|w1)\.weight", k)), None)
    if fc1 is not None:
        args.update(aligner_out_features=int(fc1.shape[0]), downsample_ratio=math.isqrt(fc1.shape[1] // width))
    if prefix == "encoder.":
        args.update(num_classes=int(state_dict["head.weight"].shape[0]) if "head.weight" in state_dict else 0)
        return f"vit_rope_deepseek_vit_412m{'_align' if fc1 is not None else ''}", args
    return "vit_rope_deepseek_vit_412m_enc", args


def from_deepseek(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """A DeepSeek file (timm's, or DeepSeek's own shard through timm's checkpoint filter) in our keys and q/k layout."""
    check_twin(model, isinstance(model, DeepseekVisionTransformer), f"{SOURCE} or DeepSeek's own vision shard",
               "the vit_rope_deepseek_vit_* twins (and vit_rope.from_timm of timm's model)", "rotate_half")
    # timm's filter reads these two only; an aligner always there, so that its keys come out and are reported here
    shim = SimpleNamespace(encoder=SimpleNamespace(aligner=True, patch_embed=model.patch_embed))
    timm_keys = timm_deepseek.checkpoint_filter_fn_classifier(state_dict, shim)
    outside = len(state_dict) - len(timm_keys)
    return tower_keys(timm_keys, model, "aligner.", SOURCE, "aligner; the *_align and *_enc twins keep it", ROTATE_HALF,
                      f"{outside} tensors outside the vision tower and aligner dropped, as timm's checkpoint filter "
                      "drops them (a DeepSeek shard's language model)" if outside else "")


def architecture(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The twin's name and keyword arguments that a built timm DeepSeek ``model`` decides."""
    name, enc, block, args = timm_tower(model, timm_deepseek.DeepseekVitClassifier, "align")
    args.update(img_size=tuple(enc.patch_embed.img_size), patch_size=enc.patch_embed.patch_size[0],
                mlp_ratio=block.mlp.fc2.in_features / enc.embed_dim, rope_theta=float(enc.rope.temperature),
                norm_layer=partial(RmsNorm, eps=block.norm1.eps), dynamic_img_pad=enc.patch_embed.dynamic_img_pad,
                downsample_ratio=enc.downsample_ratio,
                aligner_out_features=0 if enc.aligner is None else enc.aligner.out_features)
    return f"vit_rope_{name}", args
