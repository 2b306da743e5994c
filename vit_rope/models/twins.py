"""What the twins of timm's VLM vision towers (Qwen3-VL, DeepSeek, Gemma 4) share: timm's three heads around the VLM's
projector, the cfgs of timm's hub files and the reading of their keys and of a built timm model."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from timm.layers import get_device_dtype
from timm.models import list_pretrained, resolve_pretrained_cfg
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.models.embedding import Embedded
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.weights import Converted


class ProjectorTwin(RoPEVisionTransformer):
    """``RoPEVisionTransformer`` with timm's VLM-tower heads: the classifier (``global_pool="avg"``: token mean,
    affine-free norm, linear; ``""``: per token), the same over the projector's tokens (``encoder_pool=TOKENS``), the
    encoder (``global_pool=TOKENS``); ``forward_features`` feeds ``PROJECTOR(x, grid, coord, valid, pre_logits)``."""

    FAMILY, TOKENS, PROJECTOR = "", "", ""  # the family's name in errors, the encoders' pool, the projector's place

    def __init__(self, global_pool: str = "avg", encoder_pool: str = "", **kwargs: Any) -> None:
        tokens = self.TOKENS
        if global_pool not in ("", "avg", tokens) or encoder_pool not in ("", tokens):
            raise ValueError(f"{self.FAMILY} twins take global_pool '', 'avg' or '{tokens}' and encoder_pool '' or "
                             f"'{tokens}' (timm's), got global_pool={global_pool!r}, encoder_pool={encoder_pool!r}.")
        super().__init__(global_pool="avg" if global_pool == self.TOKENS else global_pool, final_norm=False,
                         fc_norm=False, **kwargs)
        self.global_pool, self.encoder_pool = global_pool, encoder_pool

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's linear head of the pooled width; classes asked of an encoder make it its projector tokens' head."""
        if global_pool is not None:
            self.global_pool = global_pool
        if num_classes > 0 and getattr(self, "global_pool", None) == self.TOKENS:
            self.global_pool, self.encoder_pool = "avg", self.TOKENS
        self.num_classes = num_classes
        width = getattr(self, "head_hidden_size", self.embed_dim)
        head = nn.Linear(width, num_classes, **get_device_dtype(self)) if num_classes > 0 else nn.Identity()
        self.head = head.train(self.training)  # in the model's mode, as timm's (its model suite checks it)

    def _forward_head(self, x: Tensor, embedded: Embedded) -> Tensor:
        """``forward``'s head: the projector on an image batch's grid or at a NaFlex batch's coordinates first."""
        return self.forward_head(x, patch_valid=embedded.valid, grid=embedded.positions.grid,
                                 patch_coord=embedded.coord)

    def forward_head(self, x: Tensor, pre_logits: bool = False, patch_valid: Tensor | None = None,
                     grid: tuple[int, int] | None = None, patch_coord: Tensor | None = None) -> Tensor:
        """The projector (if any) over tokens on ``grid`` (``None``: square) or at ``patch_coord``, then timm's head."""
        projector = getattr(self, self.PROJECTOR)
        if projector is not None:
            if patch_valid is not None and patch_coord is None:
                raise ValueError(f"The {self.PROJECTOR} of a NaFlex batch needs its patch_coord: pass "
                                 "patch_coord=... with patch_valid.")
            tokens, valid = self.global_pool == self.TOKENS, None if patch_valid is None else patch_valid.bool()
            if valid is None and not grid:  # a square one
                grid = (side := int(x.shape[1] ** 0.5), side)
                if side * side != x.shape[1]:
                    raise ValueError(f"forward_head got {x.shape[1]} tokens, which make no square grid: pass the grid, "
                                     "forward_head(x, grid=(h, w)), for a non-square input (forward does).")
            x, patch_valid = projector(x, grid if valid is None else None, patch_coord, valid, pre_logits and tokens)
            if tokens:
                return x
        return super().forward_head(x, pre_logits, patch_valid)


def timm_twin_cfgs(family: str, names: Iterable[str], **cfg: Any) -> dict[str, dict[str, Any]]:
    """``{twin.tag: cfg}`` of ``timm.models.<family>``'s ``names``: timm's hub files via our filter, and ``cfg``."""
    default_cfgs = importlib.import_module(f"timm.models.{family}").default_cfgs
    return {f"vit_rope_{name}.{tag}": dict(tagged.to_dict(), hf_hub_id=f"timm/{name}.{tag}",
                                           first_conv="patch_embed.proj", **cfg)
            for name in names for tag, tagged in default_cfgs[name].cfgs.items()}


