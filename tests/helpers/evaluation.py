"""A checkpoint with the keys train.py writes, and the evaluation command run on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch

import vit_rope  # noqa: F401  (registers the vit_rope_* models)
from vit_rope.eval import command
from vit_rope.train.state import save_checkpoint

ROPE = "vit_rope_tiny_patch16_mixed_224"
CLASSES = ["class_0", "class_1", "class_2"]


def write_checkpoint(path: Path, ema_bias: float | None = None, drop: tuple[str, ...] = (), val_split: str = "val",
                     **model_kwargs: Any) -> Path:
    """A checkpoint with the keys train.py writes; LayerScale at 1 so that the RoPE policy visibly matters."""
    kwargs = {"num_classes": 3, "img_size": 32, "drop_path_rate": 0.0, "depth": 2, **model_kwargs}
    torch.manual_seed(0)
    model = timm.create_model(ROPE, **kwargs)
    for name, param in model.named_parameters():
        if name.endswith(".gamma"):
            param.data.fill_(1.0)
    ckpt = {"model_name": ROPE, "model_kwargs": kwargs, "classes": CLASSES, "model": model.state_dict(),
            "config": {"img_size": 32, "model": ROPE, "val_split": val_split}, "epoch": 1}
    if ema_bias is not None:
        ckpt["model_ema"] = {**model.state_dict(), "head.bias": torch.full((3,), ema_bias)}
    save_checkpoint({key: value for key, value in ckpt.items() if key not in drop}, path)
    return path


def run(*args: str) -> int:
    return command.main([*args, "--device", "cpu", "--workers", "0", "--batch-size", "8"])
