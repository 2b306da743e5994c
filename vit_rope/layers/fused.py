"""RoPE rotation of the queries and keys straight from the qkv projection's output, in one pass: each pair one complex
product over the q and k slices, in place without autograd, and in training inside one autograd node with the
projection, which saves only what attention keeps (docs/performance.md, "How the rotation is computed"). And
``capturing``: whether a forward runs under a graph capture, where these and the other eager fast paths (in-place
writes, Python caches) take the reference path."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable

from vit_rope.checks import check_choice
from vit_rope.layers import triton_rope
from vit_rope.layers.rotary import apply_rope

BACKENDS = ("auto", "torch", "triton")


def capturing(x: Tensor | None = None) -> bool:
    """Whether a forward runs under a graph capture (torch.compile / export, TorchScript tracing, FX symbolic tracing:
    ``x`` a ``torch.fx.Proxy``), where the eager fast paths (in-place writes, Python caches) take the reference path."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or isinstance(x, torch.fx.Proxy)


def _as_pairs(x: Tensor) -> Tensor:
    """Complex view ``x0 + i x1`` ``[..., D/2]`` of the pairs: no copy where they are adjacent (the qkv slice)."""
    if not pairs_adjacent(x):
        x = x.contiguous()
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _complex(cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """``cos + i sin`` ``[(B,) H, P+N, D/2]`` complex, fp32 (fp64 for fp64 ``dtype``)."""
    real = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.complex(cos.to(real), sin.to(real))


def _table(cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """``cos + i sin`` laid out for the qk slice: ``[(B,) H, P+N, D/2] -> [(B,) P+N, 1, H, D/2]`` complex."""
    return _complex(cos, sin, dtype).transpose(-3, -2).unsqueeze(-3)


def pairs_adjacent(x: Tensor) -> bool:
    """Whether ``x``'s channel pairs view as complex numbers without a copy, so a rotation can write into ``x``."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(stride % 2 == 0 for stride in x.stride()[:-1])


def _rotate(src: Tensor, table: Tensor, out: Tensor) -> None:
    """``out = src * table`` per pair (``out`` may be ``src``; bf16/fp16 via fp32)."""
    if src.dtype == table.real.dtype:
        torch.mul(_as_pairs(src), table, out=_as_pairs(out))
    else:
        out.copy_(torch.view_as_real(_as_pairs(src.to(table.real.dtype)) * table).flatten(-2))


def _rotation_grads(grad: Tensor, out: Tensor | None, cos: Tensor, sin: Tensor, use_triton: bool
                    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Backward of ``y = t x`` per pair: ``dx = conj(t) dy``; given the output ``out``, ``dt = conj(x) dy`` too."""
    if use_triton:
        return triton_rope.rotated_backward(grad, out, cos, sin)
    table = _table(cos, sin, grad.dtype)
    grad_qkv = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)  # contiguous: q and k turned back, v
    grad_qkv[:, :, 2] = grad[:, :, 2]
    _rotate(grad[:, :, :2], table.conj(), grad_qkv[:, :, :2])
    if out is None:
        return grad_qkv, None, None
    real = table.real.dtype
    y, g = _as_pairs(out[:, :, :2].to(real)), _as_pairs(grad[:, :, :2].to(real))  # [B, N, 2, nh, D/2] complex
    grad_table = y[:, :, :1].conj() * g[:, :, :1] + y[:, :, 1:].conj() * g[:, :, 1:]  # q's + k's: [B, N, 1, nh, D/2]
    if table.dim() == 4:  # one table for the batch; one dim at a time is several times faster on CPU
        grad_table = grad_table.sum(0)  # [N, 1, nh, D/2]
    grad_table = grad_table.sum_to_size(table.shape) / table.conj()  # heads, if shared; x = y / t: t / |t|^2 = 1 / t*
    grad_table = grad_table.squeeze(-3).transpose(-3, -2)  # [(B,) H, P+N, D/2], as cos and sin
    return grad_qkv, grad_table.real.to(cos.dtype), grad_table.imag.to(sin.dtype)


def _rotate_in_place(qkv: Tensor, cos: Tensor, sin: Tensor, use_triton: bool) -> None:
    if use_triton and qkv.stride(-1) == 1:
        triton_rope.rotate_(qkv, cos, sin)
    else:
        _rotate(qkv[:, :, :2], _table(cos, sin, qkv.dtype), qkv[:, :, :2])


class _ProjectRotateQK(torch.autograd.Function):
    """``rotate(x W^T + b)`` as one autograd node: its output is its own, so it rotates in place (outside, autograd
    would clone the gradient around an in-place op on the Linear's view); backward turns the gradient back in a copy.
    Under autocast, x, W and b are cast and saved as for a Linear."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None, cos: Tensor, sin: Tensor,
                num_heads: int, use_triton: bool) -> Tensor:
        device = x.device.type
        autocast = torch.amp.is_autocast_available(device)  # not on every device: "meta" (shape checks) has none
        if autocast and torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        with torch.autocast(device, enabled=False) if autocast else nullcontext():
            qkv = F.linear(x, weight, bias).unflatten(-1, (3, num_heads, -1))  # [B, N, 3, nh, D]
        _rotate_in_place(qkv, cos, sin, use_triton)
        ctx.use_triton, ctx.has_bias = use_triton, bias is not None
        ctx.save_for_backward(x, weight, qkv if cos.requires_grad or sin.requires_grad else None, cos, sin)
        return qkv

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, out, cos, sin = ctx.saved_tensors
        grad_qkv, grad_cos, grad_sin = _rotation_grads(grad, out, cos, sin, ctx.use_triton)
        grad_qkv = grad_qkv.flatten(-3)  # [B, N, 3 * nh * D], the projection's layout
        grad_x = grad_qkv @ weight if ctx.needs_input_grad[0] else None
        flat = grad_qkv.flatten(0, -2)  # [B * N, 3C]
        grad_weight = flat.t() @ x.flatten(0, -2) if ctx.needs_input_grad[1] else None
        grad_bias = flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, grad_cos, grad_sin, None, None


def rotate_qk(qkv: Tensor, cos: Tensor, sin: Tensor, backend: str = "auto") -> Tensor:
    """Rotate q and k of ``qkv`` ``[B, N, 3, nh, D]``: in place without autograd (do not use it after)."""
    use_triton = _use_triton(qkv, cos, backend)
    if torch.is_grad_enabled() and (qkv.requires_grad or cos.requires_grad or sin.requires_grad):
        q, k, v = qkv.unbind(2)  # [B, N, nh, D] each
        heads = (cos.transpose(-3, -2), sin.transpose(-3, -2))  # [(B,) N, H, D/2]: the tables against [B, N, nh, D]
        return torch.stack((apply_rope(q, *heads), apply_rope(k, *heads), v), 2)
    _rotate_in_place(qkv, cos, sin, use_triton)
    return qkv


def rotate_heads_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate ``q``, ``k`` in place (inference, q/k norms' outputs): one complex product per pair."""
    for name, x in (("q", q), ("k", k)):
        if not pairs_adjacent(x):
            raise ValueError(f"rotate_heads_: {name} of shape {tuple(x.shape)} and strides {x.stride()} does not hold "
                             "its channel pairs adjacent; rotate a contiguous tensor, or use apply_rope.")
    table = _complex(cos, sin, q.dtype)  # built once for q and k
    _rotate(q, table, q)
    _rotate(k, table, k)
    return q, k


def plain_linear(linear: nn.Module) -> bool:
    """Whether ``linear`` is a plain ``nn.Linear`` that no hook (its own or global) watches: its weights then say all it
    computes, so a fused form changes nothing a user sees (unlike for a LoRA-style wrapper)."""
    module = torch.nn.modules.module
    every = (module._global_forward_hooks, module._global_forward_pre_hooks, module._global_backward_hooks,
             module._global_backward_pre_hooks)
    own = (linear._forward_hooks, linear._forward_pre_hooks, linear._backward_hooks, linear._backward_pre_hooks)
    return type(linear) is nn.Linear and not any((*own, *every))


def project_rotate_qk(linear: nn.Module, x: Tensor, num_heads: int, cos: Tensor, sin: Tensor,
                      backend: str = "auto", weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """``rotate_qk(linear(x).unflatten(-1, (3, num_heads, -1)), cos, sin)``, with autograd one node that rotates in
    place; ``weight`` and ``bias`` stand in for ``linear``'s (Cayley-STRING's fold)."""
    if weight is None:
        if not plain_linear(linear):
            return rotate_qk(linear(x).unflatten(-1, (3, num_heads, -1)), cos, sin, backend)
        weight, bias = linear.weight, linear.bias
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or cos.requires_grad or sin.requires_grad):
        return _ProjectRotateQK.apply(x, weight, bias, cos, sin, num_heads, _use_triton(x, cos, backend))
    return rotate_qk(F.linear(x, weight, bias).unflatten(-1, (3, num_heads, -1)), cos, sin, backend)


def rotated_projection(x: Tensor, linear: nn.Module, num_heads: int, tables: tuple[Tensor, Tensor],
                       weight: Tensor | None = None, bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of ``linear(x)``, q and k rotated: the reference under a graph capture, else fused."""
    if capturing(x):
        return reference_projection(x, linear, num_heads, tables, weight, bias)
    qkv = project_rotate_qk(linear, x, num_heads, tables[0], tables[1], weight=weight, bias=bias)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, N, 3, nh, D] -> [B, nh, N, D] each


def reference_projection(x: Tensor, linear: nn.Module, num_heads: int, tables: tuple[Tensor, Tensor],
                         weight: Tensor | None = None, bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``rotated_projection`` by ``apply_rope`` in plain ops (graph captures, throughput's ``@reference``)."""
    qkv = linear(x) if weight is None else F.linear(x, weight, bias)
    q, k, v = qkv.unflatten(-1, (3, num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, N, D] each
    return apply_rope(q, tables[0], tables[1]), apply_rope(k, tables[0], tables[1]), v


def rotate_normed(q: Tensor, k: Tensor, tables: tuple[Tensor, Tensor], own: bool) -> tuple[Tensor, Tensor]:
    """q and k after the q/k norms, rotated in place in eager inference when they are the caller's ``own``."""
    if own and not torch.is_grad_enabled() and not capturing(q) and pairs_adjacent(q) and pairs_adjacent(k):
        return rotate_heads_(q, k, tables[0], tables[1])
    return apply_rope(q, tables[0], tables[1]), apply_rope(k, tables[0], tables[1])


def _use_triton(x: Tensor, cos: Tensor, backend: str) -> bool:
    check_choice(backend, BACKENDS, "rotate_qk backend")
    if backend == "triton" and not triton_rope.AVAILABLE:
        raise RuntimeError("rotate_qk: backend='triton' needs the triton package (pip install triton)")
    return backend == "triton" or (backend == "auto" and triton_rope.supports(x, cos))


def fold_qk(basis: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The qkv projection giving ``P q`` and ``P k`` (v unchanged) for a ``basis`` ``[nh, D, D]`` per head."""
    nh, d = basis.shape[0], basis.shape[-1]
    rows = weight.unflatten(0, (3, nh, d))  # [3, nh, D, C]
    p = basis.to(weight.dtype)
    qk = torch.einsum("hde,theC->thdC", p, rows[:2])  # [2, nh, D, C]
    folded = torch.cat((qk, rows[2:]), 0).flatten(0, 2)
    if bias is None:
        return folded, None
    b = bias.unflatten(0, (3, nh, d))  # [3, nh, D]
    bqk = torch.einsum("hde,the->thd", p.to(bias.dtype), b[:2])
    return folded, torch.cat((bqk, b[2:]), 0).flatten()


# FX: recorded as a call, whose shapes the trace cannot read
torch.fx.wrap("fold_qk")
