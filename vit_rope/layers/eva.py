"""The pieces of timm's ``Eva`` that ``VisionTransformer``'s arguments cannot name: EVA-02's packed SwiGLU
(arXiv:2303.11331), Perception Encoder's attention pool (arXiv:2504.13181) and Sapiens2's blocks (arXiv:2604.21681)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from timm.layers import AttentionPoolLatent, GluMlp
from torch import nn

from vit_rope.checks import check_choice


class PackedSwiGLU(GluMlp):
    """``GluMlp(gate_last=False)`` with SiLU, the hidden width of one branch doubled as ``Eva`` doubles it
    (``2 * int(1024 * 8/3) = 5460``, where ``int(1024 * 16/3) = 5461`` would not load)."""

    def __init__(self, in_features: int, hidden_features: int, **kwargs: Any) -> None:
        kwargs["act_layer"] = nn.SiLU
        super().__init__(in_features, hidden_features * 2, gate_last=False, **kwargs)


def resize_attn_pool(pool: AttentionPoolLatent | None, num_heads: int | None, mlp_ratio: float | None
                     ) -> AttentionPoolLatent:
    """A new attention pool like ``pool`` with ``num_heads`` heads and MLP ratio ``mlp_ratio`` (``None``: its own)."""
    if pool is None:
        raise ValueError(f"attn_pool_num_heads={num_heads} and attn_pool_mlp_ratio={mlp_ratio} shape the attention-"
                         "pool head, which only global_pool='map' has: set global_pool='map' or leave them unset.")
    dim = pool.kv.in_features
    return AttentionPoolLatent(dim, num_heads=num_heads or pool.num_heads,
                               mlp_ratio=mlp_ratio or pool.mlp.fc1.out_features / dim,
                               norm_layer=partial(type(pool.norm), eps=pool.norm.eps), act_layer=type(pool.mlp.act))


LAYER_SCALES = ("both", "attn")


def eva_blocks_(blocks: nn.Sequential, num_kv_heads: int | Sequence[int] | None, layer_scale: str) -> None:
    """Give ``blocks`` timm ``Eva``'s per-block options: grouped-query attention, LayerScale on attention only."""
    check_choice(layer_scale, LAYER_SCALES, "layer_scale")
    per_block = [num_kv_heads] * len(blocks) if num_kv_heads is None or isinstance(num_kv_heads, int) else \
        list(num_kv_heads)
    if len(per_block) != len(blocks):
        raise ValueError(f"num_kv_heads has {len(per_block)} entries for {len(blocks)} blocks: give one per block "
                         "(or one int for all), and set it again when you change depth.")
    for block, heads in zip(blocks, per_block, strict=True):
        if heads is not None and heads != block.attn.num_heads:
            block.attn.group_kv_heads_(heads)
        if layer_scale == "attn":
            block.ls2 = nn.Identity()
