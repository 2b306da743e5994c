"""The matrix exponential of the small ``b x b`` blocks that ComRoPE and LieRE turn q and k by.

- Eager (``MatrixExp``): scaling, a Taylor polynomial and squaring in ``b x b`` products, each matrix squared as
  many times as its own norm needs. The batch is sorted by that count (``Chain``), so that each squaring multiplies
  only the matrices that still need it, a suffix of the batch: at LieRE's 448 px grid most matrices need 6 or 7
  squarings and one in tens of thousands 8, which a squaring of the whole batch per step would give all of them.
  The gradient of ``exp`` at ``A`` is the adjoint Fréchet derivative ``L(A^T, G) = L(A, G^T)^T`` (Al-Mohy and Higham,
  "Computing the Fréchet Derivative of the Matrix Exponential", SIAM J. Matrix Anal. Appl. 2009), the upper right
  block of ``exp([[A, G^T], [0, A]])`` transposed: torch's ``matrix_exp`` exponentiates that ``2b x 2b`` matrix from
  scratch; ``frechet`` runs the same scaling, series and squaring on the ``b x b`` blocks with ``A``'s powers and
  squares already at hand, two products per term and per squaring, for LieRE's one exponential per token and head.
  The cost: the squares kept, ``s + 2`` matrices per exponential (``s`` squarings).
- Graph captures (torch.compile, export, ONNX, FX): scaling and squaring with a Taylor polynomial written in matmuls
  (``expm_by_squaring``; every ONNX runtime has them, ``matrix_exp`` has no ONNX op), the squarings counted from the
  norm and masked, so that one graph serves every position range.
"""

from __future__ import annotations

from typing import NamedTuple

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
    count = squarings(skew)
    terms = taylor_terms(skew / torch.exp2(count)[..., None, None], TAYLOR_ORDER)
    power = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device) + sum(terms)
    for step in range(MAX_SQUARINGS):
        power = torch.where((step < count)[..., None, None], power @ power, power)
    return power


def squarings(a: Tensor) -> Tensor:
    """The squarings ``s`` ``[...]`` of each matrix of ``a`` ``[..., b, b]`` after which ``|A / 2^s| <= 1/2``."""
    norm = a.detach().abs().sum(-1).amax(-1)  # the infinity norm bounds the spectral one
    return torch.ceil(torch.log2(norm.clamp_min(1e-30) * 2)).clamp(0, MAX_SQUARINGS)


def taylor_terms(scaled: Tensor, order: int) -> list[Tensor]:
    """The Taylor terms ``X^k / k!`` of ``exp(X)`` for ``k = 1..order``, ``X`` ``[..., b, b]``."""
    terms = [scaled]
    for k in range(2, order + 1):
        terms.append(terms[-1] @ scaled / k)
    return terms


class Chain(NamedTuple):
    """The scaling and squaring of ``exp(A)`` for a batch ``[n, b, b]`` sorted by squarings (what the Fréchet
    derivative reuses). Matrix ``i`` of the sorted batch is squared ``s_i`` times; ``bounds[j]:`` are those squared
    more than ``j - 1`` times, so ``powers[j]`` ``[n - bounds[j], b, b]``, ``exp(A / 2^s)^(2^j)`` of them, is
    ``powers[j - 1]``'s rows from ``bounds[j] - bounds[j - 1]`` on, squared; its first ``bounds[j + 1] - bounds[j]``
    rows are ``exp(A)`` of the matrices squared ``j`` times."""

    perm: Tensor  # [n]: the batch's matrices in sorted order
    count: Tensor  # [n]: their squarings, ascending
    bounds: list[int]  # [0, first index of s > 0, ..., of s > s_max - 1, n]
    scaled: Tensor  # [n, b, b]: A / 2^s, sorted
    powers: list[Tensor]


