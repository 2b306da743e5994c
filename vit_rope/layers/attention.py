"""Attention and transformer block of timm's ViT, with one door for every position encoding.

Each block gets one ``encoding`` argument from the model's position encoding (``vit_rope.encodings``), built once per
forward, and attention knows no kind by name. It is one of:

- RoPE tables ``(cos, sin)`` (RoFormer, arXiv:2104.09864; RoPE-ViT, arXiv:2403.13298): q and k are rotated by the
  position of their token before the dot product, v is not; prefix tokens (class, registers) have identity rows, so
  they are never rotated. This is the path of the fused kernels and the one TorchScript compiles;
- a ``BlockInput``: a projection of its own (a basis folded into the weights, then RoPE tables: Cayley-STRING,
  ComRoPE's RoPE form), a transform of q, k and v after the projection and the q/k norms (ComRoPE's and LieRE's block
  rotations, PaPE's parabola channels) and an attention bias ``[1 or B, nh, N, N]`` added to the logits times
  ``bias_scale`` (LookHere, 2D-ALiBi);
- ``None``: content only.
"""

from __future__ import annotations

from typing import Any, Tuple  # noqa: UP035  (torch.jit.isinstance needs typing's Tuple)

import torch
import torch.nn.functional as F
from timm.layers import maybe_add_mask, resolve_self_attn_mask
from timm.models.vision_transformer import Attention, Block
from torch import Tensor, nn

from vit_rope.layers.capture import capturing
from vit_rope.layers.fused import (
    pairs_adjacent,
    plain_linear,
    project_rotate_qk,
    project_weights_rotate_qk,
    rotate_heads_,
)
from vit_rope.layers.rotary import apply_rope

RopeTables = tuple[Tensor, Tensor]


