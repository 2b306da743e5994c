"""Attention and transformer block of timm's ViT, with one door for every position encoding: each block gets one
``encoding`` argument (RoPE tables, a ``BlockInput`` or ``None``) and knows no kind by name."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from timm.layers import maybe_add_mask, resolve_self_attn_mask
from timm.models.vision_transformer import Attention, Block
from torch import Tensor, nn

from vit_rope.layers.fused import plain_linear, rotate_normed, rotated_projection

RopeTables = tuple[Tensor, Tensor]


class BlockInput:
    """What one block's attention gets from its position encoding: ``project`` then ``attend``; as it is, RoPE tables
    ``(cos, sin)`` rotating q and k after the projection, or a dense ``bias`` ``[1 or B, nh, N, N]`` on the logits."""

    rope: RopeTables | None = None
    bias: Tensor | None = None

    def __init__(self, rope: RopeTables | None = None, bias: Tensor | None = None) -> None:
        self.rope, self.bias = rope, bias

    def project(self, attn: RoPEAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v ``[B, nh, N, D]`` of ``x``; q and k may come back wider than ``D``, v padded to their width."""
        return attn.project_tables(x, self.rope)

    def attend(self, attn: RoPEAttention, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        """Attention ``[B, nh, N, D]``: SDPA with ``bias``, or a form of the kind's own."""
        return attn.sdpa(q, k, v, self.bias, attn_mask, is_causal)


NO_INPUT = BlockInput()


def block_input(encoding: Any) -> BlockInput:
    """A block's ``encoding`` argument as the ``BlockInput`` it stands for (RoPE tables, or an FX proxy of them)."""
    if encoding is None:
        return NO_INPUT
    return encoding if isinstance(encoding, BlockInput) else BlockInput(rope=encoding)


def plain_projection(attn: RoPEAttention) -> bool:
    """Whether a ``BlockInput`` may compute ``attn``'s projection its own way: a plain, ungrouped qkv."""
    return attn.plain_qk and attn.num_kv_heads == attn.num_heads and plain_linear(attn.qkv)


class RoPEAttention(Attention):
    """timm ``Attention`` taking one ``encoding`` with timm's parameters and keys (ViT and DeiT-III weights load as they
    are); encodings may attach layers here (PaPE's ``pape``, STRING's ``string``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_kv_heads = self.num_heads
        self.v_norm: nn.Module = nn.Identity()  # a norm of each value head (Gemma 4's, without scale)

    def group_kv_heads_(self, num_kv_heads: int) -> None:
        """Grouped-query attention as timm's ``AttentionRope`` (Sapiens2); the projection stays one ``qkv`` (our key),
        rows ``[q heads; k heads; v heads]``, newly initialised."""
        if num_kv_heads < 1 or self.num_heads % num_kv_heads:
            divisors = [n for n in range(1, self.num_heads + 1) if self.num_heads % n == 0]
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={self.num_heads}: pick one of "
                             f"{divisors}")
        bias = self.qkv.bias is not None
        self.qkv = nn.Linear(self.qkv.in_features, (self.num_heads + 2 * num_kv_heads) * self.head_dim, bias=bias)
        self.num_kv_heads = num_kv_heads

    @property
    def plain_qk(self) -> bool:
        """No q/k (or v) norm: RoPE can rotate q and k straight in the projection output."""
        return all(isinstance(norm, nn.Identity) for norm in (self.q_norm, self.k_norm, self.v_norm))

    def project(self, x: Tensor, encoding: Any = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values as the ``BlockInput`` computes them; diagnostics reuse it for attention maps."""
        return block_input(encoding).project(self, x)

    def project_tables(self, x: Tensor, rope: RopeTables | None, weight: Tensor | None = None,
                       bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of ``x``, q and k rotated after the q/k norms; ``weight``, ``bias`` for a folded basis."""
        nh, nkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if rope is not None and self.plain_qk and nkv == nh:  # rotated in the projection's output
            return rotated_projection(x, self.qkv, nh, rope, weight, bias)
        qkv = self.qkv(x) if weight is None else F.linear(x, weight, bias)
        q, k, v = qkv.split([nh * D, nkv * D, nkv * D], dim=-1)
        q = self.q_norm(q.unflatten(-1, (nh, D)).transpose(1, 2))  # [B, nh, N, D]
        k = self.k_norm(k.unflatten(-1, (nkv, D)).transpose(1, 2))  # [B, nkv, N, D]
        v = self.v_norm(v.unflatten(-1, (nkv, D)).transpose(1, 2))  # [B, nkv, N, D]
        if rope is not None:  # in place only into the outputs of two norms that nothing else sees
            own = all(not isinstance(n, nn.Identity) and not n._forward_hooks for n in (self.q_norm, self.k_norm))
            q, k = rotate_normed(q, k, rope, own)
        if nkv != nh:
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        return q, k, v

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, attn_mask: Tensor | None = None,
             is_causal: bool = False) -> Tensor:
        """Attention with ``bias`` and ``attn_mask`` as one additive mask, which SDPA takes without a copy per image."""
        drop = self.attn_drop.p if self.training else 0.0
        N = q.shape[-2]
        if bias is not None:
            mask = bias.to(q.dtype).expand(q.shape[0], -1, -1, -1)  # [B, nh, N, N] view: no batch of 1 apart in export
            attn_mask, is_causal = maybe_add_mask(mask, resolve_self_attn_mask(N, mask, attn_mask, is_causal)), False
        if self.fused_attn:
            return F.scaled_dot_product_attention(  # 1 / sqrt(D) also when q and k carry PaPE's channels
                q, k, v, attn_mask=attn_mask, dropout_p=drop, is_causal=is_causal, scale=self.scale)
        attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, nh, N, N]
        attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal))
        return self.attn_drop(attn.softmax(dim=-1)) @ v

    def forward(self, x: Tensor, encoding: Any = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        encoding = block_input(encoding)
        q, k, v = encoding.project(self, x)  # [B, nh, N, D] each
        out = encoding.attend(self, q, k, v, attn_mask, is_causal)[..., : self.head_dim]  # v may be padded
        x = self.norm(out.transpose(1, 2).reshape(B, N, self.attn_dim))  # [B, N, nh * D]
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


class RoPEBlock(Block):
    """timm pre-norm ``Block`` (LayerScale, drop-path, Mlp) that hands its ``encoding`` to its attention."""

    def forward(self, x: Tensor, encoding: Any = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(
            self.norm1(x), encoding=encoding, attn_mask=attn_mask, is_causal=is_causal,
        )))  # keywords: hooks read them (vit_rope.eval.diagnostics)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
