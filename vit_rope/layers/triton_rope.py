"""Triton kernels of the fused q/k rotation (``vit_rope.layers.fused``): forward and backward in one pass each, on CUDA.

A head's channels move as one contiguous tile (16-byte accesses; tests check the sm_90 PTX); backward sums the table
gradient through one ``sum_to_size``: no atomics, deterministic. On CPU tensors Triton's interpreter runs them."""

from __future__ import annotations

import functools
import importlib.util

import torch
from torch import Tensor

AVAILABLE = importlib.util.find_spec("triton") is not None
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit
    def _rotate_kernel(
        src, dst, out, grad_cos, grad_sin, cos, sin,
        N, NH,
        s_b, s_n, s_3, s_h,  # src strides (the last one is 1)
        d_b, d_n, d_3, d_h,  # dst strides
        o_b, o_n, o_3, o_h,  # out strides (backward with table gradient)
        t_b, t_h, t_n, t_j,  # cos/sin strides, as [B, nh, N, D/2] (0 where shared)
        NUM_TOKENS,
        HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr,
        CONJ: tl.constexpr, COPY_V: tl.constexpr, TABLE_GRAD: tl.constexpr,
    ):
        """``dst[q, k] = src[q, k] * t`` (``conj(t)`` if CONJ), ``dst[v] = src[v]`` if COPY_V, per BLOCK_T tokens of
        one head; with TABLE_GRAD also ``conj(x) dy`` summed over q and k into grad_cos/sin."""
        token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [T] over B * N
        head = tl.program_id(1)
        j = tl.arange(0, BLOCK_J)  # pair index
        b, n = (token // N).to(tl.int64), token % N  # int64 offsets: activations may pass 2**31 elements
        mask = (token < NUM_TOKENS)[:, None] & (j < HALF)[None, :]  # [T, J]

        t_off = b[:, None] * t_b + head * t_h + n[:, None] * t_n + j[None, :] * t_j
        c = tl.load(cos + t_off, mask=mask, other=1.0).to(tl.float32)
        s = tl.load(sin + t_off, mask=mask, other=0.0).to(tl.float32)
        if CONJ:
            s = -s

        # [T, 2J] offsets of a head's channels, contiguous: the compiler can issue 16-byte loads and stores; pairs
        # (x0, x1), (x2, x3), ... come out of a reshape to [T, J, 2] and a split, and go back through a join
        ch = tl.arange(0, 2 * BLOCK_J)
        mask2 = (token < NUM_TOKENS)[:, None] & (ch < 2 * HALF)[None, :]
        src_tok = (b * s_b + n * s_n)[:, None] + head * s_h + ch[None, :]
        dst_tok = (b * d_b + n * d_n)[:, None] + head * d_h + ch[None, :]
        acc0 = c * 0.0  # [T, J] fp32 (not tl.zeros: a jit function, which Triton's interpreter cannot call)
        acc1 = c * 0.0
        for qk in tl.static_range(2):
            x = tl.load(src + src_tok + qk * s_3, mask=mask2, other=0.0).to(tl.float32)
            x0, x1 = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_J, 2]))
            y = tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), [BLOCK_T, 2 * BLOCK_J])  # (x0 + i x1)(c + i s)
            tl.store(dst + dst_tok + qk * d_3, y.to(dst.dtype.element_ty), mask=mask2)
            if TABLE_GRAD:  # conj(y) dy, with y the forward output; dividing by t comes after the q + k sum
                o_tok = (b * o_b + n * o_n)[:, None] + head * o_h + ch[None, :] + qk * o_3
                yo = tl.load(out + o_tok, mask=mask2, other=0.0).to(tl.float32)
                y0, y1 = tl.split(tl.reshape(yo, [BLOCK_T, BLOCK_J, 2]))
                acc0 += y0 * x0 + y1 * x1
                acc1 += y0 * x1 - y1 * x0
        if COPY_V:
            v = tl.load(src + src_tok + 2 * s_3, mask=mask2, other=0.0)
            tl.store(dst + dst_tok + 2 * d_3, v.to(dst.dtype.element_ty), mask=mask2)
        if TABLE_GRAD:  # conj(x) dy = conj(y) dy * t / |t|^2; here s = -sin (CONJ), so t = c - i s
            norm = c * c + s * s
            g_off = ((b * NH + head) * N + n)[:, None] * HALF + j[None, :]  # contiguous [B, nh, N, D/2]
            tl.store(grad_cos + g_off, (acc0 * c + acc1 * s) / norm, mask=mask)
            tl.store(grad_sin + g_off, (acc1 * c - acc0 * s) / norm, mask=mask)


