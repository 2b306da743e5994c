"""One loader for every checkpoint vit_rope reads: ``create_from_checkpoint(path, **overrides)`` builds the model a file
or folder describes (its format, ``vit_rope.models.formats``, or a ``train.py`` checkpoint's record) and loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
from torch import nn

from vit_rope.eval.loading import is_training_checkpoint, load_trained
from vit_rope.models.checkpoint import load_weights
from vit_rope.models.formats import describe, folder_format, weights_in
from vit_rope.weights import read_weights


def create_from_checkpoint(path: str | Path, model: str | None = None, **overrides: Any) -> nn.Module:
    """The model that ``path`` (a weights file, a ``train.py`` checkpoint or a folder) describes, built and loaded;
    weights the file lacks are initialised with a warning and listed in ``model.load_report``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint at {path}: give a weights file, a train.py checkpoint or a folder "
                                "with its config.json (transformers' DINOv3, PaPE's official classifiers).")
    fmt, config = (folder_format(path) if model is None else None) or (None, None)
    weights = weights_in(path)  # a folder's weights file
    if fmt is not None:  # its config describes the model, and the weights are checked against the config
        if fmt.folder.check_weights is not None:  # read here only where the config says what the weights must be
            fmt.folder.check_weights(config, read_weights(weights))
        name, args = fmt.folder.model(config)
    elif is_training_checkpoint(weights):
        if model is not None or overrides:
            raise ValueError(f"{path} is a train.py checkpoint, which rebuilds its model as it was trained; "
                             f"model= and {sorted(overrides)} do not apply: set a policy after loading "
                             "(model.set_resolution_policy) or fine-tune from it with train.py finetune=PATH.")
        return load_trained(path).model
    else:
        name, args = describe(weights)
    if model is None and name is None:
        raise ValueError(f"The keys of {path} do not say which model it is (timm's ViT or DeiT-III, an axial RoPE-ViT "
                         "port, a vit_rope state dict, timm's Eva families, which share their keys, a width of no "
                         "registered size, a folder's weights without its config.json): pass model= and the arguments "
                         "that differ, e.g. model='vit_rope_small_patch16_axial_224'.")
    # the file's class count in the overlay too: timm keeps the file's classifier, or warns and starts a new one
    if weights.name.endswith(".index.json"):  # shards, which timm's loader does not read: ours after building
        built = timm.create_model(model or name, **{**args, **overrides})
        load_weights(built, weights)
        return built
    overlay = dict(file=str(weights), custom_load=False, **{k: v for k, v in args.items() if k == "num_classes"})
    return timm.create_model(model or name, pretrained=True, pretrained_cfg_overlay=overlay, **{**args, **overrides})