def chain(a: Tensor, order: int) -> tuple[Chain, list[Tensor]]:
    """``Chain`` of ``a`` ``[..., b, b]`` and its Taylor terms (``order`` of them); a host sync for the counts."""
    flat = a.reshape(-1, *a.shape[-2:])
    count, perm = torch.sort(squarings(flat))
    steps = int(count[-1]) if count.numel() else 0
    bounds = [0, *torch.searchsorted(count, torch.arange(steps, device=count.device, dtype=count.dtype),
                                     right=True).tolist(), flat.shape[0]]
    scaled = flat[perm] / torch.exp2(count)[:, None, None]
    terms = taylor_terms(scaled, order)
    powers = [torch.eye(a.shape[-1], dtype=a.dtype, device=a.device) + sum(terms)]
    for step in range(steps):
        power = powers[-1][bounds[step + 1] - bounds[step]:]
        powers.append(power @ power)
    return Chain(perm, count, bounds, scaled, powers), terms


def finished(rows: list[Tensor], bounds: list[int], perm: Tensor, shape: torch.Size) -> Tensor:
    """The matrices of the squaring levels ``rows`` (``Chain.powers``' layout) whose squarings end there, put back in
    the batch's order, ``[*shape]``."""
    done = torch.cat([level[: bounds[j + 1] - bounds[j]] for j, level in enumerate(rows)])
    return torch.empty_like(done).index_copy_(0, perm, done).view(shape)


def frechet(a: Tensor | None, e: Tensor, powers: tuple[Chain, list[Tensor]] | None = None) -> Tensor:
    """The Fréchet derivative ``L(A, E)`` of ``exp`` at ``a`` in the direction ``e``, both ``[..., b, b]``: the upper
    right block of ``exp([[A, E], [0, A]])``, by the scaling and squaring of that block matrix written in ``b x b``
    products, two per term and squaring, on ``powers``: ``chain(a)``'s ``Chain`` and Taylor terms but the last
    (computed here from ``a`` when not given)."""
    if powers is None:
        steps, terms = chain(a, frechet_order(a.dtype))
        powers = steps, terms[:-1]
    steps, terms = powers
    shape = e.shape
    e = e.reshape(-1, *e.shape[-2:])[steps.perm] / torch.exp2(steps.count)[:, None, None]
    derivative = e  # the k-th term's derivative: sum_i A^i E A^(k-1-i) / k!, with A and E scaled
    total = derivative
    for k, term in enumerate(terms, start=2):  # term: A^(k-1) / (k-1)!, up to the order's
        derivative = (derivative @ terms[0] + term @ e) / k
        total = total + derivative
    levels = [total]
    for step, power in enumerate(steps.powers[:-1]):  # exp(2X) = exp(X)^2, L(2X, 2E) = exp(X) L(X, E) + L(X, E) exp(X)
        done = steps.bounds[step + 1] - steps.bounds[step]
        power, total = power[done:], levels[-1][done:]
        levels.append(power @ total + total @ power)
    return finished(levels, steps.bounds, steps.perm, shape)


def frechet_order(dtype: torch.dtype) -> int:
    """Taylor terms after scaling to a norm <= 1/2: below fp32 (8) or fp64 (14) rounding."""
    return 8 if dtype == torch.float32 else 14


class MatrixExp(torch.autograd.Function):
    """``exp(A)`` by ``chain``, whose backward ``L(A^T, G) = L(A, G^T)^T`` reuses its squares and recomputes its
    Taylor terms (``order - 2`` products; keeping them too would cost ``order`` more matrices per exponential for
    about a tenth of the backward's time)."""

    @staticmethod
    def forward(ctx, skew: Tensor) -> Tensor:
        steps, _ = chain(skew, frechet_order(skew.dtype))
        ctx.save_for_backward(steps.perm, steps.count, steps.scaled, *steps.powers)
        ctx.bounds = steps.bounds
        return finished(steps.powers, steps.bounds, steps.perm, skew.shape)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        perm, count, scaled, *powers = ctx.saved_tensors
        terms = taylor_terms(scaled, frechet_order(scaled.dtype) - 1)  # frechet takes all but the last
        steps = Chain(perm, count, ctx.bounds, scaled, powers)
        return frechet(None, grad.mT, (steps, terms)).mT  # L(A^T, G) = L(A, G^T)^T
