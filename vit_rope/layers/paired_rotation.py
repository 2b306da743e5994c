"""q and k turned by one ``b x b`` matrix per token, head and channel block, from a projection that writes each block
of q beside the same block of k.

ComRoPE's and LieRE's rotations (``vit_rope.encodings.generators.block_rotation``) are batched products over (token,
head, block) with the batch's samples as rows: ``Y_t = X_t R_t^T``. From timm's projection, whose output is ``[B, N, 3,
nh, D]``, neither q nor k is such a batch of matrices: its tokens lie ``3 D nh`` apart and its heads and blocks ``b``
apart, so every product is preceded and followed by reorderings (and so is its backward, twice as many). Written by a
projection whose q and k rows alternate block by block (``[B, N, nh, D/b, 2, b]``: rows permuted, nothing else
changes), q's blocks are ``[T, B, b]`` views with one stride per dimension, which BLAS reads as they are: one product
for q and one for k, then one copy into the attention's ``[B, N, nh, D]`` layout; and in the backward, one product
per gradient and per table and one copy into the projection's gradient. The table comes token-major, ``[N, nh, D/b,
b, b]``, the order of those views.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable


def paired_projection(attn: nn.Module, x: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """``attn``'s qkv projection of ``x`` ``[B, N, C]`` as q and k with their blocks of ``block`` channels
    alternating, ``[B, N, nh, D/b, 2, b]``, and v ``[B, nh, N, D]``: the same values, its rows reordered."""
    nh, D = attn.num_heads, attn.head_dim
    width = nh * D
    rows = (nh, D // block, block)

    def pair(t: Tensor) -> Tensor:  # [2 * nh * D, ...] -> q's and k's rows alternating per block
        return t.unflatten(0, (2, *rows)).movedim(0, 2).flatten(0, 3)

    weight_qk, weight_v = attn.qkv.weight.split((2 * width, width))
    bias_qk, bias_v = (None, None) if attn.qkv.bias is None else attn.qkv.bias.split((2 * width, width))
    qk = F.linear(x, pair(weight_qk), None if bias_qk is None else pair(bias_qk))
    v = F.linear(x, weight_v, bias_v).unflatten(-1, (nh, D)).transpose(1, 2)  # [B, nh, N, D]
    return qk.unflatten(-1, (*rows[:2], 2, block)), v


class RotatePaired(torch.autograd.Function):
    """q and k ``[B, nh, N, D]`` (views of ``[B, N, nh, D]``) of ``qk`` ``[B, N, nh, m, 2, b]`` turned by ``table``
    ``[N, nh, m, b, b]``."""

    @staticmethod
    def forward(ctx: FunctionCtx, qk: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
        B, N, H, m, _, b = qk.shape
        rows = qk.view(B, N * H * m, 2, b)
        matrices = table.reshape(N * H * m, b, b).to(qk.dtype)
        ctx.save_for_backward(qk, matrices)
        ctx.table_shape, ctx.table_dtype = table.shape, table.dtype
        turned = []
        for part in (0, 1):
            out = torch.bmm(rows[:, :, part].transpose(0, 1), matrices.mT)  # [T, B, b], T = (N, nh, m)
            out = out.view(N, H, m, B, b).permute(3, 0, 1, 2, 4).reshape(B, N, H, m * b)  # [B, N, nh, D]
            turned.append(out.transpose(1, 2))
        return turned[0], turned[1]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_q: Tensor, grad_k: Tensor) -> tuple[Tensor, Tensor]:
        qk, matrices = ctx.saved_tensors
        B, N, H, m, _, b = qk.shape
        rows = qk.view(B, N * H * m, 2, b)
        grad_qk = torch.empty_like(qk)
        grad_rows = grad_qk.view(B, N * H * m, 2, b)
        grad_table = None
        for part, grad in enumerate((grad_q, grad_k)):
            grad = grad.transpose(1, 2).reshape(B, N * H * m, b).transpose(0, 1)  # [T, B, b]
            grad_rows[:, :, part] = torch.bmm(grad, matrices).transpose(0, 1)
            product = torch.bmm(grad.mT, rows[:, :, part].transpose(0, 1))  # [T, b, b]
            grad_table = product if grad_table is None else grad_table.add_(product)
        return grad_qk, grad_table.view(ctx.table_shape).to(ctx.table_dtype)


def project_rotate_paired(attn: nn.Module, x: Tensor, table: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v ``[B, nh, N, D]`` of ``attn`` for the tokens ``x`` ``[B, N, C]``, q and k turned by ``table``
    ``[N, nh, D/b, b, b]`` (every token's blocks, shared by the batch)."""
    qk, v = paired_projection(attn, x, table.shape[-1])
    q, k = RotatePaired.apply(qk, table)
    return q, k, v
