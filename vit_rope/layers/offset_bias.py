"""Attention with a bias that depends only on the offset between two patches of a grid, without its ``[nh, N, N]``.

LookHere, 2D-ALiBi and FIRE add ``bias[h, p_k - p_q]`` to the logits. On an ``h x w`` grid there are only
``(2h - 1)(2w - 1)`` offsets, so the kind computes one table ``[nh, 2h - 1, 2w - 1]`` and attention reads it:

- on CPU, queries go through SDPA one chunk of grid rows at a time (``CHUNK_ELEMENTS`` bounds a chunk's mask; at
  least ``FLASH_QUERIES``, where SDPA's kernel runs at full speed), each chunk's additive mask copied out of a strided
  view of the table into one reused buffer. With the patch keys in
  reverse order, the bias of query ``(yq, xq)`` and reversed key ``(yk', xk')`` is ``flip(table)[yq + yk', xq + xk']``,
  a view with positive strides (``as_strided``), so the copy is one pass and no index is built. Memory is one chunk's
  mask, ``O(chunk x N)``, instead of ``O(N^2)`` per block;
- in training, ``_OffsetAttention`` keeps what flash attention keeps (output and log-sum-exp per query), and backward
  rebuilds each chunk's mask and runs flash attention's backward on it, or, for a learned table (FIRE), computes the
  chunk's products itself for the table's gradient; autograd would otherwise save every chunk's mask, ``O(N^2)``
  again;
- on CUDA, FlexAttention reads the table in its ``score_mod`` (a gather per score), so no mask exists at all.

Prefix tokens (class, registers) are neither biased nor penalised: their rows and columns are 0.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from vit_rope.layers.attention import BlockInput, RoPEAttention
from vit_rope.layers.capture import capturing

CHUNK_ELEMENTS = 2**25  # one chunk's mask (or backward's score block): 128 MiB in fp32
# a learned table's backward writes several score-sized products per chunk: smaller chunks stay in the CPU's caches
# (one grid row of queries at 896 px: 1.95 s a block's backward against 2.3 s with CHUNK_ELEMENTS, ViT-S, batch 4)
SCORE_ELEMENTS = 2**22


def offset_grid(h: int, w: int, device: torch.device | None = None) -> Tensor:
    """Every key-minus-query offset ``(dx, dy)`` of an ``h x w`` grid, ``[(2h - 1) (2w - 1), 2]``, in the row-major
    order of a table ``[2h - 1, 2w - 1]`` indexed by ``(dy + h - 1, dx + w - 1)``."""
    dy, dx = torch.meshgrid(torch.arange(1 - h, h, device=device), torch.arange(1 - w, w, device=device),
                            indexing="ij")
    return torch.stack((dx, dy), dim=-1).reshape(-1, 2)


def dense_bias(table: Tensor, grid: tuple[int, int], prefix: int = 0) -> Tensor:
    """The bias ``[nh, P + N, P + N]`` that ``table`` ``[nh, 2h - 1, 2w - 1]`` stands for: what attention adds to
    the logits, prefix rows and columns 0."""
    h, w = grid
    ys = torch.arange(h, device=table.device).repeat_interleave(w)
    xs = torch.arange(w, device=table.device).repeat(h)
    bias = table[:, ys[None, :] - ys[:, None] + h - 1, xs[None, :] - xs[:, None] + w - 1]  # [nh, N, N]
    return F.pad(bias, (prefix, 0, prefix, 0)) if prefix else bias


def _reversed_keys(x: Tensor, prefix: int) -> Tensor:
    """Keys or values ``[B, nh, P + N, D]`` with the patch tokens in reverse order (prefix tokens first, kept)."""
    return torch.cat((x[:, :, :prefix], x[:, :, prefix:].flip(2)), dim=2)


def _table_view(flipped: Tensor, grid: tuple[int, int]) -> Tensor:
    """``[nh, h, w, h, w]``: the bias of query ``(yq, xq)`` and reversed key ``(yk', xk')``, a view of the flipped
    table ``[nh, 2h - 1, 2w - 1]`` (contiguous): ``flipped[yq + yk', xq + xk']``."""
    h, w = grid
    row = flipped.stride(-2)
    return flipped.as_strided((flipped.shape[0], h, w, h, w), (flipped.stride(0), row, 1, row, 1))


def _chunks(grid: tuple[int, int], prefix: int, width: int, least: int = 1, elements: int | None = None
            ) -> list[tuple[int, int]]:
    """Query ranges: the prefix queries' own, then whole grid rows of patch queries, as many as keep a chunk's
    ``width``-wide rows within ``elements`` (``CHUNK_ELEMENTS``) but never fewer than ``least`` queries (nor one
    row)."""
    h, w = grid
    rows = max(-(-least // w), (elements or CHUNK_ELEMENTS) // (width * w), 1)
    return [(0, prefix)] * bool(prefix) + [(prefix + y * w, prefix + min(y + rows, h) * w) for y in range(0, h, rows)]


# SDPA's CPU flash kernel takes blocks of 256 queries from 768 queries on, of 64 or 32 below: far slower per query
FLASH_QUERIES = 768


class _Masks:
    """Each chunk's additive mask ``[1, nh, Q, P + N]`` (whole grid rows of queries) from the table view, written
    into one buffer whose prefix columns stay 0."""

    def __init__(self, view: Tensor, grid: tuple[int, int], prefix: int, dtype: torch.dtype) -> None:
        self.view, self.grid, self.prefix = view, grid, prefix
        self.buffer: Tensor | None = None
        self.dtype = dtype

    def __call__(self, start: int, stop: int) -> Tensor | None:
        if stop <= self.prefix:  # prefix queries: no bias
            return None
        nh, (h, w), P = self.view.shape[0], self.grid, self.prefix
        if self.buffer is None or self.buffer.shape[2] < stop - start:
            self.buffer = self.view.new_empty((1, nh, stop - start, P + h * w), dtype=self.dtype)
            self.buffer[..., :P] = 0
        mask = self.buffer[:, :, : stop - start]
        first = (start - P) // w
        mask[..., P:].view(1, nh, -1, w, h, w).copy_(self.view[None, :, first: first + (stop - start) // w])
        return mask


class _OffsetAttention(torch.autograd.Function):
    """Chunked attention with the offset bias whose backward rebuilds the masks (memory ``O(chunk x N)``); ``table``
    the flipped, scaled table ``[nh, 2h - 1, 2w - 1]``, keys and values already reversed."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, table: Tensor, grid: tuple[int, int], prefix: int,
                scale: float) -> Tensor:
        masks = _Masks(_table_view(table, grid), grid, prefix, q.dtype)
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))  # [B, nh, N]
        for start, stop in _chunks(grid, prefix, k.shape[-2] * q.shape[1], FLASH_QUERIES):
            out[:, :, start:stop], lse[:, :, start:stop] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, start:stop], k, v, attn_mask=masks(start, stop), scale=scale)
        ctx.save_for_backward(q, k, v, table, out, lse)
        ctx.grid, ctx.prefix, ctx.scale = grid, prefix, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, table, out, lse = ctx.saved_tensors
        (h, w), P, scale = ctx.grid, ctx.prefix, ctx.scale
        view = _table_view(table, ctx.grid)
        if not ctx.needs_input_grad[3]:  # a fixed table (LookHere, ALiBi): flash attention's own backward per chunk
            masks = _Masks(view, ctx.grid, P, q.dtype)
            dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for start, stop in _chunks(ctx.grid, P, k.shape[-2] * q.shape[1], FLASH_QUERIES):
                part = slice(start, stop)
                dq[:, :, part], dk_part, dv_part = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    grad[:, :, part], q[:, :, part], k, v, out[:, :, part], lse[:, :, part], 0.0, False,
                    attn_mask=masks(start, stop), scale=scale)
                dk += dk_part
                dv += dv_part
            return dq, dk, dv, None, None, None, None
        # a learned table (FIRE): the chunk's products written out, for the table's gradient from the scores'; each
        # product lands where the next step reads it (baddbmm: scores + mask - lse, dP - delta), fp32 at least
        acc, (B, nh, N, D) = torch.promote_types(q.dtype, torch.float32), k.shape
        masks = _Masks(view, ctx.grid, P, acc)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
        dtable = torch.zeros_like(table, dtype=acc)
        kf, vf = k.to(acc).reshape(B * nh, N, D), v.to(acc).reshape(B * nh, N, D)  # [B nh, N, D]
        dk3, dv3 = dk.view(B * nh, N, D), dv.view(B * nh, N, D)
        for start, stop in _chunks(ctx.grid, P, N * B * nh, elements=SCORE_ELEMENTS):  # all images of the batch
            Q, part = stop - start, slice(start, stop)
            qc, gc = (x[:, :, part].to(acc).reshape(B * nh, Q, D) for x in (q, grad))  # [B nh, Q, D]
            mask, lse_c = masks(start, stop), lse[:, :, part, None]  # [1, nh, Q, N], [B, nh, Q, 1]
            logits = mask - lse_c if mask is not None else (-lse_c).expand(B, nh, Q, N).contiguous()
            probs = logits.view(B * nh, Q, N).baddbmm_(qc, kf.transpose(1, 2), alpha=scale).exp_()
            dv3.baddbmm_(probs.transpose(1, 2), gc)
            delta = (gc * out[:, :, part].to(acc).reshape(B * nh, Q, D)).sum(-1, keepdim=True)  # [B nh, Q, 1]
            dscores = torch.baddbmm(delta, gc, vf.transpose(1, 2), beta=-1).mul_(probs)  # [B nh, Q, N]
            dq[:, :, part] = torch.bmm(dscores, kf).mul_(scale).view(B, nh, Q, D).to(q.dtype)
            dk3.baddbmm_(dscores.transpose(1, 2), qc, alpha=scale)
            if mask is not None:  # query (yq, xq) adds its [h, w] block of key gradients at flip(table)[yq:, xq:]
                first, rows = (start - P) // w, Q // w
                blocks = dscores.view(B, nh, Q, N)[..., P:].sum(0).transpose(1, 2)  # [nh, h w (the block), Q]
                dtable[:, first: first + rows + h - 1] += F.fold(blocks, (rows + h - 1, 2 * w - 1), (h, w))[:, 0]
        return dq, dk.to(k.dtype), dv.to(v.dtype), dtable.to(table.dtype), None, None, None


