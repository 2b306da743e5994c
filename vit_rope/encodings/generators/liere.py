"""LieRE: rotations ``exp(p_x A_x + p_y A_y)`` from learned skew-symmetric generators that need not commute.

Ostmeier et al., ICML 2025, arXiv:2406.10322; github.com/StanfordMIMI/LieRE at b27b41ba. One set for every block by
default: the official forward turns every block by layer 0's, so the checkpoints were trained that way. Its official
image classifiers (``models/rope_vit.py``) are our ``vit_rope_*_patch16_liere_224`` with the arguments their shapes
give (``FORMAT``); the training size is not saved (224 px, the ImageNet recipe's), and generators saved per layer are
reduced to layer 0's (docs/models.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.encodings.base import EncodingSpec, PositionEncoding, register
from vit_rope.encodings.generators.block_rotation import BlockRotation, check_block
from vit_rope.encodings.policies import ResolutionPolicy, by_grid, grid_units
from vit_rope.weights import Converted, Description, Format, renamed_key


def liere_positions(coord: Tensor, grids: Tensor, train_grid: tuple[int, int], policy: str) -> Tensor:
    """``i / (m - 1)`` (x, y) on an ``m``-patch axis, under ``extrapolate`` (the official) times ``m / n``."""
    xy, size, train = grid_units(coord, grids, train_grid)
    return by_grid(xy, (size - 1).clamp_min(1) * (1.0 if policy == "interpolate" else train / size))


# FX (timm's and torchvision's tracers): recorded as one call, whose branches on shapes the trace cannot take
torch.fx.wrap("liere_positions")


class LieRE(BlockRotation):
    """LieRE's generators: ``generator_raw_params`` ``[2, L, G, g, g]`` as officially (axes (y, x), ``L`` 1 or depth,
    ``G = heads * D / g`` head-major, or ``D / g``), upper triangle used."""

    def __init__(self, depth: int, num_heads: int, head_dim: int, train_grid: tuple[int, int],
                 policy: str | dict | ResolutionPolicy | None = None, generator_dim: int = 8, per_head: bool = True,
                 per_layer: bool = False) -> None:
        super().__init__("liere", depth, train_grid, policy, None, per_layer)
        self.generator_dim = check_block("encoding_options['generator_dim']", generator_dim, head_dim)
        self.heads = num_heads if per_head else 1
        count = self.heads * (head_dim // generator_dim)
        self.generator_raw_params = nn.Parameter(
            torch.rand(2, depth if per_layer else 1, count, generator_dim, generator_dim) * 2 * math.pi)

    def generators(self) -> Tensor:
        upper = torch.triu(self.generator_raw_params, diagonal=1)  # [2, L, G, g, g]
        skew = (upper - upper.transpose(-1, -2)).unflatten(2, (self.heads, -1))  # [2, L, H or 1, m, g, g]
        return skew.permute(1, 2, 0, 3, 4, 5).flip(2)  # [L, H or 1, 2, m, g, g], axes (y, x) -> (x, y)

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return liere_positions(coord, grids, self.train_grid, self.policy_name)

    def prune_(self, depth: int) -> None:
        if self.per_layer:
            self.generator_raw_params = nn.Parameter(self.generator_raw_params.data[:, :depth])
        self.depth = depth
        self.clear_()

    def no_weight_decay(self) -> set[str]:
        """Weight decay would pull the generators towards no rotation at all."""
        return {"generator_raw_params"}

    def extra_repr(self) -> str:
        _, _, G, g, _ = self.generator_raw_params.shape
        return f"{super().extra_repr()}, heads={self.heads}, generators={G}x{g}x{g}, per_layer={self.per_layer}"


@register("liere", options=("generator_dim", "per_head", "per_layer"))
def _liere(spec: EncodingSpec) -> PositionEncoding:
    return LieRE(spec.depth, spec.num_heads, spec.head_dim, spec.train_grid, spec.policy, **spec.options)


FORMAT_NAME = "LieRE's official RoPEViT"
MARKER = "position_encoder.generator_raw_params"
HEAD_DIM = 64  # FlexibleAttention: "Only support 64 head size for now."
TRAIN_SIZE = 224  # lightning_conf/imagenet_224.yaml: the size the format does not save
# the official keys (after transformer.layers.{i}.) -> ours (after blocks.{i}.)
_LAYER_KEYS = {"0.norm": "norm1", "0.fn.to_qkv": "attn.qkv", "0.fn.to_out.0": "attn.proj", "1.norm": "norm2",
               "1.fn.net.0": "mlp.fc1", "1.fn.net.3": "mlp.fc2"}
_TOP_KEYS = {"cls_token": "cls_token", "mlp_head.0.": "norm.", "mlp_head.1.": "head.",
             "to_patch_embedding.1.bias": "patch_embed.proj.bias", MARKER: "pos_encoding.generator_raw_params"}


def _plain(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    return {key.removeprefix("model."): value for key, value in state_dict.items()}


def is_liere_checkpoint(state_dict: Any) -> bool:
    return any(key.removeprefix("model.") == MARKER for key in state_dict)


def liere_args(state_dict: Mapping[str, Any]) -> Description:
    """The ``timm.create_model`` arguments of an official checkpoint, from its shapes (the whole architecture)."""
    sd = _plain(state_dict)
    needed = ("cls_token", "to_patch_embedding.1.weight", "transformer.layers.0.1.fn.net.0.weight",
              "mlp_head.1.weight", MARKER)
    missing = [key for key in needed if key not in sd]
    if missing:
        raise ValueError(f"The checkpoint has {MARKER} but lacks {', '.join(missing)}: {FORMAT_NAME}s have all of "
                         f"{', '.join(needed)}. Save the whole model's state_dict.")
    dim = int(sd["cls_token"].shape[-1])
    patch = math.isqrt(int(sd["to_patch_embedding.1.weight"].shape[1]) // 3)
    if 3 * patch * patch != sd["to_patch_embedding.1.weight"].shape[1] or dim % HEAD_DIM:
        raise ValueError(f"The checkpoint's patch embedding takes {sd['to_patch_embedding.1.weight'].shape[1]} "
                         f"values and its width is {dim}: vit_rope builds {FORMAT_NAME}s of square RGB patches "
                         f"(3 p^2 values) and heads of {HEAD_DIM} channels.")
    heads = dim // HEAD_DIM
    depth = 1 + max(int(m[1]) for key in sd if (m := re.match(r"transformer\.layers\.(\d+)\.", key)))
    generators = sd[MARKER]  # [2, L, G, g, g]
    size = generators.shape[-1]
    options = {"generator_dim": int(size), "per_head": int(generators.shape[2]) == heads * (HEAD_DIM // size)}
    hidden = int(sd["transformer.layers.0.1.fn.net.0.weight"].shape[0])
    kwargs = dict(embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim, patch_size=patch,
                  img_size=TRAIN_SIZE, num_classes=int(sd["mlp_head.1.weight"].shape[0]), qkv_bias=False,
                  init_values=0.0,  # no LayerScale (timm.create_model drops arguments that are None)
                  norm_layer=partial(nn.LayerNorm, eps=1e-5), class_token=True, global_pool="token",
                  encoding="liere", encoding_options=options)
    return None, kwargs


def from_liere(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    """An official checkpoint in our keys for the LieRE ``model``, with notes; the caller checks shapes."""
    if getattr(model, "encoding_kind", None) != "liere":
        raise ValueError(f"The checkpoint is {FORMAT_NAME} with LieRE generators; the model has encoding="
                         f"{getattr(model, 'encoding_kind', None)!r}: load it into a vit_rope_*_patch16_liere_224 "
                         "model (create_from_checkpoint builds the one it describes).")
    sd = _plain(state_dict)
    table = sd.pop("pos_embedding", None)
    if table is not None and table.abs().max() > 0:
        raise ValueError(f"The checkpoint's pos_embedding is not zero (max |value| {float(table.abs().max()):.3g}): "
                         "a LieRE model trained with absolute encodings as well, which vit_rope does not build.")
    notes = [f"{FORMAT_NAME}: keys renamed to ours, the linear patch embedding as a convolution"]
    out = {}
    for key, value in sd.items():
        match = re.fullmatch(r"transformer\.layers\.(\d+)\.(\d\.norm|\d\.fn\.\w+(?:\.\d)?)\.(weight|bias)", key)
        if match:
            out[f"blocks.{match[1]}.{_LAYER_KEYS[match[2]]}.{match[3]}"] = value
        elif key == "to_patch_embedding.1.weight":  # [D, p * p * 3], pixels in (p1 p2 c) order -> [D, 3, p, p]
            patch = math.isqrt(value.shape[1] // 3)
            out["patch_embed.proj.weight"] = value.view(value.shape[0], patch, patch, 3).permute(0, 3, 1, 2)
        else:
            out[renamed_key(key, _TOP_KEYS)] = value
    generators = out.get("pos_encoding.generator_raw_params")
    if generators is not None and generators.shape[1] > 1 and not model.pos_encoding.per_layer:
        out["pos_encoding.generator_raw_params"] = generators[:, :1]
        notes.append("generators per layer reduced to layer 0's, which the official forward turns every block by")
    return out, tuple(notes)


FORMAT = Format(FORMAT_NAME, f"'{MARKER}'", is_liere_checkpoint, from_liere, liere_args)
