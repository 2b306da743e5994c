"""The matrix exponential of the small ``b x b`` blocks that ComRoPE and LieRE turn q and k by.

- Eager: ``torch.linalg.matrix_exp`` forward, and a backward of our own (``MatrixExp``). The gradient of ``exp`` at
  ``A`` is the adjoint Fréchet derivative ``L(A^T, G)`` (Al-Mohy and Higham, "Computing the Fréchet Derivative of the
  Matrix Exponential", SIAM J. Matrix Anal. Appl. 2009), the upper right block of ``exp([[A^T, G], [0, A^T]])``.
  torch exponentiates that ``2b x 2b`` matrix; here the same scaling, Taylor series and squaring run on the ``b x b``
  blocks (``frechet``): three ``b x b`` products per term and squaring where one ``2b x 2b`` product costs eight, and
  no block matrix to assemble, for LieRE's one exponential per token, head and block.
- Graph captures (torch.compile, export, ONNX, FX): scaling and squaring with a Taylor polynomial written in matmuls
  (``expm_by_squaring``; every ONNX runtime has them, ``matrix_exp`` has no ONNX op), the squarings counted from the
  norm and masked, so that one graph serves every position range.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vit_rope.layers.capture import capturing

TAYLOR_ORDER = 12  # after scaling to a norm <= 1/2: remainder below 0.5**13 / 13! ~ 1e-14
MAX_SQUARINGS = 16  # norms up to 2**15: far past any position range times generator a model meets


def expm(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` matrices, in fp32 at least: ``torch.linalg.matrix_exp`` with ``frechet`` as its
    backward in eager, scaling and squaring of a Taylor polynomial (matmuls only) under a graph capture, equal to
    1e-6."""
    dtype = skew.dtype
    if dtype not in (torch.float32, torch.float64):
        skew = skew.float()
    if not capturing(skew):
        return MatrixExp.apply(skew.contiguous()).to(dtype)
    return expm_by_squaring(skew).to(dtype)


def expm_by_squaring(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` by scaling, a Taylor polynomial and squaring: matmuls and ``where`` only, so that
    ONNX exports it; the squarings follow each matrix's norm, masked past its own count."""
    norm = skew.abs().sum(-1).amax(-1)  # [...] the infinity norm bounds the spectral one
    squarings = torch.ceil(torch.log2(norm.clamp_min(1e-30) * 2)).clamp(0, MAX_SQUARINGS)  # [...] so |S / 2^s| <= 1/2
    scaled = skew / torch.exp2(squarings)[..., None, None]
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device).expand_as(skew)
    out, term = eye, eye
    for k in range(1, TAYLOR_ORDER + 1):
        term = term @ scaled / k
        out = out + term
    for step in range(MAX_SQUARINGS):
        out = torch.where((step < squarings)[..., None, None], out @ out, out)
    return out


def frechet(a: Tensor, e: Tensor) -> Tensor:
    """The Fréchet derivative ``L(A, E)`` of ``exp`` at ``a`` in the direction ``e``, both ``[..., b, b]``: the upper
    right block of ``exp([[A, E], [0, A]])``, by the scaling and squaring of that block matrix written in ``b x b``
    products. One scaling for the whole batch, from its largest norm (a host sync): the Taylor terms then stay below
    fp32 (order 8) or fp64 (order 14) rounding."""
    norm = a.detach().abs().sum(-1).amax(-1).max().item() if a.numel() else 0.0
    squarings = min(max(0, math.ceil(math.log2(max(norm, 1e-30) * 2))), MAX_SQUARINGS)
    a, e = a / 2**squarings, e / 2**squarings
    term = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)  # A^k / k!
    derivative = torch.zeros_like(a)  # the k-th term's derivative: sum_i A^i E A^(k-1-i) / k!
    total, total_derivative = term, derivative
    stacked = torch.cat((a, e), -2)  # [..., 2b, b]: [D_(k-1), T_(k-1)] @ [A; E] = D_(k-1) A + T_(k-1) E
    for k in range(1, (8 if a.dtype == torch.float32 else 14) + 1):
        derivative = torch.cat((derivative, term), -1) @ stacked / k
        term = term @ a / k
        total, total_derivative = total + term, total_derivative + derivative
    for _ in range(squarings):  # exp(2X) = exp(X)^2, L(2X, 2E) = exp(X) L(X, E) + L(X, E) exp(X)
        total, total_derivative = total @ total, total @ total_derivative + total_derivative @ total
    return total_derivative


class MatrixExp(torch.autograd.Function):
    """``torch.linalg.matrix_exp`` whose backward is ``frechet(A^T, G)`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, skew: Tensor) -> Tensor:
        ctx.save_for_backward(skew)
        return torch.linalg.matrix_exp(skew)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (skew,) = ctx.saved_tensors
        return frechet(skew.mT, grad)
