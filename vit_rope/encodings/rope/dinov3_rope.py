"""The q / k layouts of checkpoints: DINOv3's (Simeoni et al. 2025, arXiv:2508.10104) rotate-half pairs, timm ``Eva``'s
EVA-02 (arXiv:2303.11331) and SBB y first, Perception Encoder's (arXiv:2504.13181) x first, reordered to ours once
when weights load (a permutation of q and k keeps ``q . k``)."""

from __future__ import annotations

import torch
from torch import Tensor

from vit_rope.checks import check_choice

QK_LAYOUTS = ("interleaved", "eva_ij", "eva_xy", "rotate_half", "gemma4")


def check_qk_layout(layout: str) -> str:
    return check_choice(layout, QK_LAYOUTS, "q/k layout")


def qk_permutation(layout: str, head_dim: int) -> Tensor:
    """Index ``[head_dim]``: row ``c`` of our q (or k) head is row ``index[c]`` of a head in ``layout`` (``gemma4``: x
    on the first half, y on the second, each in rotate-half pairs ``(c, c + D/4)``)."""
    channel = torch.arange(head_dim)
    if check_qk_layout(layout) in ("interleaved", "eva_xy"):
        return channel
    if layout == "gemma4":  # our pair p: axis p // (D/4), frequency p % (D/4)
        quarter, pair, place = head_dim // 4, channel // 2, channel % 2
        return (pair // quarter) * 2 * quarter + pair % quarter + place * quarter
    # the other axis first (EVA's y first; DINOv3's rotate-half): each channel's pair (p + D/4) mod D/2, its place
    pair, place = (channel // 2 + head_dim // 4) % (head_dim // 2), channel % 2
    return pair + place * (head_dim // 2) if layout == "rotate_half" else 2 * pair + place


def permute_qk_rows(value: Tensor, index: Tensor, num_heads: int, num_kv_heads: int | None = None) -> Tensor:
    """A qkv weight ``[(nh + 2 nkv) D, C]`` or bias with every q and k head's rows in the order ``index`` ``[D]``."""
    head_dim = index.numel()
    kv_rows = (num_heads if num_kv_heads is None else num_kv_heads) * head_dim
    q, k, v = value.split([num_heads * head_dim, kv_rows, kv_rows])
    index = index.to(value.device)
    q, k = (rows.unflatten(0, (-1, head_dim)).index_select(1, index).flatten(0, 1) for rows in (q, k))
    return torch.cat((q, k, v))
