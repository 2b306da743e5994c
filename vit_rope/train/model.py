"""The model a run trains: built from its config, checked against the training sizes, given its starting weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from timm.models.naflexvit import NaFlexVit
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from vit_rope.checks import check_multiple, patch_size
from vit_rope.errors import UserError
from vit_rope.models import embedding
from vit_rope.models.registry import create_model
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.train import state as train_state
from vit_rope.train.config import Config


def new_classifier(state: dict[str, torch.Tensor], net: torch.nn.Module, theirs: list[str] | None, ours: list[str],
                   source: str, say: Callable[[str], None]) -> dict[str, torch.Tensor]:
    """``state`` with the model's own initial classifier when the checkpoint's was trained on other classes (another
    count or other names), as timm's loader does; a model without one (``num_classes=0``) drops the checkpoint's."""
    heads = net.pretrained_cfg.get("classifier") or "head"
    heads = (heads,) if isinstance(heads, str) else tuple(heads)  # DeiT's distilled models have two
    own = net.state_dict()
    other = theirs is not None and list(theirs) != list(ours)
    keys = [key for key in state if any(key.startswith(f"{head}.") for head in heads)]
    fresh = {key: own[key] for key in keys if key in own and (other or state[key].shape != own[key].shape)}
    stale = [key for key in keys if key not in own]
    if fresh or stale:
        say(f"finetune: {source} was trained on other classes than this data set's {len(ours)}: its classifier "
            f"({', '.join(keys)}) is {'replaced by a new one' if fresh else 'dropped (num_classes=0)'}")
    return {**{key: value for key, value in state.items() if key not in stale}, **fresh}


def naflex_patch(net: torch.nn.Module, name: str) -> int:
    """The patch size of a model that takes timm's NaFlex batches with square patches, else a ``UserError``."""
    patch = embedding.naflex_patch(net) if isinstance(net, RoPEVisionTransformer | NaFlexVit) else None
    if patch is None or patch[0] != patch[1]:
        raise UserError(f"naflex=true needs a model that takes NaFlex batches with square patches, and '{name}' "
                        f"({type(net).__name__}) does not; pick a vit_rope_* model or timm's naflexvit_*, or set "
                        "naflex=false")
    return patch[0]


def set_checkpointing(net: torch.nn.Module, every: bool | int, name: str) -> None:
    """Checkpoint ``net``'s blocks as ``grad_checkpointing`` asks: every block, every n-th (ours only) or none."""
    if not every:
        return
    if not hasattr(net, "set_grad_checkpointing"):
        raise UserError(f"grad_checkpointing={every} needs a model with timm's set_grad_checkpointing, and '{name}' "
                        f"({type(net).__name__}) has none; set grad_checkpointing=false")
    ours = isinstance(net, RoPEVisionTransformer)
    if every is not True and every > 1 and not ours:
        raise UserError(f"grad_checkpointing={every} (every {every}th block) needs a vit_rope_* ViT, and '{name}' "
                        f"({type(net).__name__}) checkpoints every block or none: set grad_checkpointing=true")
    net.set_grad_checkpointing(every if ours else True)


def build_model(cfg: Config, classes: list[str], resume: dict[str, Any] | None, finetune: dict[str, Any] | None,
                say: Callable[[str], None]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model and the keyword arguments it was built with, given its weights."""
    dynamic = {"dynamic_img_size": True} if cfg.train_sizes else {}  # timm ViTs resample pos_embed / RoPE per size
    net, model_kwargs = create_model(cfg.model, {"num_classes": len(classes), "img_size": cfg.img_size,
                                                 "drop_path_rate": cfg.drop_path, **dynamic, **cfg.model_kwargs})
    check_multiple("img_size", [cfg.img_size], net, f"'{cfg.model}'")
    if cfg.train_sizes:
        if patch_size(net) is not None and not model_kwargs.get("dynamic_img_size"):
            raise UserError(f"train_sizes needs a model that runs at any input size, and '{cfg.model}' does not take "
                            "dynamic_img_size=True; pick a ViT (ours, timm's ViTs or RoPE ports) or set train_sizes=[]")
        check_multiple("train_sizes entry", cfg.train_sizes, net, f"'{cfg.model}'")
    set_checkpointing(net, cfg.grad_checkpointing, cfg.model)
    if resume is not None:
        train_state.load_state(net, resume["model"], "model weights", cfg.resume)
    elif finetune is not None:
        state = finetune["model"]
        if isinstance(net, VisionTransformer):
            state = checkpoint_filter_fn(state, net)  # resamples a learned pos_embed to the new img_size
        state = new_classifier(state, net, finetune.get("classes"), classes, cfg.finetune, say)
        train_state.load_state(net, state, "model weights", cfg.finetune, "start from a checkpoint of this model "
                               "(model and model_kwargs of the run that wrote it)")
    return net, model_kwargs