def tagged(create: Callable[..., nn.Module], key: str, width: Callable[[str, str], int]) -> Callable[..., nn.Module]:
    """Entry point defaulting ``key`` (projector width) to ``width(name, tag)``: one name, the LLM of each tag."""

    @wraps(create)
    def create_tagged(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        if key not in kwargs:
            cfg = resolve_pretrained_cfg(create.__name__, pretrained_cfg=kwargs.get("pretrained_cfg"))
            kwargs[key] = width(create.__name__, cfg.tag)
        return create(pretrained, **kwargs)

    return create_tagged


def timm_tags(name: str) -> list[str]:
    """The tags of timm's pretrained weights for model ``name``."""
    return [pretrained.split(".", 1)[1] for pretrained in list_pretrained(f"{name}.*")]


def projector_width(resolve: Callable[[str, str], int], key: str, name: str, tag: str) -> int:
    """The projector width timm's ``resolve`` gives VLM twin ``name``'s weights ``tag``; another tag: an error naming
    timm's tags, or 0 for a classifier (without ``key``: Qwen3-VL's merger has no fc2, DeepSeek refuses an aligner)."""
    variant = name.removeprefix("vit_rope_")
    try:
        return resolve(variant, tag)
    except ValueError:
        if not variant.endswith(("_merge", "_align", "_enc")):
            return 0
        tags = ", ".join(timm_tags(variant))
        raise ValueError(f"{name} has no projector width for the weights' tag {tag!r}, not one of timm's ({tags}): "
                         f"pass {key}, the language model's width.") from None


def timm_tower(model: nn.Module, classifier_cls: type[nn.Module], tokens: str, models: str = "",
               refusals: Callable[[nn.Module, nn.Module], dict[str, bool]] | None = None
               ) -> tuple[str, nn.Module, nn.Module, dict[str, Any]]:
    """A built timm VLM tower's name, encoder, first block and the twin arguments all families share (sizes, heads).
    Raises ``ValueError`` on the first of the family's ``refusals(encoder, block)`` (``models``: what the twin models),
    a classifier's final norm or an encoder's pool other than ``tokens``, saying what to build instead."""
    classifier = isinstance(model, classifier_cls)
    enc = model.encoder if classifier else model
    name, block = model.pretrained_cfg["architecture"], enc.blocks[0]
    family = {field: (bad, f"it models {models} only", "build timm's model without it")
              for field, bad in (refusals(enc, block) if refusals else {}).items()}
    refused = {**family,
               "final_norm=False": (classifier and isinstance(model.norm, nn.Identity),
                                    "its classifier norm is timm's default", "build timm's model without final_norm"),
               f"global_pool={enc.global_pool!r}": (
                   not classifier and enc.global_pool != tokens, f"it outputs the {tokens!r} pool's tokens",
                   f"build it with global_pool={tokens!r}, or take vit_rope_{name.removesuffix('_enc')}, whose "
                   "forward_features gives those tokens")}
    for field, (bad, reason, fix) in refused.items():
        if bad:
            raise ValueError(f"from_timm: {name} was built with {field}, which its twin vit_rope_{name} does not "
                             f"model ({reason}): {fix}.")
    pools = {"none": ""}  # timm's "none": no pooling, ours ""
    heads = dict(num_classes=model.num_classes, global_pool=pools.get(model.global_pool, model.global_pool),
                 encoder_pool=pools.get(model.encoder_pool, model.encoder_pool)) if classifier else \
        dict(global_pool=tokens, num_classes=0)
    return name, enc, block, dict(in_chans=enc.in_chans, embed_dim=enc.embed_dim, depth=len(enc.blocks),
                                  num_heads=block.attn.num_heads, **heads)


ROTATE_HALF = "q/k rows of every head permuted from rotate-half to interleaved pairs"  # the Qwen-VL families' note


def conversion_notes(source: str, done: str, dropped: list[str], lacks: str, *other: str) -> tuple[str, ...]:
    """Notes after ``source``: ``done``, ``other`` (empty: skipped), keys ``dropped`` (the model has no ``lacks``)."""
    dropped_note = f"{', '.join(dropped)} dropped: this model has no {lacks}" if dropped else ""
    return tuple(f"{source}: {note}" for note in (done, *other, dropped_note) if note)


def tower_keys(state_dict: dict[str, Tensor], model: nn.Module, projector: str, source: str, lacks: str,
               done: str = ROTATE_HALF, *other: str) -> Converted:
    """A timm VLM tower's state dict in our keys and q/k layout, and its notes: ``encoder.`` cut, ``projector`` keys as
    ``patch_merger.`` (dropped where the model lacks the merger or the layer, an ``nn.Identity`` fc2)."""
    attn, merger = model.blocks[0].attn, model.patch_merger
    index = qk_permutation("rotate_half", attn.head_dim)
    out, dropped = {}, []
    for key, value in state_dict.items():
        key = key.removeprefix("encoder.")
        if key.startswith(projector):
            layer = key.removeprefix(projector).split(".")[0]
            if merger is None or isinstance(getattr(merger, layer, None), nn.Identity):
                dropped.append(key)
                continue
            key = "patch_merger." + key.removeprefix(projector)
        if re.fullmatch(r"blocks\.\d+\.attn\.qkv\.(weight|bias)", key):
            value = permute_qk_rows(value, index, attn.num_heads)
        out[key] = value
    return out, conversion_notes(source, done, dropped, lacks, *other)
