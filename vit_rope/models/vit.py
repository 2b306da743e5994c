"""RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) on timm's ``VisionTransformer``: DeiT-III's ViT (Touvron et
al., ECCV 2022) with 2D RoPE in every attention layer ("+APE" keeps a learned absolute embedding too)."""

# no ``from __future__ import annotations``: FX writes a traced forward's signature from these, which must be types
from collections.abc import Sequence
from typing import Any

from timm.layers import Mlp, PatchDropoutWithIndices, get_device_dtype, trunc_normal_
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from vit_rope.encodings import EncodingSpec, build, check_kind
from vit_rope.encodings.ape import AbsoluteEncoding
from vit_rope.encodings.policies import CoordAugment, ResolutionPolicy
from vit_rope.encodings.rope.dinov3_rope import check_qk_layout
from vit_rope.errors import NoTorchScript
from vit_rope.layers.attention import RoPEAttention, RoPEBlock
from vit_rope.layers.eva import eva_blocks_, resize_attn_pool
from vit_rope.models.embedding import Embedded, EmbeddingMixin, naflex_batch, naflex_maps
from vit_rope.models.pos_encoding import rename_rope_keys, submodule_no_decay


class RoPEVisionTransformer(NoTorchScript, EmbeddingMixin, VisionTransformer):
    """timm ``VisionTransformer`` with 2D RoPE at any multiple of the patch size; arguments: docs/models.md."""

    def __init__(self, encoding: str | None = None, resolution_policy: str | dict | ResolutionPolicy | None = None,
                 rope_theta: float | None = None, rope_coord_aug: dict | CoordAugment | None = None,
                 rope_min_period: float | None = None, rope_max_period: float | None = None,
                 rope_normalize_coords: str | None = None, rope_string_base: str | None = None,
                 rope_fraction: float | None = None, rope_mixed_init: str | None = None,
                 rope_grid_offset: float | None = None, rope_ref_grid: tuple[int, int] | None = None,
                 rope_alternate_axes: bool | None = None, qk_layout: str = "interleaved",
                 attn_pool_num_heads: int | None = None, attn_pool_mlp_ratio: float | None = None,
                 num_kv_heads: int | tuple[int, ...] | None = None, layer_scale: str = "both",
                 encoding_options: dict[str, Any] | None = None, head_hidden_dim: int | None = None,
                 pos_embed: str = "none", no_embed_class: bool = True, pos_embed_grid: tuple[int, int] | None = None,
                 pos_embed_resampling: str = "bicubic", **kwargs: Any) -> None:
        num_heads, embed_dim = kwargs.get("num_heads", 12), kwargs.get("embed_dim", 768)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}.")
        encoding = check_kind(encoding or "axial")
        if kwargs.pop("dynamic_img_size", True) is False:
            raise ValueError("RoPE models always accept any input size (dynamic_img_size=True); do not set it False.")
        patch_drop_rate = kwargs.pop("patch_drop_rate", 0.0)
        super().__init__(pos_embed=pos_embed, no_embed_class=no_embed_class, dynamic_img_size=True, block_fn=RoPEBlock,
                         attn_layer=RoPEAttention, **kwargs)
        self.pos_embed_grid = None
        if pos_embed_grid is not None:  # a table of its own grid, whatever img_size (timm's rows follow img_size)
            if self.pos_embed is None:
                raise ValueError(f"pos_embed_grid={pos_embed_grid} sizes a learned position embedding, which "
                                 f"pos_embed={pos_embed!r} does not have: pass pos_embed='learn' or leave it unset.")
            self.pos_embed_grid = (int(pos_embed_grid[0]), int(pos_embed_grid[1]))
            rows = self.pos_embed_grid[0] * self.pos_embed_grid[1] + (0 if no_embed_class else self.num_prefix_tokens)
            self.pos_embed = nn.Parameter(trunc_normal_(self.pos_embed.new_empty(1, rows, self.embed_dim), std=0.02))
        if patch_drop_rate > 0:  # the kept indices are needed to keep each token's position
            self.patch_drop = PatchDropoutWithIndices(patch_drop_rate, num_prefix_tokens=self.num_prefix_tokens)
        self.qk_layout = check_qk_layout(qk_layout)
        if attn_pool_num_heads or attn_pool_mlp_ratio:
            self.attn_pool = resize_attn_pool(self.attn_pool, attn_pool_num_heads, attn_pool_mlp_ratio)
        eva_blocks_(self.blocks, num_kv_heads, layer_scale)
        self.head_hidden_dim = head_hidden_dim
        if head_hidden_dim:
            self.reset_classifier(self.num_classes)
        # the encoding, built after timm's __init__: it needs the blocks and the patch grid, or the grid policies
        # scale against instead, rope_ref_grid (timm Eva's ref_feat_shape)
        self.encoding_kind, aug, ref = encoding, rope_coord_aug, rope_ref_grid
        self.coord_aug = aug if isinstance(aug, CoordAugment) else CoordAugment(**(aug or {}))
        rope_options = dict(  # each the model's without "rope_" (None: the kind's own): RoPE2D's and STRING's
            theta=rope_theta, min_period=rope_min_period, max_period=rope_max_period,
            normalize_coords=rope_normalize_coords, fraction=rope_fraction, mixed_init=rope_mixed_init,
            grid_offset=rope_grid_offset, string_base=rope_string_base, alternate_axes=rope_alternate_axes)
        train_grid = tuple(self.patch_embed.grid_size) if ref is None else (int(ref[0]), int(ref[1]))
        self.pos_encoding = build(EncodingSpec(
            encoding, len(self.blocks), num_heads, self.embed_dim // num_heads, train_grid, resolution_policy,
            {name: value for name, value in rope_options.items() if value is not None}, ref,
            dict(encoding_options or {})))
        self.pos_encoding.attach_(self.blocks, self.embed_dim, num_heads)
        self.register_load_state_dict_pre_hook(rename_rope_keys)
        own = 0 if self.no_embed_class else self.num_prefix_tokens  # +APE: timm's pos_embed
        self.ape = None if self.pos_embed is None else AbsoluteEncoding(own, pos_embed_resampling)
        if factory := {key: kwargs[key] for key in ("device", "dtype") if kwargs.get(key) is not None}:
            self.to(**factory)  # ours where timm built its modules (create_model(device=..., dtype=...))

    @property
    def resolution_policy(self) -> ResolutionPolicy:
        return self.pos_encoding.policy

    def set_resolution_policy(self, policy: str | dict | ResolutionPolicy | None, **options: Any) -> None:
        """How positions follow other sizes (``policy=`` at creation), e.g. ``("yarn", yarn_beta=4.0)``."""
        if isinstance(policy, str):
            policy = ResolutionPolicy.create(dict(name=policy, **options))
        elif options:
            raise ValueError(f"Policy options {sorted(options)} go with a policy name, as in "
                             f"set_resolution_policy('yarn', yarn_beta=4.0); got the policy {policy!r}.")
        self.pos_encoding.policy = policy

    def fold_encoding_(self) -> None:
        """Fold the encoding into the blocks' weights where that is the same, cheaper function (STRING's into qkv)."""
        self.pos_encoding.fold_(self.blocks)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's, keeping the MLP head (``head_hidden_dim``) when the model has one."""
        super().reset_classifier(num_classes, global_pool)
        if self.head_hidden_dim and num_classes > 0:
            self.head = Mlp(self.embed_dim, self.head_hidden_dim, num_classes, act_layer=nn.Tanh,
                            **get_device_dtype(self))

    def no_weight_decay(self) -> set[str]:
        """timm's set plus what the encoding's modules name (``submodule_no_decay``)."""
        return super().no_weight_decay() | submodule_no_decay(self)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's groups, with each layer's mixed frequencies grouped with its block (for layer-wise lr decay)."""
        matcher = super().group_matcher(coarse)
        matcher["blocks"] = [(r"^blocks\.(\d+)", None), (r"^pos_encoding\.(\d+)", None), (r"^norm", (99999,))]
        return matcher

    def _forward_blocks(
        self, x: Tensor, blocks: nn.Module, take_indices: list[int] = (), norm: bool = False,
        attn_mask: Tensor | None = None, is_causal: bool = False, patch_coord: Tensor | None = None,
        patch_valid: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor], Embedded]:
        """The last tokens, those after ``take_indices`` and the embedding of images or a NaFlex batch."""
        embedded = self._embed(naflex_batch(x, patch_coord, patch_valid, attn_mask) or x)  # None: images
        mask = attn_mask if embedded.attn_mask is None else embedded.attn_mask  # a NaFlex batch's padding mask
        block_kwargs = dict(attn_mask=mask, is_causal=is_causal)
        x, intermediates = embedded.tokens, []
        encodings = self._block_inputs(embedded)
        every = int(self.grad_checkpointing)  # set_grad_checkpointing(True): every block; (n): blocks 0, n, 2n, ...
        for i, blk in enumerate(blocks):
            if every and i % every == 0:
                x = checkpoint(blk, x, encoding=encodings[i], **block_kwargs)
            else:
                x = blk(x, encoding=encodings[i], **block_kwargs)  # keywords: hooks read them
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        return x, intermediates, embedded

    def _block_inputs(self, embedded: Embedded) -> Sequence[Any]:
        """One input per block from the encoding; a family whose blocks differ wraps some (Qwen2.5-VL's windows)."""
        return self.pos_encoding.block_inputs(embedded.positions, self.num_prefix_tokens)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                patch_coord: Tensor | None = None, patch_valid: Tensor | None = None) -> Tensor:
        """Logits of images, or of a NaFlex batch: timm's dict, or ``patches``, ``patch_coord`` and ``patch_valid``."""
        x, _, embedded = self._forward_blocks(x, self.blocks, (), False, attn_mask, is_causal, patch_coord, patch_valid)
        return self._forward_head(self.norm(x), embedded)

    def _forward_head(self, x: Tensor, embedded: Embedded) -> Tensor:
        """``forward``'s head: timm's pooling (an image batch's ``embedded.valid`` is None), a NaFlex batch's over its
        valid tokens."""
        return self.forward_head(x, patch_valid=embedded.valid)

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                         patch_coord: Tensor | None = None, patch_valid: Tensor | None = None) -> Tensor:
        """Tokens after the final norm; a NaFlex batch's padded, ``forward_head(x, patch_valid=...)`` pools them."""
        x, _, _ = self._forward_blocks(x, self.blocks, (), False, attn_mask, is_causal, patch_coord, patch_valid)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False, patch_valid: Tensor | None = None) -> Tensor:
        """timm's head; with ``patch_valid`` (a NaFlex batch) the pooling reads valid tokens only."""
        x = self.pool(x) if patch_valid is None else self._pool_valid(x, patch_valid.bool())
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward_intermediates(
        self, x: Tensor, indices: int | list[int] | None = None, return_prefix_tokens: bool = False,
        norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
        output_dict: bool = False, attn_mask: Tensor | None = None, is_causal: bool = False,
        patch_coord: Tensor | None = None, patch_valid: Tensor | None = None,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]] | dict[str, Any]:
        """timm's, also for NaFlex batches: NLC tokens padded as the input, or maps in the largest grid's corner."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}.")
        if output_fmt == "NCHW" and self.training and isinstance(self.patch_drop, PatchDropoutWithIndices):
            raise ValueError(f"Patch dropout (patch_drop_rate={self.patch_drop.prob}) drops tokens in training, which "
                             "make no NCHW maps: call model.eval() first, or ask for output_fmt='NLC'.")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        x, intermediates, embedded = self._forward_blocks(x, blocks, take_indices, norm, attn_mask, is_causal,
                                                          patch_coord, patch_valid)

        P, naflex = self.num_prefix_tokens, embedded.coord is not None
        prefix_tokens = [y[:, :P] for y in intermediates] if P else None
        intermediates = [y[:, P:] for y in intermediates]
        if naflex and output_fmt == "NCHW":  # each sample's map in the corner of the largest grid
            grids = embedded.positions.grids  # [B, 2]
            intermediates = [naflex_maps(y, embedded.coord, embedded.valid, grids) for y in intermediates]
        elif output_fmt == "NCHW":
            h, w = embedded.positions.grid  # the image batch's patch grid
            intermediates = [y.unflatten(1, (h, w)).permute(0, 3, 1, 2).contiguous() for y in intermediates]

        if output_dict:
            out: dict[str, Any] = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            if naflex:  # NaFlex: which patch each token is, and whether it is real (after patch dropout)
                out["patch_coord"], out["patch_valid"] = embedded.coord, embedded.valid
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens, strict=True))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's pruning, also dropping the encoding of the removed blocks (mixed frequencies, bias layers)."""
        take_indices = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        self.pos_encoding.prune_(len(self.blocks))
        return take_indices
