"""The bias family's shared maths: patch offsets (``policies.policy_scale`` scales them) and attention with a bias per
offset read from a table ``[nh, 2h - 1, 2w - 1]``, never its ``[nh, N, N]`` matrix: on CPU by chunks of grid rows (or,
in inference above one chunk, the table read in place), on CUDA by FlexAttention's ``score_mod`` (performance.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vit_rope.encodings.base import BlockInput
from vit_rope.encodings.policies import per_sample
from vit_rope.layers.attention import RoPEAttention

CHUNK_ELEMENTS = 2**25  # one chunk's mask: 128 MiB in fp32
# a learned table's backward: score-sized products per chunk that stay in the CPU's caches (896 px: 1.95 s, not 2.3)
SCORE_ELEMENTS = 2**22
# SDPA's CPU flash kernel takes query blocks of 256 from 768 queries on, of 64 from 192, of 32 below (far slower)
FLASH_QUERIES, ROW_QUERIES = 768, 192


def scaled_offsets(positions: Tensor, scale: Tensor | None) -> Tensor:
    """Key-minus-query offsets ``[..., N, N, 2]`` of positions ``[..., N, 2]``, times ``scale`` ``[1 or B, 2]``
    after the difference: the same value for every pair at the same offset, to the bit, as a table per offset has."""
    pos = positions.float()
    offsets = pos[..., None, :, :] - pos[..., :, None, :]
    return offsets if scale is None else offsets * per_sample(scale, pos).unsqueeze(-2)


def pad_prefix(table: Tensor, num_prefix_tokens: int) -> Tensor:
    return F.pad(table, (num_prefix_tokens, 0, num_prefix_tokens, 0)) if num_prefix_tokens else table


def dense_bias(table: Tensor, grid: tuple[int, int], prefix: int = 0) -> Tensor:
    """The bias ``[nh, P + N, P + N]`` that ``table`` ``[nh, 2h - 1, 2w - 1]`` stands for, prefix rows and columns 0."""
    h, w = grid
    ys = torch.arange(h, device=table.device).repeat_interleave(w)
    xs = torch.arange(w, device=table.device).repeat(h)
    return pad_prefix(table[:, ys[None, :] - ys[:, None] + h - 1, xs[None, :] - xs[:, None] + w - 1], prefix)


def _table_view(flipped: Tensor, grid: tuple[int, int]) -> Tensor:
    """``[nh, h, w, h, w]``: the bias of query ``(yq, xq)`` and reversed key ``(yk', xk')``, ``flipped[yq + yk', xq +
    xk']``, a view of the contiguous flipped table."""
    h, w = grid
    row = flipped.stride(-2)
    return flipped.as_strided((flipped.shape[0], h, w, h, w), (flipped.stride(0), row, 1, row, 1))


def _chunks(grid: tuple[int, int], prefix: int, width: int, least: int = 1, elements: int | None = None
            ) -> list[tuple[int, int]]:
    """Query ranges: the prefix queries', then whole grid rows, as many as keep ``width``-wide rows within ``elements``
    (``CHUNK_ELEMENTS``), never fewer than ``least`` queries (nor one row)."""
    h, w = grid
    rows = max(-(-least // w), (elements or CHUNK_ELEMENTS) // (width * w), 1)
    return [(0, prefix)] * bool(prefix) + [(prefix + y * w, prefix + min(y + rows, h) * w) for y in range(0, h, rows)]


def _masks(view: Tensor, prefix: int, dtype: torch.dtype) -> Callable[[int, int], Tensor | None]:
    """Each chunk's mask ``[1, nh, Q, P + N]`` (``None`` for prefix queries), copied from the view into one buffer."""
    (nh, h, w), buffer = view.shape[:3], []

    def mask(start: int, stop: int) -> Tensor | None:
        if stop <= prefix:
            return None
        if not buffer or buffer[0].shape[2] < stop - start:
            buffer[:] = [view.new_empty((1, nh, stop - start, prefix + h * w), dtype=dtype)]
            buffer[0][..., :prefix] = 0
        out = buffer[0][:, :, : stop - start]
        out[..., prefix:].view(1, nh, -1, w, h, w).copy_(view[None, :, (start - prefix) // w: (stop - prefix) // w])
        return out

    return mask


def _chunked(q: Tensor, k: Tensor, v: Tensor, flipped: Tensor, grid: tuple[int, int], prefix: int, scale: float,
             lse: Tensor | None = None) -> Tensor:
    """SDPA by chunks of queries on reversed keys and values; flash attention's log-sum-exp into ``lse`` if given."""
    masks = _masks(_table_view(flipped, grid), prefix, q.dtype)
    out = torch.empty_like(q)
    for start, stop in _chunks(grid, prefix, k.shape[-2] * q.shape[1], FLASH_QUERIES):
        part, mask = slice(start, stop), masks(start, stop)
        if lse is None:
            out[:, :, part] = F.scaled_dot_product_attention(q[:, :, part], k, v, attn_mask=mask, scale=scale)
        else:
            out[:, :, part], lse[:, :, part] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, part], k, v, attn_mask=mask, scale=scale)
    return out


def _by_rows(q: Tensor, k: Tensor, v: Tensor, flipped: Tensor, grid: tuple[int, int], prefix: int,
             scale: float) -> Tensor:
    """Inference with no mask written: each ``g`` grid rows of queries (``g w >= ROW_QUERIES``) are one flash-attention
    entry over the reversed patch keys (expanded, not copied), its mask a strided view of the table laid out per query
    row in the group and column, ``[nh, g, w, Y, w]`` (``flipped[:, Y + t, xq + xk']`` at ``[:, t, xq, Y, xk']``):
    query ``(g r + t, xq)``'s biases are its ``h w`` values from ``[:, t, xq, g r]`` on. Heads lead the kernel's batch
    (a thread reads one head's table); prefix keys (no bias) join by the log-sum-exp. Costs: docs/performance.md."""
    (h, w), (B, nh), P = grid, q.shape[:2], prefix
    g = min(h, -(-ROW_QUERIES // w))
    entries, pad = -(-h // g), -h % g  # pad: grid rows of zero queries that fill the last entry
    table = F.pad(flipped, (0, 0, 0, pad)) if pad else flipped  # the rows those queries read
    rows = (entries - 1) * g + h
    layout = table.as_strided((nh, g, w, rows, w), (table.stride(0), table.stride(1), 1, table.stride(1), 1))
    layout = layout.contiguous()
    mask = layout.as_strided((nh, entries, g * w, h * w), (layout.stride(0), g * w, layout.stride(2), 1))
    blind = None  # with prefix keys, the queries that see no patch: flash attention gives them a log-sum-exp of 0
    if P:
        blind = flipped.unfold(2, w, 1).amax(-1).unfold(1, h, 1).amax(-1) == float("-inf")  # [nh, h, w]
        blind = F.pad(blind.flatten(1), (0, pad * w)).view(nh, entries, g * w)
    out = torch.empty_like(q)
    for b in range(B):  # the rows of one image share its keys
        queries = q[b, :, P:] if not pad else F.pad(q[b, :, P:], (0, 0, 0, pad * w))
        queries = queries.unflatten(1, (entries, g * w))  # [nh, entries, g w, D]
        keys, values = (x[b, :, None, P:].expand(-1, entries, -1, -1) for x in (k, v))  # [nh, entries, N, D]
        part, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(queries, keys, values, attn_mask=mask,
                                                                                scale=scale)[:2]
        if P:
            logits = (queries @ k[b, :, None, :P].transpose(-1, -2)).to(lse.dtype) * scale  # [nh, entries, g w, P]
            lse = lse.masked_fill(blind, float("-inf"))
            total = torch.logaddexp(lse, logits.logsumexp(-1))
            part = part * (lse - total).exp()[..., None] + (logits - total[..., None]).exp() @ v[b, :, None, :P].to(
                lse.dtype)
        out[b, :, P:] = part.flatten(1, 2)[:, : h * w]
    if P:
        out[:, :, :P] = F.scaled_dot_product_attention(q[:, :, :P], k, v, scale=scale)
    return out


class _OffsetAttention(torch.autograd.Function):
    """``_chunked`` whose backward rebuilds the masks (memory ``O(chunk x N)``)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, table: Tensor, grid: tuple[int, int], prefix: int,
                scale: float) -> Tensor:
        lse = q.new_empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))  # [B, nh, N]
        out = _chunked(q, k, v, table, grid, prefix, scale, lse)
        ctx.save_for_backward(q, k, v, table, out, lse)
        ctx.grid, ctx.prefix, ctx.scale = grid, prefix, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, table, out, lse = ctx.saved_tensors
        (h, w), P, scale = ctx.grid, ctx.prefix, ctx.scale
        view = _table_view(table, ctx.grid)
        if not ctx.needs_input_grad[3]:  # a fixed table (LookHere, ALiBi): flash attention's own backward per chunk
            masks = _masks(view, P, q.dtype)
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
        masks = _masks(view, P, acc)
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
def _compiled_flex() -> Callable[..., Tensor]:
    """Compiled once: eager FlexAttention materialises the scores."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def offset_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, grid: tuple[int, int], prefix: int,
                     scale: float, flex: bool | None = None) -> Tensor:
    """Attention with ``table[h, p_k - p_q]`` added to patch pairs' logits; ``flex``: FlexAttention, not chunks."""
    if flex if flex is not None else q.is_cuda:
        return _flex(q, k, v, table.to(q.dtype), grid, prefix, scale)
    # the patch keys and values in reverse order (prefix tokens first, kept), against the flipped table
    k, v = (torch.cat((x[:, :, :prefix], x[:, :, prefix:].flip(2)), dim=2) for x in (k, v))
    flipped = table.flip(-2, -1).contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, table)):
        return _OffsetAttention.apply(q, k, v, flipped, grid, prefix, scale)
    if q.device.type == "cpu" and q.shape[-2] * k.shape[-2] * q.shape[1] > CHUNK_ELEMENTS:  # no masks (CPU kernel)
        return _by_rows(q, k, v, flipped, grid, prefix, scale)
    return _chunked(q, k, v, flipped, grid, prefix, scale)


class OffsetBias(BlockInput):
    """An image batch's bias as a table per offset ``[nh, 2h - 1, 2w - 1]`` times ``scale`` for ``offset_attention``;
    the dense ``bias`` (kept in ``dense`` while small) serves ``fused_attn = False``, padding masks, dropout."""

    def __init__(self, table: Tensor, scale: float, grid: tuple[int, int], prefix: int,
                 dense: dict[str, Tensor] | None = None) -> None:
        self.table, self.scale, self.grid, self.prefix = table, scale, grid, prefix
        self._dense = {} if dense is None else dense  # shared by the blocks of one table

    @property
    def bias(self) -> Tensor:  # type: ignore[override]
        bias = self._dense.get("bias")
        if bias is None:
            bias = dense_bias(self.table, self.grid, self.prefix)[None]  # [1, nh, P + N, P + N]
            if bias.numel() <= CHUNK_ELEMENTS:  # small enough to keep for the other blocks
                self._dense["bias"] = bias
        return bias * self.scale

    def attend(self, attn: RoPEAttention, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        if not attn.fused_attn or attn_mask is not None or is_causal or (attn.training and attn.attn_drop.p > 0):
            return super().attend(attn, q, k, v, attn_mask, is_causal)  # the dense bias
        return offset_attention(q, k, v, self.table * self.scale, self.grid, self.prefix, attn.scale)
