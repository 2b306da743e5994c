"""Twins of timm's Qwen3-VL vision encoders (``timm.models.qwen3_vit``, timm 1.0.31): ``vit_rope_qwen3_vit_*``.

The vision tower of Qwen3-VL (Qwen3-VL Technical Report, arXiv:2511.21631; Qwen3.5 / Qwen3.8 share it) keeps the ViT
of Qwen2-VL (Wang et al. 2024, arXiv:2409.12191): a pre-norm ViT without class token or final norm (LayerNorm 1e-6,
GELU-tanh MLP, fused qkv with bias) with two position encodings together, a learned 48x48 absolute table resampled
bilinearly with align_corners=True to each input grid, and axial 2D RoPE (theta 1e4, integer patch indices from 0,
rotate-half pairs with y first). Its VLM projector ("merger") normalises each token, concatenates every 2x2 block
and maps it with an MLP to the language model's width: the tokens the language model reads.

A twin is a ``RoPEVisionTransformer`` (``encoding="axial"``, ``qk_layout="rotate_half"``, ``pos_embed_grid``,
``pos_embed_resampling="bilinear_corners"``) plus ``PatchMerger``; the three heads of timm's three variants:
``qwen3_vit_*`` (mean of the tokens, a LayerNorm without affine, a linear head), ``*_merge`` (the same after the
merger) and ``*_enc`` (the merger's tokens). ``forward_features`` gives the tokens before the merger ``[B, N, C]`` in
all three; ``forward_head`` applies the merger (docs/models.md says where this departs from timm).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, get_device_dtype
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.models.naflex_batch import naflex_batch
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.weights import Converted, check_twin

SOURCE = "timm's Qwen3-VL ViT (timm.models.qwen3_vit)"
_WIDTHS = {"88m": dict(embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
           "306m": dict(embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4.0),
           "416m": dict(embed_dim=1152, depth=27, num_heads=16, mlp_ratio=4304 / 1152)}
_OUT_FEATURES = {"88m": 1024, "306m": 2560, "416m": 4096}  # timm's default tag's LLM width (qwen3_5_0_8b, ...)
_COMMON = dict(img_size=768, patch_size=16, class_token=False, qkv_bias=True, norm_layer=partial(LayerNorm, eps=1e-6),
               act_layer="gelu_tanh", pos_embed="learn", no_embed_class=True, pos_embed_grid=(48, 48),
               pos_embed_resampling="bilinear_corners", encoding="axial", rope_theta=1e4, rope_ref_grid=(48, 48),
               resolution_policy="extrapolate", qk_layout="rotate_half", num_classes=0)
_HEADS = {"": dict(global_pool="avg"), "_merge": dict(global_pool="avg", encoder_pool="merge"),
          "_enc": dict(global_pool="merge")}
# timm name -> twin arguments (merger_out_features: timm's default tag's; another tag's width is an argument)
QWEN3: dict[str, dict[str, Any]] = {
    f"qwen3_vit_{size}{suffix}": dict(_COMMON, **_WIDTHS[size], **head,
                                      merger_out_features=_OUT_FEATURES[size] if suffix else 0)
    for size in _WIDTHS for suffix, head in _HEADS.items()
}


def merge_blocks(x: Tensor, grid: tuple[int, int], k: int) -> Tensor:
    """Tokens ``[B, h * w, C]`` of a row-major ``grid`` as ``[B, h * w / k^2, k^2 C]``, each ``k x k`` block in
    row-major order."""
    h, w = grid
    if h % k or w % k:
        raise ValueError(f"The patch merger joins {k}x{k} patches, but the patch grid is {h}x{w}: give an input "
                         f"whose sides are multiples of {k} patches.")
    B, _, C = x.shape
    x = x.reshape(B, h // k, k, w // k, k, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, (h // k) * (w // k), k * k * C)


torch.fx.wrap("merge_blocks")  # the grid is checked: under FX a call, not a branch on traced sizes (from any caller)


class PatchMerger(nn.Module):
    """Qwen-VL's projector: a norm per token (``norm_layer``: Qwen3-VL's LayerNorm, Qwen2.5-VL's RMSNorm), each
    ``k x k`` block of tokens concatenated in row-major order, then ``fc1 -> GELU -> fc2`` to the language model's width
    (``out_features``; 0: no ``fc2``). Keys as timm's ``Qwen3VitPatchMerger`` (under ``patch_merger.`` in the twin)."""

    def __init__(self, dim: int, merge_size: int = 2, out_features: int = 0,
                 norm_layer: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.merge_size = merge_size
        hidden = dim * merge_size**2
        self.out_features = out_features if out_features > 0 else hidden
        self.norm = (norm_layer or partial(LayerNorm, eps=1e-6))(dim)
        self.fc1 = nn.Linear(hidden, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features) if out_features > 0 else nn.Identity()

    def merge(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """Tokens ``[B, h * w, C]`` of a row-major ``grid`` as ``[B, h * w / k^2, k^2 C]``."""
        return merge_blocks(x, grid, self.merge_size)

    def merge_naflex(self, x: Tensor, coord: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """A NaFlex batch's tokens ``[B, L, C]`` at ``coord`` ``[B, L, 2]`` (y, x) merged per sample as ``merge`` does
        each image alone: ``[B, ceil(L / k^2), k^2 C]`` with the validity of each merged token (padding: zeros)."""
        k, (B, L, C) = self.merge_size, x.shape
        width = (coord[..., 1] * valid).amax(1, keepdim=True) + 1  # [B, 1]: each sample's grid width
        y, xx = coord[..., 0], coord[..., 1]
        cell = (y // k) * (width // k) + xx // k  # [B, L]: the merged token each patch joins
        slot = cell * k * k + (y % k) * k + xx % k
        M = -(-L // (k * k))
        slot = torch.where(valid, slot, M * k * k)  # padding to a spill slot, cut below
        out = x.new_zeros(B, M * k * k + 1, C).scatter(1, slot[..., None].expand(-1, -1, C), x)
        merged_valid = torch.zeros(B, M * k * k + 1, dtype=torch.bool, device=x.device).scatter(1, slot, valid)
        return out[:, :-1].reshape(B, M, k * k * C), merged_valid[:, :-1].reshape(B, M, k * k).any(-1)

    def project(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.act(self.fc1(x))
        return x if pre_logits else self.fc2(x)

    def forward(self, x: Tensor, grid: tuple[int, int], pre_logits: bool = False) -> Tensor:
        """Merged tokens ``[B, h * w / k^2, out_features]`` of tokens ``[B, h * w, C]`` on ``grid``; ``pre_logits``:
        after ``fc1 -> GELU`` (timm's)."""
        return self.project(self.merge(self.norm(x), grid), pre_logits)


class Qwen3VisionTransformer(RoPEVisionTransformer):
    """``RoPEVisionTransformer`` with the heads of timm's Qwen3-VL ViTs.

    Args:
        global_pool: ``"avg"`` (the classifiers: mean, LayerNorm without affine, head), ``""`` (the same per token)
            or ``"merge"`` (``*_enc``: the merger's tokens are the output).
        encoder_pool: ``"merge"``: the classifier pools the merger's tokens (``*_merge``).
        merge_size, merger_out_features: the merger's block side and output width (0: no last projection).
        **kwargs: ``RoPEVisionTransformer``'s.
    """

    def __init__(self, global_pool: str = "avg", encoder_pool: str = "", merge_size: int = 2,
                 merger_out_features: int = 0, **kwargs: Any) -> None:
        if global_pool not in ("", "avg", "merge") or encoder_pool not in ("", "merge"):
            raise ValueError(f"Qwen3-VL twins take global_pool '', 'avg' or 'merge' and encoder_pool '' or 'merge' "
                             f"(timm's), got global_pool={global_pool!r}, encoder_pool={encoder_pool!r}.")
        eps = getattr(kwargs.get("norm_layer"), "keywords", {}).get("eps", 1e-6)
        norm_layer = kwargs.get("norm_layer") if callable(kwargs.get("norm_layer")) else partial(LayerNorm, eps=eps)
        num_classes = kwargs.pop("num_classes", 0)
        super().__init__(global_pool="avg" if global_pool == "merge" else global_pool, final_norm=False,
                         fc_norm=False, num_classes=0, **kwargs)
        self.global_pool, self.encoder_pool = global_pool, encoder_pool
        merge = global_pool == "merge" or encoder_pool == "merge"
        dd = get_device_dtype(self)
        self.patch_merger = PatchMerger(self.embed_dim, merge_size, merger_out_features, norm_layer).to(**dd) if merge \
            else None
        self.head_hidden_size = self.patch_merger.out_features if merge else self.embed_dim
        # timm's classifiers: a LayerNorm without affine (no weights) after the pooling; *_enc outputs the merger's
        # tokens without it
        self.fc_norm = LayerNorm(self.head_hidden_size, eps=eps, affine=False, **dd)
        self.reset_classifier(num_classes)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A linear head over the pooled width (the merger's with one), as timm's ``Qwen3VitClassifier``; classes
        asked of a ``*_enc`` twin make it the ``*_merge`` classifier (the mean of the merger's tokens, then the head).
        """
        if global_pool is not None:
            self.global_pool = global_pool
        if num_classes > 0 and getattr(self, "global_pool", None) == "merge":
            self.global_pool, self.encoder_pool = "avg", "merge"
        self.num_classes = num_classes
        width = getattr(self, "head_hidden_size", self.embed_dim)
        head = nn.Linear(width, num_classes, **get_device_dtype(self)) if num_classes > 0 else nn.Identity()
        self.head = head.train(self.training)  # in the model's mode, as timm's (its model suite checks it)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                patch_coord: Tensor | None = None, patch_valid: Tensor | None = None) -> Tensor:
        """As ``RoPEVisionTransformer.forward``, the merger between the tokens and the head (a NaFlex batch's merged
        per sample)."""
        batch = naflex_batch(x, patch_coord, patch_valid, attn_mask)
        if batch is not None:
            tokens, _, embedded = self._forward_blocks(batch, self.blocks, is_causal=is_causal)
            return self.forward_head(self.norm(tokens), patch_valid=embedded.valid, patch_coord=batch.coord)
        grid = self.patch_embed.dynamic_feat_size((x.shape[-2], x.shape[-1]))
        return self.forward_head(self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal), grid=grid)

    def forward_head(self, x: Tensor, pre_logits: bool = False, patch_valid: Tensor | None = None,
                     grid: tuple[int, int] | None = None, patch_coord: Tensor | None = None) -> Tensor:
        """The merger (if any) over the tokens ``[B, N, C]`` of ``forward_features`` on ``grid`` (``None``: square) or
        at a NaFlex batch's ``patch_coord``, then timm's pooling, norm and head; ``*_enc``: the merger's tokens."""
        if self.patch_merger is not None:
            enc = self.global_pool == "merge"
            if patch_valid is not None:
                if patch_coord is None:
                    raise ValueError("The merger of a NaFlex batch needs its patch_coord: pass patch_coord=... with "
                                     "patch_valid.")
                merged, patch_valid = self.patch_merger.merge_naflex(self.patch_merger.norm(x), patch_coord,
                                                                     patch_valid.bool())
                x = self.patch_merger.project(merged, pre_logits and enc)
            else:
                x = self.patch_merger(x, grid or _square(x.shape[1]), pre_logits and enc)
            if enc:
                return x
        return super().forward_head(x, pre_logits, patch_valid)


def _square(tokens: int) -> tuple[int, int]:
    side = int(tokens**0.5)
    if side * side != tokens:
        raise ValueError(f"forward_head got {tokens} tokens, which make no square grid: pass the grid, "
                         "forward_head(x, grid=(h, w)), for a non-square input (forward does).")
    return side, side


def twin_cfgs() -> dict[str, dict[str, Any]]:
    """``{twin.tag: cfg}``: timm's (its hub files, read through our checkpoint filter), our keys for the first conv."""
    from timm.models.qwen3_vit import default_cfgs

    cfgs = {}
    for name in QWEN3:
        for tag, cfg in default_cfgs[name].cfgs.items():
            cfgs[f"vit_rope_{name}.{tag}"] = dict(cfg.to_dict(), hf_hub_id=f"timm/{name}.{tag}",
                                                  first_conv="patch_embed.proj", min_input_size=(3, 64, 64))
    return cfgs


def is_qwen3(state_dict: dict[str, Any]) -> bool:
    """timm's Qwen3-VL files: the classifiers' ``encoder.pos_embed`` (timm's DeepSeek classifiers have ``encoder.``
    without it) or the encoder's ``merger.`` (ours: ``patch_merger.``)."""
    return "encoder.pos_embed" in state_dict or "merger.fc1.weight" in state_dict


def describe_qwen3(state_dict: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The twin a timm Qwen3-VL file describes (by its width, prefix and merger) and its depth, classes and merger
    width, for ``create_from_checkpoint`` without a model name."""
    prefix = "encoder." if "encoder.patch_embed.proj.weight" in state_dict else ""
    width = int(state_dict[f"{prefix}patch_embed.proj.weight"].shape[0])
    size = next((size for size, args in _WIDTHS.items() if args["embed_dim"] == width), None)
    blocks = {int(m.group(1)) for key in state_dict if (m := re.match(rf"{prefix}blocks\.(\d+)\.", key))}
    args: dict[str, Any] = {"depth": max(blocks) + 1} if blocks else {}
    merger = f"{prefix}merger.fc1.weight" in state_dict
    if merger:
        fc2 = state_dict.get(f"{prefix}merger.fc2.weight")
        args["merger_out_features"] = 0 if fc2 is None else int(fc2.shape[0])
    if "head.weight" in state_dict:
        args["num_classes"] = int(state_dict["head.weight"].shape[0])
    suffix = ("_merge" if merger else "") if prefix else "_enc"
    return (None if size is None else f"vit_rope_qwen3_vit_{size}{suffix}"), args


def from_qwen3(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """timm's Qwen3-VL state dict in our keys and q/k layout: ``encoder.`` dropped, ``merger.`` as ``patch_merger.``,
    every head's q / k rows permuted from rotate-half (y first) to interleaved x-first pairs."""
    check_twin(model, type(model) is Qwen3VisionTransformer, SOURCE,  # not its subclass, Qwen2.5-VL's twin
               "the vit_rope_qwen3_vit_* twins (and vit_rope.from_timm of timm's model)", "rotate_half")
    head_dim, heads = model.blocks[0].attn.head_dim, model.blocks[0].attn.num_heads
    index = qk_permutation("rotate_half", head_dim)
    merger = model.patch_merger
    out, notes, dropped = {}, [f"{SOURCE}: q/k rows of every head permuted from rotate-half to interleaved pairs"], []
    for key, value in state_dict.items():
        key = key.removeprefix("encoder.")
        if key.startswith("merger."):
            if merger is None or (key.startswith("merger.fc2.") and isinstance(merger.fc2, nn.Identity)):
                dropped.append(key)
                continue
            key = "patch_" + key
        if re.fullmatch(r"blocks\.\d+\.attn\.qkv\.(weight|bias)", key):
            value = permute_qk_rows(value, index, heads)
        out[key] = value
    if dropped:
        notes.append(f"{SOURCE}: {', '.join(dropped)} dropped: this model has no "
                     f"{'merger' if merger is None else 'last merger projection (merger_out_features=0)'}; the "
                     "*_merge and *_enc twins keep it")
    return out, tuple(notes)


def architecture(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The twin's name and keyword arguments that a built timm Qwen3-VL ``model`` decides; a ``ValueError`` naming a
    field the twin does not model."""
    from timm.models.qwen3_vit import Qwen3VitClassifier

    name = model.pretrained_cfg["architecture"]
    classifier = isinstance(model, Qwen3VitClassifier)
    enc = model.encoder if classifier else model
    block = enc.blocks[0]
    act = block.mlp.act
    if not (isinstance(act, nn.GELU) and act.approximate == "tanh"):
        raise ValueError(f"from_timm: {name} was built with act_layer={type(act).__name__}, but its twin "
                         f"vit_rope_{name} models Qwen3-VL's GELU (tanh) MLP only: build timm's model without "
                         "act_layer.")
    if classifier and not isinstance(model.norm, nn.LayerNorm):
        raise ValueError(f"from_timm: {name} was built with final_norm=False, which its twin vit_rope_{name} does not "
                         "model (its classifier norm is timm's default): build timm's model without final_norm.")
    merger = enc.merger
    eps = block.norm1.eps
    args = dict(img_size=tuple(enc.patch_embed.img_size), patch_size=enc.patch_embed.patch_size[0],
                in_chans=enc.in_chans, embed_dim=enc.embed_dim, depth=len(enc.blocks),
                num_heads=block.attn.num_heads, mlp_ratio=block.mlp.fc1.out_features / enc.embed_dim,
                pos_embed_grid=(enc.pos_embed_grid_size, enc.pos_embed_grid_size),
                rope_ref_grid=(enc.pos_embed_grid_size, enc.pos_embed_grid_size),
                rope_theta=float(enc.rope.temperature), norm_layer=partial(LayerNorm, eps=eps),
                merge_size=enc.merge_size, merger_out_features=enc.out_features if merger is not None else 0)
    if classifier:
        args.update(num_classes=model.num_classes, global_pool=model.global_pool, encoder_pool=model.encoder_pool)
    else:
        args.update(global_pool=enc.global_pool or "", num_classes=0)
        if enc.global_pool != "merge":
            raise ValueError(f"from_timm: {name} was built with global_pool={enc.global_pool!r}, which its twin "
                             f"vit_rope_{name} does not model (it outputs the merger's tokens): build it with "
                             "global_pool='merge', or take the vit_rope_qwen3_vit_* classifier twin.")
    return f"vit_rope_{name}", args
