"""The learned absolute position embedding (APE) of the "+APE" models and of the ViT / DeiT checkpoints they load.

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) keeps DeiT-III's APE beside RoPE in "+APE" variants. The table is
resampled to the input's grid at each forward, and once on loading a checkpoint of another grid (``source_grids``)."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import PositionEncoding
from vit_rope.layers.lattice import pos_embed_at

# how a table learnt on one grid reaches another: timm's ViT (antialiased bicubic), or the Qwen2-VL / Qwen3-VL vision
# encoders' bilinear resampling with align_corners=True (timm's qwen3_vit.resample_pos_embed_grid)
RESAMPLING = ("bicubic", "bilinear_corners")

# FX: resampling depends on the input's size, which symbolic tracing only knows as a proxy; the trace records a call.
torch.fx.wrap("fit_pos_embed")


def fit_pos_embed(pos_embed: Tensor, grid: tuple[int, int], train_grid: tuple[int, int], num_prefix_tokens: int,
                  resampling: str = "bicubic") -> Tensor:
    """The learned position embedding ``[1, (P +) N0, C]`` resampled to ``grid`` as ``resampling`` says."""
    if resampling == "bicubic":
        return resample_abs_pos_embed(pos_embed, new_size=[grid[0], grid[1]],
                                      old_size=[train_grid[0], train_grid[1]], num_prefix_tokens=num_prefix_tokens)
    if tuple(grid) == tuple(train_grid):
        return pos_embed
    prefix, table = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dtype = torch.float64 if table.dtype == torch.float64 else torch.float32  # half types lack CPU bilinear
    x = table.unflatten(1, train_grid).permute(0, 3, 1, 2).to(dtype)  # [1, C, h0, w0]
    x = F.interpolate(x, size=(grid[0], grid[1]), mode="bilinear", align_corners=True)
    return torch.cat((prefix, x.permute(0, 2, 3, 1).flatten(1, 2).to(table.dtype)), 1)


class AbsoluteEncoding(PositionEncoding):
    """The APE as a position encoding (blocks get nothing), logic only: the table stays the model's ``pos_embed``, where
    timm reads it. ``num_prefix_rows``: 0 for DeiT-III and RoPE-ViT (``no_embed_class``), else the prefix count."""

    def __init__(self, num_prefix_rows: int, resampling: str = "bicubic") -> None:
        super().__init__("ape", 0)
        self.num_prefix_rows = num_prefix_rows
        self.resampling = check_choice(resampling, RESAMPLING, "position-embedding resampling")

    def forward(self, table: Tensor, positions: Tensor, grids: Tensor, grid: tuple[int, int] | None,
                table_grid: tuple[int, int]) -> Tensor:
        """The rows to add to the tokens: resampled to an image batch's ``grid``, or read at each NaFlex patch."""
        own = self.num_prefix_rows
        if grid is None:  # read at each patch's coordinate: [B, own + N, C]
            coord = positions.flip(-1)  # [B, N, 2] (y, x): the integer coordinates, exactly
            return torch.cat((table[:, :own].expand(coord.shape[0], -1, -1),
                              pos_embed_at(table[0, own:], coord, grids, table_grid, self.resampling)), 1)
        return fit_pos_embed(table, grid, table_grid, own, self.resampling)  # [1, own + N, C]

    def extra_repr(self) -> str:
        return f"num_prefix_rows={self.num_prefix_rows}, resampling={self.resampling!r}"


def source_grids(rows: int, grid: tuple[int, int], num_prefix: int) -> list[tuple[int, tuple[int, int]]]:
    """Every ``(prefix rows, patch grid)`` a checkpoint's table of ``rows`` rows may have, most likely first."""
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


def table_grid(model: nn.Module) -> tuple[int, int]:
    """The grid ``model``'s position-embedding table is learnt on (Qwen-VL's 48x48 at any ``img_size``)."""
    grid = getattr(model, "pos_embed_grid", None)
    return tuple(model.patch_embed.grid_size) if grid is None else (int(grid[0]), int(grid[1]))


def fit_checkpoint_pos_embed(pos_embed: Tensor, model: nn.Module) -> Tensor:
    """A checkpoint's ``pos_embed`` for ``model``: read on its grid if it fits, else ``source_grids``' first (warns)."""
    grid = table_grid(model)
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    rows = pos_embed.shape[1]
    found = source_grids(rows, grid, num_prefix)
    if not found:
        raise ValueError(f"The checkpoint's position embedding has {rows} rows, which fit no square patch grid nor one "
                         f"of the model's aspect ratio ({grid[0]}x{grid[1]}) after {num_prefix}, 0 or 1 prefix rows: "
                         "create the model with the img_size, patch_size and prefix tokens (class_token, reg_tokens) "
                         "the checkpoint was trained with, then change the input size.")
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
    resampling = getattr(getattr(model, "ape", None), "resampling", "bicubic")  # timm's own ViT: bicubic
    return fit_pos_embed(pos_embed, grid, src_grid, src_prefix, resampling)
