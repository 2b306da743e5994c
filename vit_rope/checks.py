"""Checks of user input that every layer needs, each failure a ``UserError`` naming the value and the fix."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import torch
from timm.layers import to_2tuple
from torch import Tensor, nn

from vit_rope.errors import UserError


def check_choice(value: Any, choices: Sequence[Any], what: str) -> Any:
    """``value`` if it is one of ``choices``, else a ``ValueError`` that calls it ``what`` and lists them."""
    if value not in choices:
        raise ValueError(f"Unknown {what} {value!r}: choose one of {', '.join(map(str, choices))}.")
    return value


def check_model_name(name: str) -> None:
    """Raise a ``UserError`` naming the closest timm model when ``name`` is not one (typos are the usual cause)."""
    if not timm.is_model(name):
        closest = difflib.get_close_matches(name, timm.list_models(), n=1, cutoff=0)[0]
        raise UserError(f"unknown model '{name}'; did you mean '{closest}'? (see timm.list_models())")


def resolve_device(device: str) -> str:
    """The device a ``--device`` value names; ``cuda`` without a GPU is a ``UserError``, not a kernel's failure."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but PyTorch sees no CUDA GPU; pass --device cpu")
    return device


def check_output_dir(path: str | Path, option: str) -> None:
    """Raise a ``UserError`` when ``path`` is a file, which would only fail at the first write, after the work."""
    if Path(path).exists() and not Path(path).is_dir():
        raise UserError(f"{option} {path} is a file, not a folder: name a folder to write into (it is made if missing)")


def patch_size(model: nn.Module) -> int | None:
    """The side of the square tiles a ViT cuts its input into (lcm of a (h, w) patch); None for CNNs (any size)."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    return None if patch is None else math.lcm(*map(int, to_2tuple(patch)))


def check_multiple(what: str, sizes: Sequence[int], model: nn.Module, label: str) -> None:
    """A ``UserError`` at the first of ``sizes`` patches do not tile (timm would crop it), naming the nearest sizes."""
    patch = patch_size(model) or 1  # a CNN takes any positive size
    for size in sizes:
        if size <= 0 or size % patch:
            lower = max(size, 0) // patch * patch
            use = f"{lower} or {lower + patch}" if lower else f"{patch}"
            raise UserError(f"{what} {size} is not a positive multiple of the patch size {patch} of {label}: use {use}")


def check_patch_multiple(x: Tensor, patch_size: tuple[int, int]) -> Tensor:
    """``x`` ``[B, C, H, W]`` itself, or a ``ValueError`` naming the sizes when it does not tile into whole patches."""
    (height, width), (ph, pw) = x.shape[-2:], patch_size
    if height % ph != 0 or width % pw != 0:
        raise ValueError(f"Image size {height}x{width} (HxW) is not a multiple of the patch size {ph}x{pw}: resize or "
                         f"crop to e.g. {max(ph, height // ph * ph)}x{max(pw, width // pw * pw)}, or build the model "
                         "with dynamic_img_pad=True to pad it.")
    return x
