"""``RoPEVisionTransformer``'s embedding: one route for NaFlex batches (NaViT, Dehghani et al., NeurIPS 2023: images
at their own sizes, packed as timm's NaFlexCollator) and images (one grid's batch)."""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import PatchDropoutWithIndices, to_2tuple
from timm.models.naflexvit import global_pool_naflex
from torch import Tensor, nn

from vit_rope.checks import check_patch_multiple
from vit_rope.encodings.ape import table_grid
from vit_rope.encodings.base import Positions, image_coords
from vit_rope.encodings.policies import augment_positions
from vit_rope.layers.fused import capturing
from vit_rope.layers.lattice import key_padding_mask, lattice, naflex_grid

NAFLEX_KEYS = ("patches", "patch_coord", "patch_valid")


def naflex_patch(model: nn.Module) -> tuple[int, int] | None:
    """The (h, w) patch of a model whose forward takes timm's NaFlex ``patch_coord``, else None."""
    if "patch_coord" not in inspect.signature(model.forward).parameters:
        return None
    getter = getattr(model, "get_patch_size", None)
    patch = getter() if getter is not None else getattr(getattr(model, "patch_embed", None), "patch_size", None)
    return None if patch is None else tuple(int(side) for side in to_2tuple(patch))


class NaFlexBatch(NamedTuple):
    """One NaFlex batch, checked (``coord`` (y, x) integers, ``valid`` bool); ``attn_mask`` replaces padding's mask."""

    patches: Tensor
    coord: Tensor
    valid: Tensor
    attn_mask: Tensor | None


def naflex_batch(x: Any, patch_coord: Tensor | None = None, patch_valid: Tensor | None = None,
                 attn_mask: Tensor | None = None) -> NaFlexBatch | None:
    """The NaFlex batch ``x`` and the keywords name, or None for images. ``patch_valid`` is required even without
    padding: a batch that lost it would attend to and pool its padding silently."""
    if not isinstance(x, (dict, Tensor)):  # an FX proxy: symbolic tracing (torchvision's extractor) traces images
        return None
    if isinstance(x, dict):
        if missing := [key for key in NAFLEX_KEYS if key not in x]:
            raise ValueError(f"A NaFlex batch dict needs the keys {', '.join(NAFLEX_KEYS)}, as timm's NaFlexCollator "
                             f"yields them; {', '.join(missing)} missing from {sorted(x)}.")
        patches, patch_coord, patch_valid = (x[key] for key in NAFLEX_KEYS)
        attn_mask = x.get("attn_mask", attn_mask)
    elif patch_coord is not None:
        patches = x
    elif patch_valid is not None:
        raise ValueError(f"patch_valid {tuple(patch_valid.shape)} was given without patch_coord: a NaFlex batch "
                         "needs both, patch_coord [B, N, 2] as the (y, x) patch index of every token.")
    elif isinstance(x, Tensor) and x.dim() == 3:
        raise ValueError(f"A [B, N, P*P*C] tensor {tuple(x.shape)} reads as NaFlex patches, which need patch_coord "
                         "[B, N, 2] (y, x) and patch_valid [B, N]: pass them as keyword arguments, or the dict "
                         "timm's NaFlexCollator yields; images are [B, C, H, W].")
    else:
        return None
    if patches.dim() != 3 or patch_coord.shape != (*patches.shape[:2], 2):
        raise ValueError(f"NaFlex patches must be [B, N, P*P*C] with patch_coord [B, N, 2] (y, x); got "
                         f"{tuple(patches.shape)} and {tuple(patch_coord.shape)}.")
    if patch_valid is None:
        raise ValueError(f"NaFlex patches {tuple(patches.shape)} came with patch_coord but without patch_valid [B, N] "
                         "(False for padding): pass it, torch.ones(B, N, dtype=torch.bool) for a batch without "
                         "padding.")
    if patch_valid.shape != patches.shape[:2]:
        raise ValueError(f"NaFlex patch_valid must be [B, N] = {tuple(patches.shape[:2])} like the patches; got "
                         f"{tuple(patch_valid.shape)}.")
    if patch_coord.is_floating_point() or patch_coord.is_complex():
        raise ValueError(f"NaFlex patch_coord must hold integer patch indices (y, x); got {patch_coord.dtype}. "
                         "Convert with .long() if the values are whole, or build the batch with timm's Patchify.")
    return NaFlexBatch(patches, patch_coord.long(), patch_valid.bool(), attn_mask)