@functools.cache
def _interpreted(kernel: object) -> object:
    """The kernel run by Triton's interpreter, for CPU tensors (tests without a GPU)."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(kernel.fn)


def supports(qkv: Tensor, cos: Tensor) -> bool:
    """True where the Triton kernels take this call: CUDA tensors of a dtype they handle."""
    return AVAILABLE and qkv.is_cuda and qkv.dtype in DTYPES and cos.dtype in DTYPES


def default_block_t(head_dim: int) -> int:
    """Tokens per program: a tile of about 2048 channel pairs (``BLOCK_T x BLOCK_J``), not yet tuned on a GPU."""
    return max(1, 2048 // (2 * triton.next_power_of_2(head_dim // 2)))


def _launch(src: Tensor, dst: Tensor, cos: Tensor, sin: Tensor, *, conj: bool, copy_v: bool,
            out: Tensor | None = None, block_t: int | None = None, num_warps: int = 4) -> tuple[Tensor, Tensor] | None:
    """Run the kernel over ``src``/``dst`` ``[B, N, 3 or 2, nh, D]``; with ``out``, return the table gradients.
    ``block_t`` and ``num_warps`` are for ``benchmarks/tune_rope_kernel.py``; the defaults are what the models run."""
    B, N, _, nh, D = src.shape
    half = D // 2
    table_shape = (B, nh, N, half)
    cos, sin = cos.expand(table_shape), sin.expand(table_shape)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    grads = None if out is None else tuple(torch.empty(table_shape, device=src.device, dtype=torch.float32)
                                           for _ in range(2))
    block_j = triton.next_power_of_2(half)
    block_t = block_t or default_block_t(D)
    kernel = _rotate_kernel if src.is_cuda else _interpreted(_rotate_kernel)
    grid = (triton.cdiv(B * N, block_t), nh)
    saved = out if out is not None else dst  # only read with TABLE_GRAD; any tensor of the same shape fills the slot
    kernel[grid](
        src, dst, saved, *(grads or (cos, sin)), cos, sin,
        N, nh, *src.stride()[:4], *dst.stride()[:4], *saved.stride()[:4], *cos.stride(), B * N,
        HALF=half, BLOCK_T=block_t, BLOCK_J=block_j, CONJ=conj, COPY_V=copy_v, TABLE_GRAD=out is not None,
        num_warps=num_warps,
    )
    return grads


def rotate_(qkv: Tensor, cos: Tensor, sin: Tensor) -> None:
    """Rotate q and k of ``qkv`` ``[B, N, 3, nh, D]`` in place (inference); ``qkv.stride(-1)`` must be 1."""
    _launch(qkv, qkv, cos, sin, conj=False, copy_v=False)


def rotated_backward(grad: Tensor, out: Tensor | None, cos: Tensor, sin: Tensor
                     ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Backward of ``rotate_``: the gradient of qkv, and of cos and sin given the forward output ``out``."""
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    grad_qkv = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    grads = _launch(grad, grad_qkv, cos, sin, conj=True, copy_v=True, out=out)
    if grads is None:
        return grad_qkv, None, None
    return grad_qkv, *(g.sum_to_size(cos.shape).to(cos.dtype) for g in grads)
