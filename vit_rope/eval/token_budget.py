"""Token budgets: evaluation at native aspect ratio with timm's NaFlex pieces, each image resized to at most L patches
in one padded sequence (NaViT; SigLIP 2's NaFlex), as timm validates (docs/evaluation.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from timm.data import create_transform
from timm.data.naflex_dataset import NaFlexCollator
from torch import Tensor

from vit_rope.errors import UserError

PROTOCOL = ("token budgets: resize keeping the aspect ratio to the largest size whose sides are multiples of the patch "
            "and which cuts into at most L patches (PIL bicubic, no crop), patches packed and padded to L (timm "
            "create_transform naflex=True, NaFlexCollator), each model's own mean/std normalisation")


class Setting(NamedTuple):
    """One loader of an evaluation and the models it feeds: a square size, or a token budget at one patch size."""

    name: str  # as printed: 224 px, 196 tokens
    fields: dict[str, Any]  # what each result row of it records: img_size, seq_len, patch_size, crop_pct
    transform: Callable[[Any], Any]  # an image to the loader's item (a tensor, or timm's patch dict)
    collate: Callable[[list[tuple[Any, int, int]]], Any] | None  # None: PyTorch's default
    models: list[int]  # indices of the models it feeds


def seq_len_arg(text: str) -> int:
    """``--seq-lens`` entries: whole numbers; their range is checked by ``check_seq_lens`` with the other input."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens (e.g. 196: 14x14 patches of "
                                         "16 px)") from None


def check_seq_lens(seq_lens: Sequence[int]) -> None:
    """Refuse a budget below one patch (no image fits it), before any model is built."""
    bad = next((seq_len for seq_len in seq_lens if seq_len < 1), None)
    if bad is not None:
        raise UserError(f"--seq-lens {bad} is below one patch: a token budget is the most patches an image is cut "
                        "into, e.g. --seq-lens 64 196 400 784")


def budget_transform(seq_len: int, patch: tuple[int, int]) -> Callable[[Any], dict[str, Tensor]]:
    """timm's NaFlex eval transform for budget ``seq_len``, pixels in [0, 1] as ``harness.eval_transform``'s."""
    return create_transform(is_training=False, naflex=True, patch_size=patch, max_seq_len=seq_len, patchify=True,
                            interpolation="bicubic", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), use_prefetcher=False)


class BudgetCollator(NaFlexCollator):
    """timm's ``NaFlexCollator``, keeping the items' count of unreadable files skipped, which it drops."""

    def __call__(self, items: list[tuple[dict[str, Tensor], int, int]]) -> tuple[dict[str, Any], Tensor, Tensor]:
        return *super().__call__(items), torch.tensor([item[2] for item in items])


def budget_settings(seq_lens: Sequence[int], patches: Sequence[tuple[int, int] | None]) -> list[Setting]:
    """One setting per budget and patch size among ``patches`` (one per model): each patch size cuts its own."""
    return [Setting(f"{seq_len} tokens" + (f" ({patch[0]}x{patch[1]} patches)" if len(set(patches)) > 1 else ""),
                    {"img_size": None, "seq_len": seq_len, "patch_size": list(patch), "crop_pct": None},
                    budget_transform(seq_len, patch), BudgetCollator(seq_len),
                    [i for i, other in enumerate(patches) if other == patch])
            for seq_len in seq_lens for patch in dict.fromkeys(patches)]


def normalise(inputs: Tensor | dict[str, Any], mean: Tensor, std: Tensor) -> Tensor | dict[str, Any]:
    """``inputs`` with a model's ``mean`` and ``std``: images, or a NaFlex batch's channels-last patches."""
    if not isinstance(inputs, dict):
        return (inputs - mean) / std
    patches = inputs["patches"].unflatten(-1, (-1, mean.numel()))  # [B, N, P*P, C]
    return {**inputs, "patches": ((patches - mean.flatten()) / std.flatten()).flatten(-2)}  # [B, N, P*P*C]