def _flex(q: Tensor, k: Tensor, v: Tensor, table: Tensor, grid: tuple[int, int], prefix: int, scale: float) -> Tensor:
    """FlexAttention whose ``score_mod`` adds ``table[h, dy + h - 1, dx + w - 1]``: no mask in memory (CUDA)."""
    from torch.nn.attention.flex_attention import flex_attention

    h, w = grid

    def score_mod(score: Tensor, b: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_idx - prefix, kv_idx - prefix
        dy = (kp // w - qp // w).clamp(1 - h, h - 1)
        dx = (kp % w - qp % w).clamp(1 - w, w - 1)
        return torch.where((qp >= 0) & (kp >= 0), score + table[head, dy + h - 1, dx + w - 1], score)

    run = _compiled_flex() if q.is_cuda else flex_attention
    return run(q, k, v, score_mod=score_mod, scale=scale)


@functools.cache
def _compiled_flex():  # noqa: ANN202  (a compiled callable)
    """``flex_attention`` compiled once: eager FlexAttention materialises the scores."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def offset_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, grid: tuple[int, int], prefix: int,
                     scale: float, flex: bool | None = None) -> Tensor:
    """Attention ``[B, nh, P + N, D]`` of q, k, v ``[B, nh, P + N, D]`` with ``table[h, p_k - p_q]`` ``[nh, 2h - 1,
    2w - 1]`` added to the logits of patch pairs, ``scale`` the logits' (``1 / sqrt(D)``). ``flex``: FlexAttention
    (default on CUDA) rather than chunked SDPA."""
    if flex if flex is not None else q.is_cuda:
        return _flex(q, k, v, table.to(q.dtype), grid, prefix, scale)
    k, v, flipped = _reversed_keys(k, prefix), _reversed_keys(v, prefix), table.flip(-2, -1).contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, table)):
        return _OffsetAttention.apply(q, k, v, flipped, grid, prefix, scale)
    masks = _Masks(_table_view(flipped, grid), grid, prefix, q.dtype)
    out = torch.empty_like(q)
    for start, stop in _chunks(grid, prefix, k.shape[-2] * q.shape[1], FLASH_QUERIES):
        out[:, :, start:stop] = F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=masks(start, stop),
                                                               scale=scale)
    return out


class OffsetBias(BlockInput):
    """A block's bias as a table of offsets ``[nh, 2h - 1, 2w - 1]`` (unscaled) times ``bias_scale``, for an image
    batch's grid. Attention reads it through ``offset_attention``; ``bias`` is the dense ``[1, nh, P + N, P + N]``
    (built on first use) for what needs the matrix itself: ``fused_attn = False``, a key-padding mask, dropout on the
    attention weights, a graph capture (ONNX export, FX, torch.compile on CPU)."""

    def __init__(self, table: Tensor, scale: float, grid: tuple[int, int], prefix: int,
                 dense: dict[str, Tensor] | None = None) -> None:
        self.table, self.bias_scale, self.grid, self.prefix = table, scale, grid, prefix
        self._dense = {} if dense is None else dense  # shared by the blocks of one table

    @property
    def bias(self) -> Tensor:  # type: ignore[override]
        if "bias" in self._dense:
            return self._dense["bias"]
        bias = dense_bias(self.table, self.grid, self.prefix)[None]  # [1, nh, P + N, P + N]
        if bias.numel() <= CHUNK_ELEMENTS:  # kept for the other blocks (and the next call) while it is small
            self._dense["bias"] = bias
        return bias

    def attend(self, attn: RoPEAttention, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor | None:
        dropout = attn.training and attn.attn_drop.p > 0
        if not attn.fused_attn or attn_mask is not None or is_causal or dropout or capturing(q):
            return None
        table = self.table * self.bias_scale
        return offset_attention(q, k, v, table, self.grid, self.prefix, attn.scale)
