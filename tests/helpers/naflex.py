"""NaFlex batches as timm's NaFlexCollator packs them, from images of mixed aspect ratios."""

from __future__ import annotations

import torch
from timm.data.naflex_transforms import patchify_image

PATCH, LENGTH = 16, 32
GRIDS = [(4, 6), (6, 3), (5, 5)]  # the training grid is 5x5 (80 px): larger, smaller and equal on each axis


def pack(images: list[torch.Tensor], length: int = LENGTH, pad_value: float = -2.0,
         patch: int = PATCH) -> dict[str, torch.Tensor]:
    """Images as timm's NaFlexCollator packs them: flat channels-last patches, (y, x) coordinates, validity."""
    patches = torch.full((len(images), length, patch * patch * 3), pad_value)
    coord = torch.zeros(len(images), length, 2, dtype=torch.long)
    valid = torch.zeros(len(images), length, dtype=torch.bool)
    for b, image in enumerate(images):
        flat, where, ok = patchify_image(image, (patch, patch))
        patches[b, :len(flat)], coord[b, :len(flat)], valid[b, :len(flat)] = flat, where, ok
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid, "seq_len": length}


def images(grids: list[tuple[int, int]] = GRIDS, patch: int = PATCH) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(3, h * patch, w * patch) for h, w in grids]
