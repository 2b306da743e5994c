"""The matrix exponential of the small ``b x b`` blocks that ComRoPE and LieRE turn q and k by.

- Eager (``MatrixExp``): scaling, a Taylor polynomial and squaring in ``b x b`` products (``squaring_chain``), whose
  Taylor terms and squares the backward keeps. The gradient of ``exp`` at ``A`` is the adjoint Fréchet derivative
  ``L(A^T, G) = L(A, G^T)^T`` (Al-Mohy and Higham, "Computing the Fréchet Derivative of the Matrix Exponential", SIAM
  J. Matrix Anal. Appl. 2009), the upper right block of ``exp([[A, G^T], [0, A]])`` transposed: torch's
  ``matrix_exp`` exponentiates that ``2b x 2b`` matrix from scratch; ``frechet`` runs the same scaling, series and
  squaring on the ``b x b`` blocks with ``A``'s powers and squares already at hand, two products per term and per
  squaring, for LieRE's one exponential per token and head. The cost: ``s + 2`` matrices kept per exponential
  (``s`` squarings).
- Graph captures (torch.compile, export, ONNX, FX): scaling and squaring with a Taylor polynomial written in matmuls
  (``expm_by_squaring``; every ONNX runtime has them, ``matrix_exp`` has no ONNX op), the squarings counted from the
  norm and masked, so that one graph serves every position range.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vit_rope.layers.capture import capturing

TAYLOR_ORDER = 12  # after scaling to a norm <= 1/2: remainder below 0.5**13 / 13! ~ 1e-14
MAX_SQUARINGS = 16  # norms up to 2**15: far past any position range times generator a model meets


def expm(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` matrices, in fp32 at least, equal to ``torch.linalg.matrix_exp`` to 1e-6:
    ``MatrixExp`` in eager, ``expm_by_squaring`` (matmuls only, no host sync) under a graph capture."""
    dtype = skew.dtype
    if dtype not in (torch.float32, torch.float64):
        skew = skew.float()
    if not capturing(skew):
        return MatrixExp.apply(skew.contiguous()).to(dtype)
    return expm_by_squaring(skew).to(dtype)


def expm_by_squaring(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` by scaling, a Taylor polynomial and squaring: matmuls and ``where`` only, so that
    ONNX exports it; the squarings follow each matrix's norm, masked past its own count."""
    return squaring_chain(skew, TAYLOR_ORDER, MAX_SQUARINGS)[2][-1]


def squaring_chain(a: Tensor, order: int, steps: int | None = None) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """The scaling and squaring of ``exp(A)``, ``A`` ``[..., b, b]``, with what the Fréchet derivative reuses: each
    matrix's squarings ``s`` ``[...]`` (so that ``|A / 2^s| <= 1/2``), the Taylor terms ``(A / 2^s)^k / k!`` for ``k =
    1..order`` and the chain ``exp(A / 2^s)^(2^j)`` for ``j = 0..steps``, each matrix held at its own ``s`` (its last
    entry is ``exp(A)``). ``steps`` fixed for a graph capture, else the batch's largest ``s`` (a host sync)."""
    norm = a.detach().abs().sum(-1).amax(-1)  # [...] the infinity norm bounds the spectral one
    squarings = torch.ceil(torch.log2(norm.clamp_min(1e-30) * 2)).clamp(0, MAX_SQUARINGS)
    terms = taylor_terms(a / torch.exp2(squarings)[..., None, None], order)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    chain = [eye + sum(terms)]
    for step in range(int(squarings.max()) if steps is None and a.numel() else steps or 0):
        chain.append(torch.where((step < squarings)[..., None, None], chain[-1] @ chain[-1], chain[-1]))
    return squarings, terms, chain


def taylor_terms(scaled: Tensor, order: int) -> list[Tensor]:
    """The Taylor terms ``X^k / k!`` of ``exp(X)`` for ``k = 1..order``, ``X`` ``[..., b, b]``."""
    terms = [scaled]
    for k in range(2, order + 1):
        terms.append(terms[-1] @ scaled / k)
    return terms


def frechet(a: Tensor, e: Tensor, powers: tuple[Tensor, list[Tensor], list[Tensor]] | None = None) -> Tensor:
    """The Fréchet derivative ``L(A, E)`` of ``exp`` at ``a`` in the direction ``e``, both ``[..., b, b]``: the upper
    right block of ``exp([[A, E], [0, A]])``, by the scaling and squaring of that block matrix written in ``b x b``
    products, two per term and squaring, on ``powers``: ``squaring_chain(a)``'s squarings, Taylor terms but the last
    and chain (computed here when not given)."""
    if powers is None:
        squarings, terms, chain = squaring_chain(a, frechet_order(a.dtype))
        powers = squarings, terms[:-1], chain
    squarings, terms, chain = powers
    e = e / torch.exp2(squarings)[..., None, None]
    derivative = e  # the k-th term's derivative: sum_i A^i E A^(k-1-i) / k!, with A and E scaled
    total = derivative
    for k, term in enumerate(terms, start=2):  # term: A^(k-1) / (k-1)!, up to the order's
        derivative = (derivative @ terms[0] + term @ e) / k
        total = total + derivative
    for step, power in enumerate(chain[:-1]):  # exp(2X) = exp(X)^2, L(2X, 2E) = exp(X) L(X, E) + L(X, E) exp(X)
        total = torch.where((step < squarings)[..., None, None], power @ total + total @ power, total)
    return total


def frechet_order(dtype: torch.dtype) -> int:
    """Taylor terms after scaling to a norm <= 1/2: below fp32 (8) or fp64 (14) rounding."""
    return 8 if dtype == torch.float32 else 14


class MatrixExp(torch.autograd.Function):
    """``exp(A)`` by ``squaring_chain``, whose backward ``L(A^T, G) = L(A, G^T)^T`` reuses its squares and recomputes
    its Taylor terms (``order - 2`` products; keeping them too would cost ``order`` more matrices per exponential for
    about a tenth of the backward's time)."""

    @staticmethod
    def forward(ctx, skew: Tensor) -> Tensor:
        squarings, terms, chain = squaring_chain(skew, frechet_order(skew.dtype))
        ctx.save_for_backward(squarings, terms[0], *chain)
        return chain[-1]

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        squarings, scaled, *chain = ctx.saved_tensors
        terms = taylor_terms(scaled, frechet_order(scaled.dtype) - 1)  # frechet takes all but the last
        return frechet(scaled, grad.mT.contiguous(), (squarings, terms, chain)).mT  # L(A^T, G) = L(A, G^T)^T
