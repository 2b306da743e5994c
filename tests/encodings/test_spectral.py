"""ComRoPE's block rotations in RoPE form (``vit_rope.encodings.generators.comrope``): the same scores from a basis
and 2D frequencies as from ``exp((c_x x + c_y y) S)``, and a refusal where the form is ambiguous."""

from __future__ import annotations

import torch

from vit_rope.encodings.generators.comrope import spectral_form
from vit_rope.layers.rotary import apply_rope, rope_angles, rope_tables


def block_scores(skew: torch.Tensor, scale: torch.Tensor, pos: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(R_i q_i) . (R_j q_j)`` with ``R = exp((c_x x + c_y y) S)`` per block, in float64."""
    t = torch.einsum("na,laj->lnj", pos.double(), scale.double())  # [L, N, m]
    rotation = torch.linalg.matrix_exp(t[:, None, :, :, None, None] * skew.double()[:, :, None])  # [L, H, N, m, b, b]
    turned = (rotation @ q.unflatten(-1, (skew.shape[2], -1))[..., None])[..., 0].flatten(-2)
    return turned @ turned.mT


def test_basis_and_frequencies_give_the_block_rotations_scores():
    torch.manual_seed(0)
    L, H, m, b = 2, 3, 4, 8
    raw = torch.randn(L, H, m, b, b)
    skew, scale = raw - raw.mT, torch.randn(L, 2, m)
    basis, freqs = spectral_form(skew, scale)
    assert basis.shape == (L, H, m * b, m * b) and freqs.shape == (L, 2, H, m * b // 2)
    torch.testing.assert_close(basis @ basis.mT, torch.eye(m * b).expand(L, H, -1, -1), atol=1e-6, rtol=0)
    pos = torch.rand(7, 2) * 5 - 1  # fractional and negative positions too
    q = torch.randn(L, H, 7, m * b, dtype=torch.float64)
    cos, sin = rope_tables(rope_angles(pos, freqs))
    turned = apply_rope(torch.einsum("lhde,lhne->lhnd", basis.double(), q), cos.double(), sin.double())
    expected = block_scores(skew, scale, pos, q)
    torch.testing.assert_close(turned @ turned.mT, expected, atol=1e-5 * expected.abs().max().item(), rtol=0)


def test_a_block_without_rotation_planes_is_refused():
    """``S = 0`` (every ``w`` zero) leaves the pairing of channels into planes open: ``None``, so the caller keeps the
    block rotations."""
    skew = torch.zeros(1, 1, 2, 4, 4)
    raw = torch.randn(4, 4)
    skew[0, 0, 1] = raw - raw.T
    assert spectral_form(skew, torch.ones(1, 2, 2)) is None
