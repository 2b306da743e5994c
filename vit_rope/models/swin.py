"""RoPE-ViT's RoPE-Swin (Heo et al., ECCV 2024, arXiv:2403.13298) on timm's ``SwinTransformer`` (Liu et al., ICCV
2021): 2D RoPE of window-local positions in every window attention, in place of (``use_rpb``: beside) Swin's bias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple, use_fused_attn
from timm.models import swin_transformer as timm_swin
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, WindowAttention, checkpoint_filter_fn
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.policies import ResolutionPolicy
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.errors import NoTorchScript
from vit_rope.layers.fused import rotated_projection
from vit_rope.layers.rotary import grid_positions
from vit_rope.models.pos_encoding import submodule_no_decay
from vit_rope.weights import Converted, Description

SWIN_KINDS = ("axial", "mixed")
SWIN_THETA = {"axial": 50.0, "mixed": 10.0}  # the official RoPE-Swin models' rope_theta


class RoPEWindowAttention(WindowAttention):
    """timm's window attention, q and k rotated by a 2D RoPE of window positions. SDPA unless ``TIMM_FUSED_ATTN=0``
    (timm's Swin needs ``=2``): a training step holds 4% less than timm's Swin-T, not 16% more (benchmarks/swin.py)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int | None = None, window_size: Any = 7,
                 qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0, encoding: str = "mixed",
                 rope_theta: float | None = None, use_rpb: bool = False,
                 resolution_policy: str | dict | ResolutionPolicy | None = None) -> None:
        super().__init__(dim, num_heads, head_dim, window_size, qkv_bias, attn_drop, proj_drop)
        self.fused_attn = use_fused_attn()
        if not use_rpb:
            self.relative_position_bias_table = self.relative_position_index = None
        check_choice(encoding, SWIN_KINDS, "RoPE-Swin encoding (RoPE-ViT's)")
        theta = SWIN_THETA[encoding] if rope_theta is None else rope_theta
        self.rope = RoPE2D(self.qkv.out_features // 3 // num_heads, num_heads, encoding, theta, self.window_size,
                           resolution_policy)

    def reset_parameters(self) -> None:
        if self.relative_position_bias_table is not None:
            super().reset_parameters()

    def set_window_size(self, window_size: tuple[int, int]) -> None:
        """A new window: the bias table resized as timm does; RoPE keeps its training window for the policy."""
        if self.relative_position_bias_table is not None:
            super().set_window_size(window_size)
            return
        self.window_size = to_2tuple(window_size)
        self.window_area = self.window_size[0] * self.window_size[1]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attention within windows ``x`` ``[nW B, N, C]``; ``mask`` ``[nW, N, N]`` (0 / -100) for shifted ones."""
        B_, N, C = x.shape
        win_h, win_w = self.window_size
        grid = torch.tensor([[win_h, win_w]], device=x.device)
        coord = grid_positions(win_h, win_w, x.device).flip(-1)  # [N, 2] (y, x) in the window
        tables = self.rope(self.rope.place(coord, grid), 0, grid)  # [H, N, D/2], positions as the policy places them
        q, k, v = rotated_projection(x, self.qkv, self.num_heads, tables)  # [nW B, nh, N, D] each
        attn_mask = None if self.relative_position_bias_table is None else self._get_rel_pos_bias()  # [1, nh, N, N]
        if mask is not None:  # window w of every image: mask[w], for every head
            shifted = mask.unsqueeze(1).repeat(B_ // mask.shape[0], 1, 1, 1)  # [nW B, 1, N, N]: heads broadcast
            attn_mask = shifted if attn_mask is None else attn_mask + shifted
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            if attn_mask is not None:
                attn = attn + attn_mask
            x = self.attn_drop(attn.softmax(dim=-1)) @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B_, N, -1)))


class RoPESwinBlock(SwinTransformerBlock):
    """timm's block, windows counted by ceiling division: torch.export traces it 9x faster than timm's ``Mod``."""

    def _attn(self, x: Tensor) -> Tensor:
        B, H, W, C = x.shape
        (wh, ww), (sh, sw) = self.window_size, self.shift_size
        nh, nw = (H + wh - 1) // wh, (W + ww - 1) // ww  # windows down and across, the last ones padded
        shifted = torch.roll(x, (-sh, -sw), (1, 2)) if sh or sw else x
        shifted = F.pad(shifted, (0, 0, 0, nw * ww - W, 0, nh * wh - H))
        windows = timm_swin.window_partition(shifted, (wh, ww)).view(-1, wh * ww, C)
        windows = self.attn(windows, mask=self.get_attn_mask(shifted) if self.dynamic_mask else self.attn_mask)
        x = timm_swin.window_reverse(windows.view(-1, wh, ww, C), (wh, ww), nh * wh, nw * ww)[:, :H, :W].contiguous()
        return torch.roll(x, (sh, sw), (1, 2)) if sh or sw else x


class RoPESwinTransformer(NoTorchScript, SwinTransformer):
    """timm's ``SwinTransformer`` with ``RoPEWindowAttention`` in every block; ``rope_theta=None``: ``SWIN_THETA``."""

    def __init__(self, encoding: str = "mixed", rope_theta: float | None = None, use_rpb: bool = False,
                 resolution_policy: str | dict | ResolutionPolicy | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoding_kind, self.use_rpb = encoding, use_rpb
        for stage in self.layers:
            for block in stage.blocks:
                block.__class__ = RoPESwinBlock  # timm's stages build their blocks themselves
                old = block.attn
                block.attn = RoPEWindowAttention(
                    old.dim, old.num_heads, old.qkv.out_features // 3 // old.num_heads, old.window_size,
                    old.qkv.bias is not None, old.attn_drop.p, old.proj_drop.p, encoding, rope_theta, use_rpb,
                    resolution_policy).to(old.qkv.weight.device, old.qkv.weight.dtype)
        if kwargs.get("weight_init") != "skip":
            self.init_weights(needs_reset=False)  # timm's init of the new projections

    @property
    def resolution_policy(self) -> ResolutionPolicy:
        return self.resolution_rope.policy

    def set_resolution_policy(self, policy: str | dict | ResolutionPolicy | None) -> None:
        """Choose how window-local positions follow windows other than the trained one; ``None``: ``extrapolate``."""
        for stage in self.layers:
            for block in stage.blocks:
                block.attn.rope.policy = policy

    @property
    def resolution_rope(self) -> RoPE2D:
        """The first block's RoPE, which says the policies that apply (``resolution_encoding``)."""
        return self.layers[0].blocks[0].attn.rope

    def forward_features(self, x: Tensor) -> Tensor:
        """timm's, for an image batch ``[B, C, H, W]``; a NaFlex batch is refused."""
        if isinstance(x, dict):
            raise TypeError("RoPE-Swin takes image batches [B, C, H, W], not NaFlex batches (a dict of patches): "
                            "its windows need each image's whole grid; resize the images to one size (any size "
                            "with dynamic_img_size=True), or use a vit_rope_* ViT for NaFlex batches")
        return super().forward_features(x)

    def no_weight_decay(self) -> set[str]:
        """timm's (the relative position bias tables) and the learned frequencies (RoPE-ViT)."""
        return super().no_weight_decay() | submodule_no_decay(self)


def is_official(state_dict: Mapping[str, Any]) -> bool:
    """RoPE-ViT's official RoPE-Swin files: window positions or frequencies (``attn.rope_t_x``, ``attn.rope_freqs``)."""
    return any(key.endswith(("attn.rope_t_x", "attn.rope_freqs")) for key in state_dict)


def is_swin(state_dict: Mapping[str, Any]) -> bool:
    """A Swin Transformer's keys (timm's or Microsoft's layout): window attention in ``layers.*.blocks.*``."""
    return any(key.startswith("layers.") and key.endswith(".attn.qkv.weight") for key in state_dict)


def _check_swin(model: nn.Module, source: str) -> None:
    """Refuse the weights of ``source`` for a model that is no RoPE-Swin."""
    if not isinstance(model, RoPESwinTransformer):
        raise ValueError(f"The checkpoint is {source}; load it into a swin_rope_{{axial,mixed}}_{{tiny,small,base}}_"
                         f"patch4_window7_224 model, not a {type(model).__name__}.")


def _biases(state_dict: dict[str, Any], model: RoPESwinTransformer) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The relative position bias tables dropped where the model has none (``use_rpb=False``), said in a note."""
    if model.use_rpb or not any(key.endswith("relative_position_bias_table") for key in state_dict):
        return state_dict, ()
    kept = {key: value for key, value in state_dict.items() if not key.endswith("relative_position_bias_table")}
    return kept, ("relative position bias tables dropped: the model has RoPE alone (use_rpb=True keeps them)",)


def from_official(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    """An official RoPE-Swin state dict in our layout (axial frequencies checked, window positions dropped)."""
    _check_swin(model, "RoPE-ViT's official RoPE-Swin")
    state_dict, notes = _biases(state_dict, model)
    out = {}
    for key, value in state_dict.items():
        if key.endswith("attn.rope_freqs"):
            rope = model.get_submodule(key.removesuffix("_freqs"))
            if rope.learnable:
                out[key.replace("rope_freqs", "rope.freqs")] = value
            elif not torch.allclose(value.float(), rope.freqs.expand_as(value), atol=1e-6):
                raise ValueError(f"{key} holds axial frequencies of another theta than this model's {rope.theta:g}: "
                                 "create the model with the checkpoint's rope_theta")
        elif not key.endswith(("rope_t_x", "rope_t_y")):  # window positions are rebuilt
            out[key] = value
    return checkpoint_filter_fn(out, model), ("RoPE-ViT's RoPE-Swin: window positions rebuilt, Microsoft's stage "
                                              "layout converted as timm converts it", *notes)


def from_swin(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    """timm's or Microsoft's Swin weights, to fine-tune with RoPE: timm's conversion, the bias tables as ``_biases``."""
    _check_swin(model, "a Swin Transformer's")
    state_dict, notes = _biases(state_dict, model)
    return checkpoint_filter_fn(state_dict, model), notes


def describe(state_dict: Mapping[str, Any]) -> Description:
    """The RoPE-Swin an official file is (axial frequencies: ``wy = 0`` on the first half), with its class count."""
    head = state_dict.get("head.weight", state_dict.get("head.fc.weight"))
    args = {} if head is None else {"num_classes": int(head.shape[0])}
    freqs = next((value for key, value in state_dict.items() if key.endswith("attn.rope_freqs")), None)
    width = state_dict["patch_embed.proj.weight"].shape[0] if "patch_embed.proj.weight" in state_dict else None
    depths = tuple(len({key.split(".")[3] for key in state_dict if key.startswith(f"layers.{i}.blocks.")})
                   for i in range(4))
    size = next((size for size, widths in SWIN_SIZES.items()
                 if widths["embed_dim"] == width and widths["depths"] == depths), None)
    if freqs is None or size is None:
        return None, args
    kind = "axial" if bool((freqs[1, :, : freqs.shape[-1] // 2] == 0).all()) else "mixed"
    return swin_name(kind, size), args


SWIN_SIZES = {"tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
              "small": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
              "base": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))}


def swin_name(kind: str, size: str) -> str:
    """The official name: ``swin_rope_{axial,mixed}_{tiny,small,base}_patch4_window7_224``."""
    return f"swin_rope_{kind}_{size}_patch4_window7_224"
