"""Twin of transformers' Qwen2.5-VL vision encoder (``Qwen2_5_VisionTransformerPretrainedModel``, transformers 5.24):
``vit_rope_qwen2_5_vl_vit``. Qwen2.5-VL (arXiv:2502.13923) makes Qwen2-VL's ViT LLaMA-style, axial RoPE alone, most
layers windowed (``Windowed``): where transformers reorders tokens by window, ours keeps them row-major (attention in a
window ignores order), for any grid or NaFlex batch."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple
from torch import Tensor, nn

from vit_rope.encodings.base import LazyBlockInputs, image_coords
from vit_rope.layers.attention import BlockInput, block_input
from vit_rope.layers.eva import PackedSwiGLU
from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models.qwen3_vit import Qwen3VisionTransformer
from vit_rope.models.twins import ROTATE_HALF, tower_keys
from vit_rope.weights import Converted, check_config_fields, check_twin, depth_of

SOURCE = "transformers' Qwen2.5-VL vision encoder (Qwen2_5_VisionTransformerPretrainedModel)"
NAME = "vit_rope_qwen2_5_vl_vit"
HF_CLASS = "Qwen2_5_VisionTransformerPretrainedModel"
MODEL_TYPES = ("qwen2_5_vl", "qwen2_5_vl_vision")  # the VLM's config.json (vision_config inside), the tower's own
QWEN25: dict[str, dict[str, Any]] = {NAME: dict(
    img_size=448, patch_size=14, embed_dim=1280, depth=32, num_heads=16, mlp_ratio=3420 / 1280, class_token=False,
    qkv_bias=True, norm_layer=partial(RmsNorm, eps=1e-6), act_layer=nn.SiLU, mlp_layer=PackedSwiGLU, pos_embed="none",
    encoding="axial", rope_theta=1e4, resolution_policy="extrapolate", qk_layout="rotate_half", num_classes=0,
    global_pool="merge", merger_out_features=3584, window_size=112, fullatt_block_indexes=(7, 15, 23, 31))}
# Qwen2_5_VLVisionConfig's defaults (transformers 5.24), which a config.json may leave out (hidden_size: its 3584)
_DEFAULTS: dict[str, Any] = dict(
    depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
    spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
    fullatt_block_indexes=[7, 15, 23, 31], rope_parameters={"rope_type": "axial", "rope_theta": 1e4})
# fields that do not change a still image's features: bookkeeping, the LLM's video time scale, the summed time kernel
_IGNORED = set("_name_or_path architectures chunk_size_feed_forward dtype torch_dtype id2label label2id "
               "is_encoder_decoder output_attentions output_hidden_states problem_type return_dict "
               "transformers_version model_type initializer_range tokens_per_second temporal_patch_size in_chans "
               "spatial_patch_size".split())


class Windowed(BlockInput):
    """A windowed block's input: an image batch's windows as a batch of their own (edge ones padded, padding keys
    masked: ``keys``); a NaFlex batch or a capture (``grid`` None) takes ``mask``; both once per forward, shared."""

    def __init__(self, inner: BlockInput, mask: Callable[[], Tensor], keys: Tensor | None, side: int,
                 grid: tuple[int, int] | None) -> None:
        self.inner, self.mask, self.keys, self.side, self.grid = inner, mask, keys, side, grid

    bias = property(lambda self: self.mask())  # the NaFlex or captured form's, on first use

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.inner.project(attn, x)

    def attend(self, attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        if self.grid is None or attn_mask is not None or is_causal or not attn.fused_attn:
            return super().attend(attn, q, k, v, attn_mask, is_causal)
        (h, w), s, (B, nh, N, D) = self.grid, self.side, q.shape
        drop = attn.attn_drop.p if attn.training else 0.0
        out = F.scaled_dot_product_attention(*(windows(x, self.grid, s) for x in (q, k, v)), attn_mask=self.keys,
                                             dropout_p=drop, scale=attn.scale)  # [B nW, nh, s s, D]
        out = out.view(B, -(-h // s), -1, nh, s, s, D).permute(0, 3, 1, 4, 2, 5, 6).flatten(4, 5).flatten(2, 3)
        return out[:, :, :h, :w].reshape(B, nh, N, D)  # [B, nh, H, W, D], whole windows, cut to the grid


def windows(x: Tensor, grid: tuple[int, int], s: int) -> Tensor:
    """Tokens ``[b, n, h w, d]`` of a row-major ``grid`` as its windows ``[b nW, n, s s, d]``, edge ones padded."""
    (h, w), (b, n, _, d) = grid, x.shape
    H, W = -(-h // s) * s, -(-w // s) * s
    x = F.pad(x.view(b, n, h, w, d), (0, 0, 0, W - w, 0, H - h)).view(b, n, H // s, s, W // s, s, d)
    return x.permute(0, 2, 4, 1, 3, 5, 6).reshape(-1, n, s * s, d)


def window_bias(coord: Tensor, side: int) -> Tensor:
    """Additive mask: 0 where query and key share a ``side`` window (tiled from the top-left, as transformers')."""
    cell = coord.div(side, rounding_mode="floor")  # [(B,) N, 2]: each patch's window (row, column)
    same = (cell[..., :, None, :] == cell[..., None, :, :]).all(-1)  # [(B,) N, N]
    same = same if same.dim() == 3 else same[None]
    return torch.zeros(same.shape, device=coord.device).masked_fill_(~same, float("-inf"))[:, None]


torch.fx.wrap("window_bias")  # one call under FX (it reads the coordinates' rank), from the blocks' input hook too


class Qwen25VisionTransformer(Qwen3VisionTransformer):
    """``Qwen3VisionTransformer``, windowed (``window_size`` px, whole merger blocks) but ``fullatt_block_indexes``."""

    def __init__(self, window_size: int = 112, fullatt_block_indexes: Sequence[int] = (7, 15, 23, 31),
                 **kwargs: Any) -> None:
        taken = {key: kwargs[key] for key in ("class_token", "reg_tokens", "patch_drop_rate") if kwargs.get(key)}
        if taken:
            raise ValueError(f"{NAME} models Qwen2.5-VL's tower, which has no class or register tokens and whose "
                             f"windows follow every patch of the grid: got {taken}; leave them unset.")
        super().__init__(**kwargs)
        self.patch_embed.proj.bias = None  # Qwen-VL's patch Conv3d has none
        merge, patch = kwargs.get("merge_size", 2), self.patch_embed.patch_size[0]
        if window_size // (merge * patch) < 1:
            raise ValueError(f"window_size={window_size} px holds no {merge}x{merge} block of {patch} px patches: give "
                             f"at least {merge * patch} (Qwen2.5-VL's is 112).")
        self.window_size, self.window = window_size, window_size // (merge * patch) * merge  # px; patches per side
        self.fullatt_block_indexes = tuple(int(i) for i in fullatt_block_indexes)
        if any(not 0 <= i < len(self.blocks) for i in self.fullatt_block_indexes):
            raise ValueError(f"fullatt_block_indexes={list(self.fullatt_block_indexes)} names blocks a model of depth "
                             f"{len(self.blocks)} does not have: give indexes below {len(self.blocks)} (with depth, "
                             "set them too).")

    def _block_inputs(self, embedded: Any) -> Sequence[Any]:
        """The encoding's inputs, the windowed blocks' with the window masks (one of each per forward, shared)."""
        inputs = super()._block_inputs(embedded)
        grid = embedded.positions.grid
        coord = image_coords(*grid, embedded.tokens.device)[0] if grid is not None else embedded.coord
        mask = cache(lambda: window_bias(coord, self.window))
        gathered = None if embedded.positions.captured else grid  # a capture's graph serves every size: the mask
        keys = None  # which keys of each gathered window are patches, [B nW, 1, 1, s s]; whole windows need none
        if gathered is not None and (grid[0] % self.window or grid[1] % self.window):
            ones = embedded.tokens.new_ones(1, 1, grid[0] * grid[1], 1)
            keys = windows(ones, grid, self.window).bool().transpose(-1, -2).repeat(len(embedded.tokens), 1, 1, 1)
        return LazyBlockInputs(lambda i: inputs[i] if i in self.fullatt_block_indexes else Windowed(
            block_input(inputs[i]), mask, keys, self.window, gathered), len(inputs))


def is_qwen25(state_dict: dict[str, Any]) -> bool:
    """transformers' Qwen-VL towers: the merger's ``ln_q`` (Qwen2.5-VL's RMSNorm; Qwen2-VL's LayerNorm has a bias)."""
    return any(key.endswith("merger.ln_q.weight") for key in state_dict)


def _prefix(state_dict: dict[str, Any]) -> str:
    """The tower's key prefix: none, ``visual.`` (hub files) or ``model.visual.`` (transformers 5's VLM class)."""
    return next(key for key in state_dict if key.endswith("merger.ln_q.weight"))[: -len("merger.ln_q.weight")]


def describe_qwen25(state_dict: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The twin, depth and merger width of a file's weights (windows and full blocks are config.json's, else the
    published tower's); no name for a width other than 1280 (the weights hide the head count)."""
    prefix = _prefix(state_dict)
    width = int(state_dict[f"{prefix}patch_embed.proj.weight"].shape[0])
    args = dict(depth=depth_of(state_dict, rf"{re.escape(prefix)}blocks"),
                merger_out_features=int(state_dict[f"{prefix}merger.mlp.2.weight"].shape[0]))
    return (NAME if width == QWEN25[NAME]["embed_dim"] else None), args


_MERGER = re.compile(r"^merger\.(ln_q|mlp\.0|mlp\.2)\.")  # transformers' merger names (timm's: norm, fc1, fc2)
_NAMES = {"ln_q": "norm", "mlp.0": "fc1", "mlp.2": "fc2"}


def from_qwen25(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """transformers' Qwen2.5-VL tower in our keys and q/k layout (then ``tower_keys``), the language model dropped."""
    if any(key.endswith("merger.ln_q.bias") for key in state_dict):
        raise ValueError(f"The checkpoint is transformers' Qwen2-VL vision encoder (its merger norm has a bias: a "
                         f"LayerNorm), which no vit_rope twin models; {NAME} takes Qwen2.5-VL's.")
    check_twin(model, isinstance(model, Qwen25VisionTransformer), SOURCE,
               f"{NAME} (vit_rope.create_from_checkpoint(folder) builds it from config.json)", "rotate_half")
    prefix, tower = _prefix(state_dict), {}
    for key, value in state_dict.items():
        if not key.startswith(prefix):
            continue  # counted below
        key = key[len(prefix):]
        if key == "patch_embed.proj.weight" and value.dim() == 5:
            value = value.sum(2)  # [C, 3, T, p, p] -> [C, 3, p, p]: a still image is the same frame T times
        if m := re.fullmatch(r"(blocks\.\d+\.mlp\.)(gate|up)_proj\.(weight|bias)", key):
            if m[2] == "gate":  # GluMlp's fc1: [gate; up], the gate's half through SiLU
                tower[f"{m[1]}fc1.{m[3]}"] = torch.cat([value, state_dict[f"{prefix}{m[1]}up_proj.{m[3]}"]])
            continue
        tower[_MERGER.sub(lambda m: f"merger.{_NAMES[m[1]]}.", key.replace("mlp.down_proj.", "mlp.fc2."))] = value
    other = sum(not key.startswith(prefix) for key in state_dict)
    lacks = "merger fc2 (merger_out_features=0)" if model.patch_merger else "merger; global_pool='merge' keeps it"
    return tower_keys(tower, model, "merger.", SOURCE, lacks,
                      f"Conv3d patch kernel summed over time, gate / up projections packed, {ROTATE_HALF}",
                      f"prefix {prefix!r} removed, {other} keys outside it (the language model) dropped"
                      if prefix or other else "")


def args_from_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(NAME, keyword arguments)`` that build the tower of a config.json's dict (the VLM's ``vision_config`` or the
    tower's own, transformers' defaults filled in; ``Folder.model``)."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json has model_type {model_type!r}: {NAME} loads transformers' Qwen2.5-VL folders "
                         f"(model_type {' or '.join(map(repr, MODEL_TYPES))}).")
    vision = config.get("vision_config", {}) if model_type == "qwen2_5_vl" else config
    c = {**_DEFAULTS, **vision}
    rope = {**_DEFAULTS["rope_parameters"], **(c["rope_parameters"] or {})}
    unknown = sorted(set(vision) - set(_DEFAULTS) - _IGNORED - {key for key in vision if key.startswith("_")})
    problems = [f"{key}={vision[key]!r}" for key in unknown]
    if c["hidden_act"] != "silu":
        problems.append(f"hidden_act={c['hidden_act']!r} (the twin's SwiGLU is SiLU's)")
    if rope.get("rope_type") != "axial" or set(rope) - {"rope_type", "rope_theta"}:
        problems.append(f"rope_parameters={c['rope_parameters']!r} (the twin's RoPE is axial, with rope_theta only)")
    if c.get("spatial_patch_size", c["patch_size"]) != c["patch_size"]:
        problems.append(f"spatial_patch_size={vision['spatial_patch_size']} (not patch_size)")
    sides = {int(side) for side in to_2tuple(c["patch_size"])}
    if len(sides) != 1:
        problems.append(f"patch_size={c['patch_size']} (the twin's patches are square)")
    if problems:
        raise ValueError(f"config.json describes a Qwen2.5-VL tower with {', '.join(problems)}, which {NAME} does not "
                         "model: it takes the published towers' fields (transformers' Qwen2_5_VLVisionConfig).")
    return NAME, dict(embed_dim=c["hidden_size"], depth=c["depth"], num_heads=c["num_heads"],
                      mlp_ratio=c["intermediate_size"] / c["hidden_size"],
                      in_chans=vision.get("in_channels", vision.get("in_chans", c["in_channels"])),
                      patch_size=sides.pop(), merge_size=c["spatial_merge_size"], window_size=c["window_size"],
                      merger_out_features=c["out_hidden_size"], rope_theta=float(rope["rope_theta"]),
                      fullatt_block_indexes=tuple(c["fullatt_block_indexes"]))


def check_model(config: dict[str, Any], model: nn.Module) -> None:
    """Raise unless ``model`` is the tower of ``config``, naming the first field that differs and both values."""
    _, args = args_from_config(config)
    if not isinstance(model, Qwen25VisionTransformer):
        raise ValueError(f"config.json describes {SOURCE}, which loads into {NAME}; the model is a "
                         f"{type(model).__name__}.")
    block, merger = model.blocks[0], model.patch_merger
    ours = dict(embed_dim=model.embed_dim, depth=len(model.blocks), num_heads=block.attn.num_heads,
                mlp_ratio=block.mlp.fc2.in_features / model.embed_dim, in_chans=model.patch_embed.proj.in_channels,
                patch_size=model.patch_embed.patch_size[0], window_size=model.window_size,
                merge_size=merger.merge_size if merger else 2, rope_theta=model.pos_encoding[0].theta,
                merger_out_features=merger.out_features if merger else args["merger_out_features"],  # none: any
                fullatt_block_indexes=model.fullatt_block_indexes)
    check_config_fields({field: (args[field], ours[field]) for field in args}, NAME + " with {field}={theirs}")
