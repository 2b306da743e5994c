"""The learned absolute position embedding (APE) of the "+APE" models and of the ViT / DeiT checkpoints they load.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) keeps DeiT-III's APE beside RoPE in its "+APE" variants. An APE is a
table learnt for one patch grid, so every other grid takes it resampled bicubically (timm's
``resample_abs_pos_embed``): at each forward for the input's grid, and once when a checkpoint trained on another grid
is loaded, whose grid the state dict does not store and ``source_grid`` infers.
"""

from __future__ import annotations

import math

from timm.layers import resample_abs_pos_embed
from torch import Tensor, nn


def fit_pos_embed(pos_embed: Tensor, grid: tuple[int, int], train_grid: tuple[int, int], num_prefix_tokens: int
                  ) -> Tensor:
    """The learned position embedding ``[1, (P +) N0, C]`` resampled bicubically to ``grid`` (timm's resampling)."""
    return resample_abs_pos_embed(pos_embed, new_size=[grid[0], grid[1]], old_size=[train_grid[0], train_grid[1]],
                                  num_prefix_tokens=num_prefix_tokens)


def source_grid(rows: int, grid: tuple[int, int], num_prefix: int) -> tuple[int, tuple[int, int]]:
    """The prefix rows and patch grid of a checkpoint's position embedding of ``rows`` rows, for a model whose grid is
    ``grid`` with ``num_prefix`` prefix rows.

    A state dict does not store the grid it was trained on, so it is inferred: the model's own prefix count first,
    then none, then a class token's one; for each, a grid of the model's aspect ratio (the same model, or one trained
    at a proportional size), then a square one (timm's and DeiT's checkpoints).

    Raises:
        ValueError: no such grid has ``rows`` rows; the message says to build the model at the checkpoint's size.
    """
    step = math.gcd(*grid)
    shapes = dict.fromkeys([(grid[0] // step, grid[1] // step), (1, 1)])  # aspect ratios, in order, no repeats
    for prefix in dict.fromkeys([num_prefix, 0, 1]):
        for height, width in shapes:
            cells, rest = divmod(rows - prefix, height * width)
            scale = math.isqrt(max(cells, 0))
            if not rest and scale and scale * scale == cells:
                return prefix, (height * scale, width * scale)
    raise ValueError(
        f"The checkpoint's position embedding has {rows} rows, which fit no patch grid of the model's aspect ratio "
        f"({grid[0]}x{grid[1]}) nor a square one, after {num_prefix}, 0 or 1 prefix rows: create the model with the "
        "img_size (and patch_size) the checkpoint was trained at, then change the input size."
    )


def fit_checkpoint_pos_embed(pos_embed: Tensor, model: nn.Module) -> Tensor:
    """A checkpoint's position embedding for ``model`` (a timm ``VisionTransformer`` with one): the source's prefix
    rows stripped if the model has none, then resampled bicubically from the source's grid to the model's."""
    grid = tuple(model.patch_embed.grid_size)
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    if pos_embed.shape == model.pos_embed.shape:
        return pos_embed  # the same layout: nothing to resample (timm's filter does the same)
    src_prefix, src_grid = source_grid(pos_embed.shape[1], grid, num_prefix)
    if src_prefix and not num_prefix:
        pos_embed, src_prefix = pos_embed[:, src_prefix:], 0
    return resample_abs_pos_embed(
        pos_embed, new_size=list(grid), old_size=list(src_grid), num_prefix_tokens=src_prefix, verbose=False
    )