class BlockInput:
    """What one block's attention gets from a position encoding other than plain RoPE tables: a projection of its
    own, a transform of q, k and v after the projection and the q/k norms, an attention bias, or several. The base
    changes nothing; each kind's input overrides what it uses. ``RoPEAttention`` calls these in eager mode, under
    ``torch.compile``, FX and export (never TorchScript, which compiles RoPE tables only).

    Attributes:
        bias: logits ``[1 or B, nh, N, N]`` added to every query's scores times ``bias_scale``; ``None``: none.
    """

    bias: Tensor | None = None
    bias_scale: float = 1.0

    def project(self, attn: RoPEAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """q, k and v ``[B, nh, N, D]`` of the tokens ``x`` ``[B, N, C]`` computed in place of ``attn``'s projection
        and ``transform`` (an equal but cheaper form, or the kind's own weights: ``attn.project_tables``), or
        ``None`` for the projection."""
        return None

    def transform(self, attn: RoPEAttention, x: Tensor, q: Tensor, k: Tensor, v: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v ``[B, nh, N, D]`` as the encoding changes them (``x`` the attention's input tokens); q and k
        may come back wider than ``D``, v padded to their width (attention keeps the first ``D`` channels)."""
        return q, k, v

    def attend(self, attn: RoPEAttention, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor | None:
        """Attention ``[B, nh, N, D]`` computed in a form of the encoding's own (a bias read without its ``[nh, N,
        N]`` matrix: ``vit_rope.layers.offset_bias``), or ``None``: attention's, with ``bias`` if any."""
        return None


def plain_projection(attn: RoPEAttention, x: Tensor) -> bool:
    """Whether a ``BlockInput`` may compute ``attn``'s projection of ``x`` in a form of its own (``project``) from
    ``attn.qkv``'s weights: no graph capture, no q/k norms or grouped keys, and a ``qkv`` that is a plain
    ``nn.Linear`` without hooks, whose weights then say all it computes (not so for a LoRA-style wrapper)."""
    return not capturing(x) and attn.plain_qk and attn.num_kv_heads == attn.num_heads and plain_linear(attn.qkv)


def rope_tables(encoding: Any) -> RopeTables | None:
    """The RoPE tables a block got, or ``None`` for a ``BlockInput`` or no encoding. Eager mode and FX tell them
    apart by class (a traced table is a proxy, not a tuple); TorchScript refines its ``Any``."""
    if torch.jit.is_scripting():
        if torch.jit.isinstance(encoding, Tuple[Tensor, Tensor]):  # noqa: UP006
            return encoding
        return None
    if encoding is None or isinstance(encoding, BlockInput):
        return None
    return encoding


class RoPEAttention(Attention):
    """timm ``Attention`` whose ``forward`` takes one ``encoding`` per call: RoPE tables, a ``BlockInput`` or
    ``None`` (the module docstring).

    Same parameters and state-dict keys as timm's ``Attention``, so ViT and DeiT-III weights load unchanged.
    ``F.scaled_dot_product_attention`` is the fast path; ``fused_attn = False`` computes the same scores
    explicitly (useful to inspect attention maps). An encoding may put layers of its own here
    (``PositionEncoding.attach_``: PaPE's ``pape``, STRING's ``string``), which its ``BlockInput`` uses.
    ``num_kv_heads`` below ``num_heads`` is grouped-query attention (``group_kv_heads_``).
    """

    __jit_unused_properties__ = ["plain_qk"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_kv_heads = self.num_heads

    def group_kv_heads_(self, num_kv_heads: int) -> None:
        """Grouped-query attention as timm's ``AttentionRope`` (Sapiens2): ``num_kv_heads`` key / value heads, head
        ``h`` reading kv head ``h // (num_heads // num_kv_heads)``. The projection stays one ``qkv`` (our key), with
        rows ``[q heads; k heads; v heads]``: ``[(nh + 2 nkv) D, C]``, newly initialised."""
        if num_kv_heads < 1 or self.num_heads % num_kv_heads:
            divisors = [n for n in range(1, self.num_heads + 1) if self.num_heads % n == 0]
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={self.num_heads}: pick one of "
                             f"{divisors}")
        bias = self.qkv.bias is not None
        self.qkv = nn.Linear(self.qkv.in_features, (self.num_heads + 2 * num_kv_heads) * self.head_dim, bias=bias)
        self.num_kv_heads = num_kv_heads

    def _project_grouped(self, x: Tensor, rope: RopeTables | None) -> tuple[Tensor, Tensor, Tensor]:
        """``project`` under grouped-query attention: k and v rotated and normed per kv head, then repeated."""
        nh, nkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split([nh * D, nkv * D, nkv * D], dim=-1)
        q = self.q_norm(q.unflatten(-1, (nh, D)).transpose(1, 2))  # [B, nh, N, D]
        k = self.k_norm(k.unflatten(-1, (nkv, D)).transpose(1, 2))  # [B, nkv, N, D]
        v = v.unflatten(-1, (nkv, D)).transpose(1, 2)  # [B, nkv, N, D]
        if rope is not None:
            q, k = self._rotate_normed(q, k, rope)
        groups = nh // nkv
        return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)

    def project(self, x: Tensor, encoding: Any = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys (rotated, or as the ``BlockInput`` ``encoding`` computes or transforms them) and values,
        each ``[B, nh, N, D]`` (q and k wider with PaPE's channels); diagnostics reuse it for attention maps.

        In eager mode q and k are rotated straight in the projection output (``project_rotate_qk``: one pass, in
        place, no extra memory). torch.compile, FX tracing and TorchScript take the reference ``apply_rope`` instead:
        compile fuses it as it does the q/k norms, and the others cannot see through an autograd Function that
        writes in place.
        """
        rope = rope_tables(encoding)
        if not torch.jit.is_scripting():  # TorchScript compiles only what this branch leaves out
            if rope is None and encoding is not None:
                projected = encoding.project(self, x)
                if projected is not None:
                    return projected
        if self.num_kv_heads != self.num_heads:
            q, k, v = self._project_grouped(x, rope)
        else:
            q, k, v = self.project_tables(x, rope)
        if not torch.jit.is_scripting():  # eager, compiled and exported; k and v repeated under GQA
            if rope is None and encoding is not None:
                q, k, v = encoding.transform(self, x, q, k, v)
        return q, k, v

    def project_tables(self, x: Tensor, rope: RopeTables | None, weight: Tensor | None = None,
                       bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v ``[B, nh, N, D]`` of ``x`` with as many key / value heads as query heads, q and k rotated by
        ``rope`` after the q/k norms; ``weight`` and ``bias`` (``[3 nh D, C]``, ``[3 nh D]``) in place of ``qkv``'s,
        for an encoding that folds a basis into them (Cayley-STRING, ComRoPE's RoPE form)."""
        if not torch.jit.is_scripting():  # TorchScript compiles only what this branch leaves out
            if rope is not None and self.plain_qk and not capturing(x):
                if weight is None:
                    qkv = project_rotate_qk(self.qkv, x, self.num_heads, *rope)  # [B, N, 3, nh, D]
                else:
                    qkv = project_weights_rotate_qk(x, weight, bias, self.num_heads, *rope)
                q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, N, D] each
                return q, k, v
        qkv = self.qkv(x) if weight is None else F.linear(x, weight, bias)
        qkv = qkv.unflatten(-1, (3, self.num_heads, self.head_dim))  # [B, N, 3, nh, D]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, N, D] each
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self._rotate_normed(q, k, rope)
        return q, k, v

    def _rotate_normed(self, q: Tensor, k: Tensor, rope: RopeTables) -> tuple[Tensor, Tensor]:
        """q and k rotated after the q/k norms (or on the reference path): in place in eager inference when the norms
        made them (``rotate_heads_``: one product each), else out of place (``apply_rope``)."""
        if not torch.jit.is_scripting():
            if self._rotates_normed_in_place(q, k):
                return rotate_heads_(q, k, rope[0], rope[1])
        return apply_rope(q, rope[0], rope[1]), apply_rope(k, rope[0], rope[1])

    @torch.jit.unused
    def _rotates_normed_in_place(self, q: Tensor, k: Tensor) -> bool:
        """Eager inference, and q and k are the outputs of two norms that nothing else sees (no forward hooks, no
        ``Identity`` passing on a view of the projection): tensors of this call's own, which may be overwritten."""
        own = all(not isinstance(norm, nn.Identity) and not norm._forward_hooks for norm in (self.q_norm, self.k_norm))
        return (own and not torch.is_grad_enabled() and not capturing(q) and pairs_adjacent(q)
                and pairs_adjacent(k))

    def _biased(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, attn_mask: Tensor | None,
                is_causal: bool = False) -> Tensor:
        """Attention with ``scale * bias`` ``[1 or B, nh, N, N]`` added to the logits and ``attn_mask`` (a NaFlex
        batch's key padding, boolean or additive; or ``is_causal``) applied with it, as one additive mask.

        SDPA takes the mask (``[1, nh, N, N]`` for a plain grid: no copy per image); it is faster on CPU than the
        explicit product + in-place bias + softmax below (docs/performance.md, "Attention with a bias"), which serves
        ``fused_attn = False`` (attention maps, the reference).
        """
        drop = self.attn_drop.p if self.training else 0.0
        N = q.shape[-2]
        if self.fused_attn:
            mask = (bias * scale).to(q.dtype)  # [1 or B, nh, N, N]
            mask = maybe_add_mask(mask, resolve_self_attn_mask(N, mask, attn_mask, is_causal))  # timm's: FX-safe
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=self.scale)
        attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, nh, N, N]
        attn = attn.add_(bias, alpha=scale)  # in place: the product's backward does not need it
        attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal))
        return self.attn_drop(attn.softmax(dim=-1)) @ v

    @property
    def plain_qk(self) -> bool:
        """No q/k norm: RoPE can rotate q and k straight in the projection output."""
        return isinstance(self.q_norm, nn.Identity) and isinstance(self.k_norm, nn.Identity)

    def forward(self, x: Tensor, encoding: Any = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        """Attention of the tokens ``x`` ``[B, N, C]`` with what the model's encoding gives this block: RoPE tables,
        a ``BlockInput`` or ``None`` (``project``)."""
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.project(x, encoding)
        attended: Tensor | None = None
        bias: Tensor | None = None
        bias_scale = 1.0
        if not torch.jit.is_scripting():
            if isinstance(encoding, BlockInput):
                attended = encoding.attend(self, q, k, v, attn_mask, is_causal)
                if attended is None:
                    bias, bias_scale = encoding.bias, encoding.bias_scale
        if attended is not None:
            x = attended
        elif bias is not None:
            x = self._biased(q, k, v, bias, bias_scale, attn_mask, is_causal)
        elif self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop.p if self.training else 0.0, is_causal=is_causal,
                scale=self.scale,  # 1 / sqrt(D) also when q and k carry PaPE's channels
            )
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, nh, N, N]
            attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal))
            x = self.attn_drop(attn.softmax(dim=-1)) @ v
        if not torch.jit.is_scripting():
            if isinstance(encoding, BlockInput):  # v may be padded to the width of the encoding's wider q and k
                x = x[..., : self.head_dim]

        x = self.norm(x.transpose(1, 2).reshape(B, N, self.attn_dim))  # [B, N, nh * D]
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


class RoPEBlock(Block):
    """timm pre-norm ``Block`` (LayerScale, drop-path, Mlp) that hands its encoding's input (RoPE tables, a
    ``BlockInput`` or ``None``) to its attention."""

    def forward(self, x: Tensor, encoding: Any = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(
            self.norm1(x), encoding=encoding, attn_mask=attn_mask, is_causal=is_causal,
        )))  # keywords: hooks read them (vit_rope.eval.diagnose)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
