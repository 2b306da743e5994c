"""The matrix exponential of ComRoPE's and LieRE's blocks (vit_rope.layers.expm): the exportable form and the eager
backward both equal torch's ``matrix_exp`` and its gradient, from tiny norms to large ones."""

from __future__ import annotations

import pytest
import torch

from vit_rope.layers.expm import expm, expm_by_squaring, frechet


def matrices(skew: bool) -> torch.Tensor:
    """64 matrices of 8 x 8 with norms from 1e-2 to ~1e4, fp64."""
    torch.manual_seed(0)
    a = torch.randn(64, 8, 8, dtype=torch.float64) * torch.logspace(-3, 2.5, 64, dtype=torch.float64)[:, None, None]
    return a - a.transpose(-1, -2) if skew else a


def test_exportable_exponential_equals_matrix_exp():
    skew = matrices(skew=True)
    torch.testing.assert_close(expm_by_squaring(skew), torch.linalg.matrix_exp(skew), atol=1e-9, rtol=1e-9)
    moderate = skew[:48].float()  # fp32 angles up to ~100 (past what positions times generators reach)
    torch.testing.assert_close(expm_by_squaring(moderate), torch.linalg.matrix_exp(skew[:48]).float(), atol=2e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("skew", [True, False])
def test_frechet_derivative_is_the_block_of_the_doubled_exponential(skew: bool):
    """``L(A, E)`` is the upper right block of ``exp([[A, E], [0, A]])``, whatever ``A`` (skew-symmetric or not)."""
    a = matrices(skew)[:40]  # general matrices' exponentials overflow fp64 past norms ~700
    e = torch.randn_like(a)
    block = torch.cat((torch.cat((a, e), -1), torch.cat((torch.zeros_like(a), a), -1)), -2)
    expected = torch.linalg.matrix_exp(block)[..., :8, 8:]
    torch.testing.assert_close(frechet(a, e), expected, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 2e-5)])
def test_eager_gradient_equals_torchs_matrix_exp_gradient(dtype: torch.dtype, tol: float):
    skew = matrices(skew=True)[:48].to(dtype)  # LieRE's range: norms up to ~100
    grad = torch.randn_like(skew)
    mine, theirs = skew.clone().requires_grad_(), skew.clone().requires_grad_()
    out = expm(mine)
    out.backward(grad)
    torch.linalg.matrix_exp(theirs).backward(grad)
    torch.testing.assert_close(out, torch.linalg.matrix_exp(skew))
    scale = theirs.grad.abs().amax(dim=(-1, -2), keepdim=True)  # relative to each matrix's gradient
    torch.testing.assert_close(mine.grad / scale, theirs.grad / scale, atol=tol, rtol=0)
    assert torch.autograd.gradcheck(expm, matrices(skew=True)[:4].requires_grad_())

