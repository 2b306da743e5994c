"""RoPE rotation of the queries and keys straight from the qkv projection's output, in one pass.

The reference ``vit_rope.rope.apply_rope`` (RoFormer, arXiv:2104.09864; RoPE-ViT, arXiv:2403.13298) rotates q and k
out of place in several elementwise passes, and autograd keeps extra copies for backward. In eager mode that is the
cost timm's RoPE ports pay (5-10% of a ViT-S step on CPU, a third on GPUs). Here each channel pair is one complex
number and its rotation one complex product, ``(x0 + i x1) * (cos + i sin)``, over the q and k slices of the
``[B, N, 3, nh, D]`` qkv tensor:

- without autograd (inference) the product is done in place: one pass over q and k, nothing allocated;
- with autograd it writes a new qkv tensor (rotated q, k and a copy of v) in one pass, and backward is one pass too.
  In-place rotation would cost more there: the projection output is a view, and autograd would clone the whole
  gradient around the in-place op. The new tensor replaces the projection output (which nothing keeps), and autograd
  saves only what attention keeps anyway, so training memory is the same as without RoPE; learnable (mixed) tables
  get their gradient from the rotated q and k, ``dt = conj(y) dy * t / |t|^2``, at table size after the batch sum;
- bf16/fp16 pairs are rotated in fp32 and rounded once; prefix tokens have identity rows in the tables, so nothing
  is sliced or concatenated;
- on CUDA, Triton kernels (``vit_rope.triton_rope``) do each pass in one launch; this PyTorch code is the fallback.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from . import triton_rope

BACKENDS = ("auto", "torch", "triton")


def _as_pairs(x: Tensor) -> Tensor:
    """Complex view of the interleaved pairs: ``[..., D] -> [..., D/2]`` complex, ``x0 + i x1``.

    A view (no copy) of any layout whose pairs are adjacent, such as the q/k slice of the qkv tensor; other layouts
    are copied first.
    """
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(stride % 2 for stride in x.stride()[:-1]):
        x = x.contiguous()
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _table(cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """``cos + i sin`` laid out for the qk slice: ``[(B,) H, P+N, D/2] -> [(B,) P+N, 1, H, D/2]`` complex."""
    real = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.complex(cos.to(real), sin.to(real)).transpose(-3, -2).unsqueeze(-3)


def _rotate(src: Tensor, table: Tensor, out: Tensor) -> None:
    """``out = src * table`` pair by pair (``out`` may be ``src``); bf16/fp16 go through fp32 and are rounded once.

    Shapes: ``src``, ``out`` ``[B, N, 2, nh, D]`` (any strides), ``table`` ``[(B,) N, 1, H, D/2]`` complex.
    """
    if src.dtype == table.real.dtype:
        torch.mul(_as_pairs(src), table, out=_as_pairs(out))
    else:
        out.copy_(torch.view_as_real(_as_pairs(src.to(table.real.dtype)) * table).flatten(-2))


def _rotated_qkv(qkv: Tensor, table: Tensor) -> Tensor:
    """A new contiguous ``[B, N, 3, nh, D]`` tensor: q and k of ``qkv`` rotated by ``table``, v copied."""
    out = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    out[:, :, 2] = qkv[:, :, 2]
    _rotate(qkv[:, :, :2], table, out[:, :, :2])
    return out


class _RotateQK(torch.autograd.Function):
    """Autograd of the rotation: ``y = t x`` per pair, so ``dx = conj(t) dy`` and ``dt = conj(x) dy``."""

    @staticmethod
    def forward(ctx: FunctionCtx, qkv: Tensor, cos: Tensor, sin: Tensor, use_triton: bool) -> Tensor:
        table = None if use_triton else _table(cos, sin, qkv.dtype)
        out = triton_rope.rotated(qkv, cos, sin) if use_triton else _rotated_qkv(qkv, table)
        ctx.use_triton = use_triton
        ctx.table_shape = None if use_triton else table.shape
        ctx.save_for_backward(out if cos.requires_grad or sin.requires_grad else None, cos, sin)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        out, cos, sin = ctx.saved_tensors
        if ctx.use_triton:
            return *triton_rope.rotated_backward(grad, out, cos, sin), None
        table = _table(cos, sin, grad.dtype)
        grad_qkv = _rotated_qkv(grad, table.conj())
        if out is None:
            return grad_qkv, None, None, None
        real = table.real.dtype
        grad_table = torch.view_as_real(_as_pairs(out[:, :, :2].to(real)).conj() * _as_pairs(grad[:, :, :2].to(real)))
        if len(ctx.table_shape) == 4:  # one table for the batch; one dim at a time is several times faster on CPU
            grad_table = grad_table.sum(0)  # [B, N, 2, nh, D/2, 2] -> [N, 2, nh, D/2, 2]
        grad_table = grad_table.sum(-4, keepdim=True).sum_to_size(*ctx.table_shape, 2)  # q and k (heads, if shared)
        grad_table = torch.view_as_complex(grad_table) * table / table.abs() ** 2  # x = y / t
        grad_table = grad_table.squeeze(-3).transpose(-3, -2)  # [(B,) H, P+N, D/2], as cos and sin
        return grad_qkv, grad_table.real.to(cos.dtype), grad_table.imag.to(sin.dtype), None


def rotate_qk(qkv: Tensor, cos: Tensor, sin: Tensor, backend: str = "auto") -> Tensor:
    """Rotate the queries and keys of a qkv projection output; the values pass through.

    Args:
        qkv: ``[B, N, 3, nh, D]``, ``qkv(x).reshape(B, N, 3, nh, D)``. Changed in place when autograd does not
            record (inference, ``no_grad``), so it must not be used afterwards.
        cos: ``[H, N, D/2]`` or ``[B, H, N, D/2]`` from ``rope_tables`` (``H`` = 1 or nh; prefix rows included).
        sin: same shape as ``cos``.
        backend: ``"auto"`` takes the Triton kernels for CUDA tensors (fp32/bf16/fp16, Triton installed) and PyTorch
            otherwise; ``"torch"`` or ``"triton"`` force one (``"triton"`` on CPU runs Triton's interpreter, for
            tests).

    Returns:
        ``[B, N, 3, nh, D]`` with q and k rotated: ``apply_rope`` on each (tests hold the values and every gradient
        of both backends to it).
    """
    if backend not in BACKENDS:
        raise ValueError(f"rotate_qk: backend={backend!r} is not one of {BACKENDS}")
    if backend == "triton" and not triton_rope.AVAILABLE:
        raise RuntimeError("rotate_qk: backend='triton' needs the triton package (pip install triton)")
    use_triton = backend == "triton" or (backend == "auto" and triton_rope.supports(qkv, cos))
    if torch.is_grad_enabled() and (qkv.requires_grad or cos.requires_grad or sin.requires_grad):
        return _RotateQK.apply(qkv, cos, sin, use_triton)
    if use_triton and qkv.stride(-1) == 1:
        triton_rope.rotate_(qkv, cos, sin)
    else:
        _rotate(qkv[:, :, :2], _table(cos, sin, qkv.dtype), qkv[:, :, :2])
    return qkv
