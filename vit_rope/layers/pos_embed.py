"""The learned absolute position embedding (APE) of the "+APE" models and of the ViT / DeiT checkpoints they load.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) keeps DeiT-III's APE beside RoPE in its "+APE" variants. An APE is a
table learnt for one patch grid, so every other grid takes it resampled bicubically (timm's
``resample_abs_pos_embed``): at each forward for the input's grid, and once when a checkpoint trained on another grid
is loaded, whose grid the state dict does not store and ``source_grids`` infers.
"""

from __future__ import annotations

import math
import warnings

from timm.layers import resample_abs_pos_embed
from torch import Tensor, nn


def fit_pos_embed(pos_embed: Tensor, grid: tuple[int, int], train_grid: tuple[int, int], num_prefix_tokens: int
                  ) -> Tensor:
    """The learned position embedding ``[1, (P +) N0, C]`` resampled bicubically to ``grid`` (timm's resampling)."""
    return resample_abs_pos_embed(pos_embed, new_size=[grid[0], grid[1]], old_size=[train_grid[0], train_grid[1]],
                                  num_prefix_tokens=num_prefix_tokens)


def source_grids(rows: int, grid: tuple[int, int], num_prefix: int) -> list[tuple[int, tuple[int, int]]]:
    """Every ``(prefix rows, patch grid)`` that a checkpoint's position embedding of ``rows`` rows may have, for a
    model whose grid is ``grid`` with ``num_prefix`` prefix rows, most likely first.

    A state dict does not store the grid it was trained on. Square grids come first (timm's, DeiT's and RoPE-ViT's
    checkpoints, and what timm's own loading assumes), then grids of the model's aspect ratio (a non-square model
    trained at this or a proportional size); for each, the model's own prefix count, then none, then a class token's.
    """
    step = math.gcd(*grid)
    shapes = dict.fromkeys([(1, 1), (grid[0] // step, grid[1] // step)])  # aspect ratios, in order, no repeats
    found = []
    for height, width in shapes:
        for prefix in dict.fromkeys([num_prefix, 0, 1]):
            cells, rest = divmod(rows - prefix, height * width)
            scale = math.isqrt(max(cells, 0))
            if not rest and scale and scale * scale == cells:
                found.append((prefix, (height * scale, width * scale)))
    return found


def fit_checkpoint_pos_embed(pos_embed: Tensor, model: nn.Module) -> Tensor:
    """A checkpoint's position embedding for ``model`` (a timm ``VisionTransformer`` with one): the source's prefix
    rows stripped if the model has none, then resampled bicubically from the source's grid to the model's.

    The source grid is ``source_grids``' first guess, or the model's own when it fits (a checkpoint of this very
    model); when another grid fits too, a warning names the one taken and the others, since only the user knows.

    Raises:
        ValueError: no grid fits; the message says to build the model at the checkpoint's size and prefix tokens.
    """
    grid = tuple(model.patch_embed.grid_size)
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    rows = pos_embed.shape[1]
    found = source_grids(rows, grid, num_prefix)
    if not found:
        raise ValueError(
            f"The checkpoint's position embedding has {rows} rows, which fit no square patch grid nor one of the "
            f"model's aspect ratio ({grid[0]}x{grid[1]}) after {num_prefix}, 0 or 1 prefix rows: create the model "
            "with the img_size, patch_size and prefix tokens (class_token, reg_tokens) the checkpoint was trained "
            "with, then change the input size."
        )
    own = (num_prefix, grid)
    src_prefix, src_grid = taken = own if own in found else found[0]
    if len(found) > 1:
        others = ", ".join(f"{h}x{w} after {p} prefix rows" for p, (h, w) in found if (p, (h, w)) != taken)
        warnings.warn(f"The checkpoint's position embedding has {rows} rows: read as a {src_grid[0]}x{src_grid[1]} "
                      f"grid after {src_prefix} prefix rows, though {others} fits too. If the checkpoint was trained "
                      "on another grid, create the model at its img_size, load it, then change the input size.",
                      UserWarning, stacklevel=4)
    if taken == own:
        return pos_embed  # this model's own layout: nothing to resample
    if src_prefix and not num_prefix:
        pos_embed, src_prefix = pos_embed[:, src_prefix:], 0
    return resample_abs_pos_embed(
        pos_embed, new_size=list(grid), old_size=list(src_grid), num_prefix_tokens=src_prefix, verbose=False
    )
