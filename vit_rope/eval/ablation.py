"""Position ablation: how much of a trained model's output its position encoding makes (docs/evaluation.md).

A ViT without a position encoding still learns to classify (CPVT, Chu et al., ICLR 2023), so a model that barely uses
its encoding gives the same logits under any policy: its policies agree for that reason, not because both hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.models.vit import RoPEVisionTransformer


@contextmanager
def without_positions(model: RoPEVisionTransformer) -> Iterator[RoPEVisionTransformer]:
    """Run ``model`` without its position encoding inside the block: a pre-hook on each block drops it, the APE's patch
    rows become their mean (what they share says nothing about where a patch is); other models are refused."""
    if not isinstance(model, RoPEVisionTransformer):
        raise TypeError(f"without_positions takes a vit_rope model (RoPEVisionTransformer); got "
                        f"{type(model).__name__}, whose position encoding it cannot find: pass the vit_rope model "
                        "itself (a compiled or DDP-wrapped one as ._orig_mod or .module)")
    handles = [blk.register_forward_pre_hook(_no_encoding, with_kwargs=True) for blk in model.blocks]
    pos_embed = getattr(model, "pos_embed", None)
    saved = None if pos_embed is None else pos_embed.detach().clone()
    try:
        if pos_embed is not None:
            with torch.no_grad():
                patches = pos_embed[:, 0 if model.no_embed_class else model.num_prefix_tokens:]  # [1, N, C]
                patches.copy_(patches.mean(1, keepdim=True).expand_as(patches))
        yield model
    finally:
        for handle in handles:
            handle.remove()
        if saved is not None:
            with torch.no_grad():
                pos_embed.copy_(saved)


def _no_encoding(block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    return args[:1], {**kwargs, "encoding": None}  # the tokens only: no input from any encoding


@torch.no_grad()
def position_reliance(model: RoPEVisionTransformer, images: Tensor | dict[str, Tensor]) -> dict[str, float]:
    """The mean relative change of ``model``'s outputs without its position encoding, and the top-1 kept."""
    training = model.training
    model.eval()
    try:
        outputs = model(images)  # [B, num_classes] or [B, C]
        with without_positions(model):
            blind = model(images)
    finally:
        model.train(training)
    change = (blind - outputs).norm(dim=-1) / outputs.norm(dim=-1).clamp_min(1e-12)  # [B]
    report = {"output_change": float(change.mean())}
    if model.num_classes > 0:
        report["predictions_kept"] = float((blind.argmax(-1) == outputs.argmax(-1)).float().mean())
    return report
