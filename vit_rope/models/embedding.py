"""``RoPEVisionTransformer``'s embedding: one route for NaFlex batches and images (one grid's batch)."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
from timm.layers import PatchDropoutWithIndices
from timm.models.naflexvit import global_pool_naflex
from torch import Tensor

from vit_rope.checks import check_patch_multiple
from vit_rope.encodings.ape import table_grid
from vit_rope.encodings.base import Positions, image_coords
from vit_rope.encodings.policies import augment_positions
from vit_rope.layers.fused import capturing
from vit_rope.layers.lattice import key_padding_mask, lattice, naflex_grid
from vit_rope.models.naflex_batch import NaFlexBatch, check_attn_mask, check_coordinates, embed_patches

# FX: these read the input's size, a proxy under symbolic tracing; the trace records them as calls
torch.fx.wrap("check_patch_multiple")
torch.fx.wrap("image_coords")


class Embedded(NamedTuple):
    """Tokens (after patch dropout, ``norm_pre``), positions, attention mask; NaFlex: kept ``coord``, ``valid``."""

    tokens: Tensor
    positions: Positions
    attn_mask: Tensor | None
    coord: Tensor | None
    valid: Tensor | None


class EmbeddingMixin:
    """``RoPEVisionTransformer``'s ``_embed`` and pooling over valid tokens."""

    def _patch_tokens(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Patch tokens ``[B, N, C]`` of images ``[B, C, H, W]`` and their grid (h, w)."""
        if not self.patch_embed.dynamic_img_pad:  # with it, timm's PatchEmbed pads to whole patches
            x = check_patch_multiple(x, self.patch_embed.patch_size)
        x = self.patch_embed(x)  # [B, h, w, C]
        return x.flatten(1, 2), (x.shape[1], x.shape[2])  # flatten, not view: an empty batch has no token count

    def _prefix_and_ape(self, tokens: Tensor, coord: Tensor, grids: Tensor, grid: tuple[int, int] | None) -> Tensor:
        """Prefix tokens in front of the patch tokens ``[B, N, C]``, each with its APE row (+APE models)."""
        B = tokens.shape[0]
        prefix = [token.expand(B, -1, -1) for token in (self.cls_token, self.reg_token) if token is not None]
        if self.pos_embed is None:
            return self.pos_drop(torch.cat(prefix + [tokens], dim=1))  # [B, P + N, C]
        positions = self.ape.place(coord, grids)
        rows = self.ape(self.pos_embed, positions, grids, grid, table_grid(self))  # [1 or B, own + N, C]
        if self.ape.num_prefix_rows:
            return self.pos_drop(torch.cat(prefix + [tokens], dim=1) + rows)
        return self.pos_drop(torch.cat(prefix + [tokens + rows], dim=1))

    def _embed(self, x: Tensor | NaFlexBatch) -> Embedded:
        """Tokens, positions and masks of images ``[B, C, H, W]`` or a ``NaFlexBatch``."""
        P = self.num_prefix_tokens
        attn_mask = valid = grid = None
        captured = capturing(x if isinstance(x, Tensor) else x.patches)  # the one question per forward
        if isinstance(x, NaFlexBatch):
            patches, coord, valid, attn_mask = x
            if not captured:  # a graph capture takes the batch as it comes: checking reads values on the host
                check_coordinates(coord, valid)
            tokens = embed_patches(self.patch_embed, patches)  # [B, N, C]
            grids = naflex_grid(coord, valid)  # [B, 2] (h, w), before any dropout
        else:
            tokens, grid = self._patch_tokens(x)
            coord, grids = image_coords(grid[0], grid[1], tokens.device)  # [N, 2] (y, x) shared, [1, 2]
        B = tokens.shape[0]
        x = self._prefix_and_ape(tokens, coord, grids, grid)
        positions = self.pos_encoding.place(coord, grids)  # [N, 2] or [B, N, 2] (x, y)
        on_lattice = valid is not None and not captured
        x, keep = self.patch_drop(x) if isinstance(self.patch_drop, PatchDropoutWithIndices) else (x, None)  # [B, K]
        if self.training and self.coord_aug.active:
            positions = augment_positions(positions, B, self.coord_aug)  # [B, N, 2], a draw per sample
            on_lattice = False
        if keep is not None:  # positions, coordinates and validity follow the kept tokens
            index = keep[..., None].expand(-1, -1, 2)  # [B, K, 2]
            positions = positions.expand(B, -1, -1).gather(1, index)
            coord = coord.expand(B, -1, -1).gather(1, index)
            valid = None if valid is None else valid.gather(1, keep)
            on_lattice = False
        if valid is not None:
            attn_mask = key_padding_mask(valid, P) if attn_mask is None else check_attn_mask(attn_mask, *x.shape[:2])
        lattice_ = partial(lattice, coord, valid, grids, P) if on_lattice else None
        positions = Positions(positions, grids, grid, valid, lattice_, captured)
        return Embedded(self.norm_pre(x), positions, attn_mask, None if grid is not None else coord, valid)

    def _pool_valid(self, x: Tensor, valid: Tensor) -> Tensor:
        """Pooling of valid tokens: timm's ``global_pool_naflex``, or the attention pool with padding masked as keys."""
        P = self.num_prefix_tokens
        if self.attn_pool is None:
            return global_pool_naflex(x, valid, self.global_pool, P, self.pool_include_prefix)
        x, keys = (x, key_padding_mask(valid, P)) if self.pool_include_prefix else (x[:, P:], valid[:, None, None, :])
        bias = torch.zeros(keys.shape, dtype=x.dtype, device=x.device).masked_fill(~keys, float("-inf"))
        return self.attn_pool(x, attn_mask=bias)  # [B, C]
