"""Twins of timm's Qwen3-VL vision encoders (``timm.models.qwen3_vit``, timm 1.0.31): ``vit_rope_qwen3_vit_*``.

Qwen3-VL (arXiv:2511.21631) keeps Qwen2-VL's ViT (arXiv:2409.12191); docs/models.md: how the twins depart from timm."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, get_device_dtype
from timm.models.qwen3_vit import Qwen3VitClassifier, _resolve_qwen3_out_features
from torch import Tensor, nn

from vit_rope.models.twins import ProjectorTwin, projector_width, timm_tower, tower_keys
from vit_rope.weights import Converted, check_twin, depth_of

SOURCE = "timm's Qwen3-VL ViT (timm.models.qwen3_vit)"
_WIDTHS = {"88m": dict(embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
           "306m": dict(embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4.0),
           "416m": dict(embed_dim=1152, depth=27, num_heads=16, mlp_ratio=4304 / 1152)}
_COMMON = dict(img_size=768, patch_size=16, class_token=False, qkv_bias=True, norm_layer=partial(LayerNorm, eps=1e-6),
               act_layer="gelu_tanh", pos_embed="learn", no_embed_class=True, pos_embed_grid=(48, 48),
               pos_embed_resampling="bilinear_corners", encoding="axial", rope_theta=1e4, rope_ref_grid=(48, 48),
               resolution_policy="extrapolate", qk_layout="rotate_half", num_classes=0)
_HEADS = {"": dict(global_pool="avg"), "_merge": dict(global_pool="avg", encoder_pool="merge"),
          "_enc": dict(global_pool="merge")}
# timm name -> twin arguments (a merger's width: the weights' tag's, ``llm_width``)
QWEN3: dict[str, dict[str, Any]] = {f"qwen3_vit_{size}{suffix}": dict(_COMMON, **_WIDTHS[size], **head)
                                    for size in _WIDTHS for suffix, head in _HEADS.items()}
llm_width = partial(projector_width, _resolve_qwen3_out_features, "merger_out_features")  # by tag


def merge_blocks(x: Tensor, grid: tuple[int, int], k: int) -> Tensor:
    """Tokens ``[B, h w, C]`` of a row-major ``grid`` as ``[B, h w / k^2, k^2 C]``, each ``k x k`` block row-major."""
    h, w = grid
    if h % k or w % k:
        raise ValueError(f"The patch merger joins {k}x{k} patches, but the patch grid is {h}x{w}: give an input "
                         f"whose sides are multiples of {k} patches.")
    B, _, C = x.shape
    x = x.reshape(B, h // k, k, w // k, k, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, (h // k) * (w // k), k * k * C)


torch.fx.wrap("merge_blocks")  # the grid is checked: under FX a call, not a branch on traced sizes (from any caller)


def scatter_blocks(x: Tensor, coord: Tensor, valid: Tensor, k: int, cols: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """A NaFlex batch's tokens ``[B, L, C]`` at ``coord`` (y, x) as ``count`` blocks of ``k x k`` per sample, ``cols``
    ``[B, 1]`` blocks a row, each row-major: ``[B, count, k k, C]``, with each block's validity (any valid token)."""
    B, _, C = x.shape
    y, xx = coord[..., 0], coord[..., 1]
    slot = ((y // k) * cols + xx // k) * k * k + (y % k) * k + xx % k  # [B, L]: block, then place in it
    slot = torch.where(valid, slot, count * k * k)  # padding to a spill slot, cut below
    out = x.new_zeros(B, count * k * k + 1, C).scatter(1, slot[..., None].expand(-1, -1, C), x)
    merged_valid = torch.zeros(B, count * k * k + 1, dtype=torch.bool, device=x.device).scatter(1, slot, valid)
    return out[:, :-1].reshape(B, count, k * k, C), merged_valid[:, :-1].reshape(B, count, k * k).any(-1)


class PatchMerger(nn.Module):
    """Qwen-VL's projector: a norm per token (Qwen3-VL's LayerNorm, Qwen2.5-VL's RMSNorm), each ``k x k`` block
    concatenated row-major, ``fc1 -> GELU -> fc2`` to the LLM's width (``out_features``; 0: no ``fc2``); timm's keys."""

    def __init__(self, dim: int, merge_size: int = 2, out_features: int = 0,
                 norm_layer: Callable[[int], nn.Module] | None = None, **dd: Any) -> None:
        super().__init__()  # dd: timm's device and dtype, so that a model built on the meta device allocates nothing
        self.merge_size = merge_size
        hidden = dim * merge_size**2
        self.out_features = out_features if out_features > 0 else hidden
        self.norm = (norm_layer or partial(LayerNorm, eps=1e-6))(dim, **dd)
        self.fc1 = nn.Linear(hidden, hidden, **dd)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features, **dd) if out_features > 0 else nn.Identity()

    def merge(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        return merge_blocks(x, grid, self.merge_size)

    def merge_naflex(self, x: Tensor, coord: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """A NaFlex batch's tokens at ``coord`` (y, x) merged per sample as ``merge`` each image, with validity."""
        k = self.merge_size
        width = (coord[..., 1] * valid).amax(1, keepdim=True) + 1  # [B, 1]: each sample's grid width
        blocks, valid = scatter_blocks(x, coord, valid, k, width // k, -(-x.shape[1] // (k * k)))
        return blocks.flatten(2), valid

    def forward(self, x: Tensor, grid: tuple[int, int] | None, coord: Tensor | None = None,
                valid: Tensor | None = None, pre_logits: bool = False) -> tuple[Tensor, Tensor | None]:
        """Tokens on ``grid``, or a NaFlex batch's at ``coord``, merged, with validity; ``pre_logits``: after GELU."""
        x = self.norm(x)
        x, valid = (self.merge(x, grid), None) if valid is None else self.merge_naflex(x, coord, valid)
        x = self.act(self.fc1(x))
        return (x if pre_logits else self.fc2(x)), valid


class Qwen3VisionTransformer(ProjectorTwin):
    """``ProjectorTwin`` with timm's Qwen3-VL merger at ``patch_merger`` (``merger_out_features=0``: no fc2)."""

    FAMILY, TOKENS, PROJECTOR, MERGER = "Qwen3-VL", "merge", "patch_merger", PatchMerger  # MERGER: the class built

    def __init__(self, global_pool: str = "avg", encoder_pool: str = "", merge_size: int = 2,
                 merger_out_features: int = 0, **kwargs: Any) -> None:
        eps = getattr(kwargs.get("norm_layer"), "keywords", {}).get("eps", 1e-6)
        norm_layer = kwargs.get("norm_layer") if callable(kwargs.get("norm_layer")) else partial(LayerNorm, eps=eps)
        num_classes = kwargs.pop("num_classes", 0)
        super().__init__(global_pool, encoder_pool, num_classes=0, **kwargs)
        merge, dd = self.TOKENS in (global_pool, encoder_pool), get_device_dtype(self)
        self.patch_merger = self.MERGER(self.embed_dim, merge_size, merger_out_features, norm_layer, **dd) \
            if merge else None
        self.head_hidden_size = self.patch_merger.out_features if merge else self.embed_dim
        self.fc_norm = LayerNorm(self.head_hidden_size, eps=eps, affine=False, **dd)  # timm's; *_enc skips it
        self.reset_classifier(num_classes)


def is_qwen3(state_dict: dict[str, Any]) -> bool:
    """timm's Qwen3-VL files: the classifiers' ``encoder.pos_embed`` (DeepSeek's lack it), the encoders' ``merger.``."""
    return "encoder.pos_embed" in state_dict or "merger.fc1.weight" in state_dict


def describe_qwen3(state_dict: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The twin a timm Qwen3-VL file describes (width, prefix, merger) and its depth, classes and merger width."""
    prefix = "encoder." if "encoder.patch_embed.proj.weight" in state_dict else ""
    width = int(state_dict[f"{prefix}patch_embed.proj.weight"].shape[0])
    size = next((size for size, args in _WIDTHS.items() if args["embed_dim"] == width), None)
    depth = depth_of(state_dict, f"{prefix}blocks")
    args: dict[str, Any] = {"depth": depth} if depth else {}
    merger = f"{prefix}merger.fc1.weight" in state_dict
    if merger:
        fc2 = state_dict.get(f"{prefix}merger.fc2.weight")
        args["merger_out_features"] = 0 if fc2 is None else int(fc2.shape[0])
    if "head.weight" in state_dict:
        args["num_classes"] = int(state_dict["head.weight"].shape[0])
    suffix = ("_merge" if merger else "") if prefix else "_enc"
    return (None if size is None else f"vit_rope_qwen3_vit_{size}{suffix}"), args


def from_qwen3(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """timm's Qwen3-VL state dict in our keys and q/k layout (``tower_keys``)."""
    check_twin(model, type(model) is Qwen3VisionTransformer, SOURCE,  # not a subclass: Qwen2.5-VL's, DeepSeek's twins
               "the vit_rope_qwen3_vit_* twins (and vit_rope.from_timm of timm's model; a DeepSeek twin loads timm's "
               "deepseek_vit_* files)", "rotate_half")
    return tower_keys(state_dict, model, "merger.", SOURCE, "merger; the *_merge and *_enc twins keep it"
                      if model.patch_merger is None else "last merger projection (merger_out_features=0)")


def architecture(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The twin's name and keyword arguments that a built timm Qwen3-VL ``model`` decides."""
    name, enc, block, args = timm_tower(
        model, Qwen3VitClassifier, "merge", "Qwen3-VL's GELU (tanh) MLP",
        lambda enc, block: {f"act_layer={type(block.mlp.act).__name__}": not (
            isinstance(block.mlp.act, nn.GELU) and block.mlp.act.approximate == "tanh")})
    grid = (enc.pos_embed_grid_size, enc.pos_embed_grid_size)
    args.update(img_size=tuple(enc.patch_embed.img_size), patch_size=enc.patch_embed.patch_size[0],
                mlp_ratio=block.mlp.fc1.out_features / enc.embed_dim, pos_embed_grid=grid, rope_ref_grid=grid,
                rope_theta=float(enc.rope.temperature), norm_layer=partial(LayerNorm, eps=block.norm1.eps),
                merge_size=enc.merge_size, merger_out_features=enc.out_features if enc.merger is not None else 0)
    return f"vit_rope_{name}", args
