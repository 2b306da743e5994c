"""One rotation table that every block turns q and k by (LieRE's: one set of generators for all blocks), with its
gradient taken once for all of them.

Autograd would give the table a gradient per block, ``G_l^T X_l`` for each token and channel block (``X_l`` the
``R`` rows a block turns, q's and k's samples, ``G_l`` their gradient), each a batched product with an inner size of
``R`` whose cost is its number of tiny matrices rather than its arithmetic, and then sum them. ``share`` marks the
table instead: each block's ``RotateShared`` leaves ``(X_l, G_l)`` on the table's ``SharedTable`` node, which, run by
autograd after all of them, takes ``sum_l G_l^T X_l`` as one product with an inner size of ``L * R``; the rows stay
where ``torch.stack`` put them (``[R, T, b]``), so that joining the blocks' rows copies whole blocks of memory. Any
other use of the table reaches that node as an ordinary gradient and is added to it (docs/performance.md measures
what it saves).

Recognised by the table's ``grad_fn`` (``shared_node``), so nothing changes in what the blocks are given; graph
captures (compile, export), evaluation and frozen tables are never marked.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from vit_rope.layers.capture import capturing


class SharedTable(torch.autograd.Function):
    """The identity on a table ``[..., b, b]``; its backward is the gradient of every ``RotateShared`` by it, in one
    product over their rows, plus the ordinary gradient of its other uses."""

    @staticmethod
    def forward(ctx: FunctionCtx, table: Tensor) -> Tensor:
        ctx.rows = []  # (X_l, G_l) of each block, [T, R, b] views of [R, T, b], left by RotateShared's backward
        ctx.shape, ctx.dtype = table.shape, table.dtype
        ctx.set_materialize_grads(False)
        return table.view_as(table)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor | None) -> Tensor | None:
        if ctx.rows:
            # [T, L * R, b]: joined along their outer dimension, whole blocks of T * b at a time
            rows, grads = (torch.cat([part.transpose(0, 1) for part in parts]).transpose(0, 1)
                           for parts in zip(*ctx.rows, strict=True))
            ctx.rows.clear()  # a second backward (retain_graph) leaves its own
            total = (grads.mT @ rows).to(ctx.dtype).view(ctx.shape)
            grad = total if grad is None else grad + total
        return grad


def share(table: Tensor) -> Tensor:
    """``table`` marked for ``rotate_shared`` where eager autograd records it; else as it is."""
    if capturing(table) or not (torch.is_grad_enabled() and table.requires_grad):
        return table
    return SharedTable.apply(table)


class RotateShared(torch.autograd.Function):
    """``rows @ R^T`` for ``rows`` ``[T, R, b]`` (a view of ``[R, T, b]``) and the table's ``T`` matrices, computed as
    ``(R rows^T)^T`` (operands as they are laid out); its backward gives the rows' gradient and leaves ``(rows,
    gradient)`` to the table's ``SharedTable`` node."""

    @staticmethod
    def forward(ctx: FunctionCtx, rows: Tensor, table: Tensor, node: object) -> Tensor:
        ctx.save_for_backward(rows, table)
        ctx.node = node
        return (table.reshape(rows.shape[0], *table.shape[-2:]).to(rows.dtype) @ rows.mT).mT

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, None, None]:
        rows, table = ctx.saved_tensors
        ctx.node.rows.append((rows, grad))
        return (table.reshape(rows.shape[0], *table.shape[-2:]).mT.to(grad.dtype) @ grad.mT).mT, None, None


def shared_node(table: Tensor) -> object | None:
    """The ``SharedTable`` node of a table from ``share`` while autograd records; else ``None``."""
    node = table.grad_fn
    return node if isinstance(node, SharedTable._backward_cls) and torch.is_grad_enabled() else None


def rotate_shared(q: Tensor, k: Tensor, table: Tensor, node: object) -> tuple[Tensor, Tensor]:
    """q and k ``[B, H, N, D]`` turned by ``table`` ``[1, H or 1, N, D/b, b, b]`` from ``share``: its ``T`` matrices
    each turn the ``R`` rows (q's and k's samples, and heads where they share the table) that ``torch.stack`` lays
    out as ``[R, T, b]``, so that the backward can join every block's rows without reordering them."""
    B, H, N, D = q.shape
    b = table.shape[-1]
    rows = torch.stack((q, k)).view(-1, math.prod(table.shape[1:-2]), b).transpose(0, 1)  # [T, R, b]
    turned = RotateShared.apply(rows, table, node)
    q, k = turned.transpose(0, 1).contiguous().view(2, B, H, N, D).unbind(0)  # flash layout
    return q, k
