"""timm's feature-extraction API on vit_rope models: ``forward_intermediates`` and ``prune_intermediate_layers``.

The model's ``_forward_blocks`` runs the blocks; here the tokens become NCHW maps or NLC tokens, prefix tokens apart. A
NaFlex batch gives NLC tokens padded as the input, or per-sample maps in the corner of the batch's largest grid.
"""

from __future__ import annotations

from typing import Any

from timm.models._features import feature_take_indices
from torch import Tensor

from vit_rope.layers.lattice import naflex_grid
from vit_rope.models.naflex_batch import naflex_batch, naflex_maps


class FeatureMixin:
    """``forward_intermediates`` and ``prune_intermediate_layers`` of ``RoPEVisionTransformer``."""

    def forward_intermediates(
        self, x: Tensor, indices: int | list[int] | None = None, return_prefix_tokens: bool = False,
        norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
        output_dict: bool = False, attn_mask: Tensor | None = None, is_causal: bool = False,
        patch_coord: Tensor | None = None, patch_valid: Tensor | None = None,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]] | dict[str, Any]:
        """timm's ``forward_intermediates`` (same arguments and outputs), also for NaFlex batches."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}.")
        batch_shape = x.shape if isinstance(x, Tensor) else None
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        batch = naflex_batch(x, patch_coord, patch_valid, attn_mask)
        x, intermediates, embedded = self._forward_blocks(
            x if batch is None else batch, blocks, take_indices, norm, attn_mask=attn_mask, is_causal=is_causal
        )

        P = self.num_prefix_tokens
        prefix_tokens = [y[:, :P] for y in intermediates] if P else None
        intermediates = [y[:, P:] for y in intermediates]
        if batch is not None and output_fmt == "NCHW":  # each sample's map in the corner of the largest grid
            if embedded.valid.shape != batch.valid.shape:
                raise ValueError("Patch dropout dropped tokens of the NaFlex batch, which make no NCHW maps: call "
                                 "model.eval() first, or ask for output_fmt='NLC'.")
            grid = naflex_grid(batch.coord, batch.valid)
            intermediates = [naflex_maps(y, batch.coord, batch.valid, grid) for y in intermediates]
        elif output_fmt == "NCHW":
            B, _, height, width = batch_shape
            h, w = self.patch_embed.dynamic_feat_size((height, width))
            if intermediates and intermediates[0].shape[1] != h * w:
                raise ValueError(f"Patch dropout kept {intermediates[0].shape[1]} of the {h}x{w} patches, which make "
                                 "no NCHW map: call model.eval() first, or ask for output_fmt='NLC'.")
            intermediates = [y.reshape(B, h, w, y.shape[-1]).permute(0, 3, 1, 2).contiguous() for y in intermediates]

        if output_dict:
            out: dict[str, Any] = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            if batch is not None:  # NaFlex: which patch each token is, and whether it is real (after patch dropout)
                out["patch_coord"], out["patch_valid"] = embedded.coord, embedded.valid
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens, strict=True))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's pruning, also dropping the encoding of the removed blocks (mixed frequencies, bias layers)."""
        take_indices = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        self.pos_encoding.prune_(len(self.blocks))
        return take_indices


