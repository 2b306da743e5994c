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


def samples_equal_images(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Checks that each sample of a NaFlex batch of ``images()`` gives the logits of its image alone; returns the
    batch's logits and the batch."""
    inputs = images()
    batch = pack(inputs)
    with torch.no_grad():
        logits = model(batch)
        for b, image in enumerate(inputs):
            torch.testing.assert_close(logits[b], model(image[None])[0], atol=1e-4, rtol=1e-4)
    return logits, batch


def assert_offsets_only(model: torch.nn.Module) -> None:
    """``model`` (a relative kind without prefix tokens) sees offsets only: one 5x6 image's patches as NaFlex batches
    give the same logits at their coordinates and all shifted by (3, 5), other logits with patch 4 moved to (9, 9);
    13 of them (no row or column full) the same at their coordinates and shifted by (7, 2)."""
    flat, coord, _ = patchify_image(images([(5, 6)])[0], (PATCH, PATCH))
    keep = torch.tensor([0, 2, 3, 7, 8, 11, 13, 17, 20, 22, 23, 27, 29])
    moved = coord.clone()
    moved[4] = torch.tensor([9, 9])

    def batch(coords: list[torch.Tensor], patches: torch.Tensor) -> dict[str, torch.Tensor]:
        n = len(coords[0])
        return {"patches": patches[None].expand(len(coords), -1, -1), "patch_coord": torch.stack(coords),
                "patch_valid": torch.ones(len(coords), n, dtype=torch.bool)}

    with torch.no_grad():
        full = model(batch([coord, coord + torch.tensor([3, 5]), moved], flat))
        sparse = model(batch([coord[keep], coord[keep] + torch.tensor([7, 2])], flat[keep]))
    torch.testing.assert_close(full[1], full[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sparse[1], sparse[0], atol=1e-4, rtol=1e-4)
    assert (full[2] - full[0]).abs().max() > 1e-3
