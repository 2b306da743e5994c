"""The rotation kinds' maths: golden-angle frequencies (vit_rope.encodings.rope.tables), p-RoPE's mask, the Cayley
transform and STRING's fold (vit_rope.encodings.rope.rotary_encoding); translation invariance of each kind's position
function with fractional offsets; errors that name the value and what is allowed."""

import math

import pytest
import torch

from vit_rope.encodings.rope.rotary_encoding import CayleyString, cayley
from vit_rope.encodings.rope.tables import GOLDEN_ANGLE, RoPE2D, axial_frequencies, golden_frequencies, rotated_pairs
from vit_rope.layers.fused import fold_qk
from vit_rope.layers.rotary import apply_rope

NH, D = 3, 16
KINDS = ("axial", "mixed", "golden", "dinov3")


def test_golden_schedule_steps_by_the_golden_angle_with_log_spaced_magnitudes_and_can_start_mixed():
    freqs = golden_frequencies(D, NH, theta=100.0).double()  # [2, nh, D/2]
    assert freqs.shape == (2, NH, D // 2)
    magnitude = freqs.norm(dim=0)
    expected = 100.0 ** (-torch.arange(D // 2, dtype=torch.float64) / (D // 2 - 1))
    torch.testing.assert_close(magnitude, expected.expand(NH, -1), atol=1e-6, rtol=1e-6)
    angle = torch.atan2(freqs[1], freqs[0]).flatten()  # heads continue the sequence
    step = torch.remainder(angle.diff(), 2 * math.pi)
    torch.testing.assert_close(step, torch.full_like(step, GOLDEN_ANGLE), atol=1e-5, rtol=0)
    assert not list(RoPE2D(D, NH, kind="golden").parameters())  # fixed: no parameter
    rope = RoPE2D(D, NH, kind="mixed", mixed_init="golden", theta=100.0)  # learned frequencies starting golden
    assert rope.learnable
    torch.testing.assert_close(rope.freqs.detach(), golden_frequencies(D, NH, 100.0))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_position_function_sees_offsets_only(kind: str, fraction: float):
    """q_i . k_j is unchanged when every position moves by a common fractional offset, and (when anything is
    rotated) changes when one position moves alone."""
    torch.manual_seed(0)
    rope = RoPE2D(D, NH, kind=kind, fraction=fraction)
    positions = torch.rand(7, 2) * 6  # [N, 2], fractional
    q, k = torch.randn(2, 1, NH, 7, D).double().unbind(0)

    def logits(pos: torch.Tensor) -> torch.Tensor:
        cos, sin = rope(pos.double())
        return apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2)  # [1, nh, N, N]

    base = logits(positions)
    torch.testing.assert_close(logits(positions + torch.tensor([0.37, -2.6])), base, atol=1e-4, rtol=0)
    moved = positions.clone()
    moved[3] += torch.tensor([1.3, 0.4])
    changed = (logits(moved) - base).abs().max()
    assert (changed > 1e-3) if fraction > 0 else (changed < 1e-9)


def test_p_rope_keeps_the_highest_frequencies_and_as_many_x_as_y_pairs():
    mask = rotated_pairs(axial_frequencies(D), 0.5)[0, 0]  # axial: x pairs 0..3, y pairs 4..7, highest first
    assert mask.tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    golden = rotated_pairs(golden_frequencies(D, NH), 0.25)[0]  # [nh, D/2]: the first (highest) quarter
    assert golden.sum(-1).tolist() == [2.0] * NH and golden[:, :2].all()
    assert rotated_pairs(axial_frequencies(D), 0.0).sum() == 0 and rotated_pairs(axial_frequencies(D), 1.0).all()


def test_unrotated_mixed_pairs_stay_unrotated_after_training():
    torch.manual_seed(0)
    rope = RoPE2D(D, NH, kind="mixed", fraction=0.5)
    optimizer = torch.optim.AdamW(rope.parameters(), lr=0.1, weight_decay=0.0)
    for _ in range(3):
        cos, sin = rope(torch.rand(5, 2) * 4)
        (cos.sum() + 2 * sin.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    used = rope.pair_frequencies().detach()
    assert (used[:, rope.rotated[0] == 0] == 0).all() and (used[:, rope.rotated[0] == 1] != 0).all()


def test_cayley_is_orthogonal_identity_at_zero_and_fold_equals_rotating_q_and_k():
    torch.manual_seed(0)
    basis = cayley(torch.randn(NH, D, D))
    eye = torch.eye(D).expand(NH, -1, -1)
    torch.testing.assert_close(basis.transpose(-1, -2) @ basis, eye, atol=1e-5, rtol=0)
    assert torch.equal(cayley(torch.zeros(NH, D, D)), eye)

    C = 24
    linear = torch.nn.Linear(C, 3 * NH * D)
    x = torch.randn(2, 5, C)
    weight, bias = fold_qk(basis, linear.weight, linear.bias)
    folded = torch.nn.functional.linear(x, weight, bias).unflatten(-1, (3, NH, D))  # [B, N, 3, nh, D]
    plain = linear(x).unflatten(-1, (3, NH, D))
    expected = torch.einsum("hde,bnthe->bnthd", basis, plain[:, :, :2])
    torch.testing.assert_close(folded[:, :, :2], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(folded[:, :, 2], plain[:, :, 2])


def test_string_keeps_its_fold_while_weights_are_unchanged_and_refolds_when_they_change():
    torch.manual_seed(0)
    string, linear = CayleyString(NH, D), torch.nn.Linear(8, 3 * NH * D)
    with torch.no_grad():
        string.skew.normal_()
        first = string(linear.weight, linear.bias, cache=True)
        assert string(linear.weight, linear.bias, cache=True)[0] is first[0]  # cached: no fold per forward
        assert string(linear.weight, linear.bias)[0] is not first[0]  # under a graph capture: no cache
        string.skew.mul_(0.5)
        again = string(linear.weight, linear.bias, cache=True)
    torch.testing.assert_close(again[0], fold_qk(cayley(string.skew), linear.weight, linear.bias)[0])
    assert not torch.equal(again[0], first[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="spiral"), r"'spiral'.*axial, mixed, golden, dinov3"),
    (dict(fraction=1.5), r"rope_fraction must be in \[0, 1\].*1\.5"),
    (dict(fraction=-0.1), r"rope_fraction must be in \[0, 1\].*-0\.1"),
    (dict(kind="axial", mixed_init="golden"), r"init='golden'.*rope-vit, golden"),
])
def test_bad_input_names_the_value_and_what_is_allowed(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        RoPE2D(D, NH, **kwargs)