def check_coordinates(coord: Tensor, valid: Tensor) -> None:
    """Refuse a negative coordinate of a valid token and a sample without one (nothing to pool), in one host sync."""
    if not valid.shape[0]:  # an empty batch gives empty outputs, as an empty image batch does
        return
    low, empty = torch.stack(((coord * valid[..., None]).amin(), (~valid.any(1)).sum())).tolist()
    if low < 0:
        where = ((coord < 0).any(-1) & valid).nonzero()[0].tolist()
        raise ValueError(f"NaFlex patch_coord {tuple(coord.shape)} has a negative (y, x) = "
                         f"{tuple(coord[where[0], where[1]].tolist())} at sample {where[0]}, token {where[1]}: "
                         "coordinates are patch indices from the image's top-left patch, (0, 0).")
    if empty:
        samples = (~valid.any(1)).nonzero().flatten().tolist()
        raise ValueError(f"NaFlex patch_valid {tuple(valid.shape)} marks no valid token in sample(s) {samples}: "
                         "every sample needs at least one patch; leave empty images out of the batch.")


def check_attn_mask(attn_mask: Tensor, B: int, T: int) -> Tensor:
    """The caller's ``attn_mask`` if it broadcasts to ``[B, nh, T, T]`` (T tokens after patch dropout)."""
    try:
        shape = torch.broadcast_shapes(attn_mask.shape, (B, 1, T, T))
    except RuntimeError:
        shape = None
    if attn_mask.dim() > 4 or shape is None or (shape[0], *shape[2:]) != (B, T, T):
        raise ValueError(f"NaFlex attn_mask {tuple(attn_mask.shape)} does not fit the batch's {B} samples of {T} "
                         "tokens (prefix tokens and patches): it must broadcast to [B, heads, T, T], such as a key "
                         "mask [B, 1, 1, T]; leave it out to hide the padding from the keys.")
    return attn_mask


def embed_patches(patch_embed: nn.Module, patches: Tensor) -> Tensor:
    """timm's ``PatchEmbed`` on flat channels-last patches (``Patchify``'s): its convolution as a linear layer."""
    proj = patch_embed.proj
    expected = proj.weight[0].numel()
    if patches.shape[-1] != expected:
        raise ValueError(f"NaFlex patches have {patches.shape[-1]} values each, this model's patch embedding takes "
                         f"{expected} ({'x'.join(map(str, proj.kernel_size))} patches of {proj.in_channels} "
                         "channels): build the loader with the model's patch size.")
    weight = proj.weight.permute(0, 2, 3, 1).flatten(1)  # [C_out, P*P*C] in (y, x, channel) order
    return patch_embed.norm(F.linear(patches, weight, proj.bias))  # [B, N, C_out]


def naflex_maps(tokens: Tensor, coord: Tensor, valid: Tensor, grid: Tensor) -> Tensor:
    """Patch tokens as per-sample maps ``[B, C, H, W]`` of the batch's largest grid, each in its top-left corner."""
    B, _, C = tokens.shape
    height, width = (int(side) for side in grid.amax(0).tolist()) if B else (0, 0)
    maps = tokens.new_zeros(B, height * width, C)
    index = (coord[..., 0] * width + coord[..., 1]).masked_fill(~valid, height * width)  # padding: a spare slot
    maps = torch.cat((maps, maps.new_zeros(B, 1, C)), dim=1).scatter(1, index[..., None].expand(-1, -1, C), tokens)
    return maps[:, :-1].reshape(B, height, width, C).permute(0, 3, 1, 2).contiguous()


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
            if not self.patch_embed.dynamic_img_pad:  # with it, timm's PatchEmbed pads to whole patches
                x = check_patch_multiple(x, self.patch_embed.patch_size)
            tokens = self.patch_embed(x)  # [B, h, w, C]
            grid = (tokens.shape[1], tokens.shape[2])
            tokens = tokens.flatten(1, 2)  # [B, N, C]; flatten, not view: an empty batch has no token count
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
