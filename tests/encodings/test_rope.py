"""The maths of vit_rope.encodings.rope.tables: relative-position property far from the origin (near it, for every
kind: test_golden_string.py), equivalences with RoFormer's forms, layout, errors."""

import math

import pytest
import torch
from timm.layers import PatchEmbed

from vit_rope.encodings.rope.tables import RoPE2D, axial_frequencies, mixed_frequencies
from vit_rope.layers.rotary import apply_rope, grid_positions, grid_tables, rope_angles, rope_tables

KINDS = ("axial", "mixed")
B, NH, N, D = 2, 3, 10, 16


@pytest.fixture
def qk() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, NH, N, D, generator=g), torch.randn(B, NH, N, D, generator=g)


@pytest.mark.parametrize("kind", KINDS)
def test_scores_depend_only_on_offset_between_grids(kind, qk):
    """A query grid against a shifted key grid equals the same offset anywhere else in the plane."""
    rope = RoPE2D(D, NH, kind)
    q, k = qk
    pos = torch.randn(N, 2) * 4
    offset = torch.tensor([1.5, -2.0])

    def scores(shift) -> torch.Tensor:  # [B, nh, N, N]: queries at pos + shift, keys offset from them
        return apply_rope(q, *rope(pos + shift)) @ apply_rope(k, *rope(pos + shift + offset)).transpose(-2, -1)

    torch.testing.assert_close(scores(torch.tensor([100.0, 37.0])), scores(0.0), atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_apply_rope_equals_rotation_matrix_and_complex_product(kind):
    torch.manual_seed(2)
    rope = RoPE2D(D, NH, kind)
    pos = torch.randn(N, 2) * 5
    x = torch.randn(B, NH, N, D, dtype=torch.float64)
    angles = rope_angles(pos, rope.freqs.double()).expand(NH, N, D // 2)  # [nh, N, D/2]
    out = apply_rope(x, *rope_tables(angles))

    # explicit block-diagonal rotation, one [D, D] matrix per (head, position)
    def rotation(a: float) -> torch.Tensor:
        return torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)

    mats = torch.stack([torch.block_diag(*map(rotation, row)) for row in angles.reshape(-1, D // 2).tolist()])
    torch.testing.assert_close(out, torch.einsum("hnij,bhnj->bhni", mats.reshape(NH, N, D, D), x))

    # complex formulation of RoFormer / RoPE-ViT: (x0 + i x1) * exp(i angle)
    z = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous()) * torch.polar(torch.ones_like(angles), angles)
    torch.testing.assert_close(out, torch.view_as_real(z).flatten(-2))
    q = torch.randn(B, NH, N, D)  # and far from the origin in fp32, norms stay
    torch.testing.assert_close(apply_rope(q, *rope(pos * 10)).norm(dim=-1), q.norm(dim=-1))


def test_axial_with_y_zero_is_1d_rope_on_the_x_half():
    theta, t = 100.0, torch.arange(N, dtype=torch.float32) * 1.5
    x = torch.randn(B, NH, N, D)
    out = apply_rope(x, *RoPE2D(D, NH, "axial", theta)(torch.stack((t, torch.zeros(N)), -1)))
    # RoFormer 1D RoPE on d = D/2 channels: pair i turns by t * theta^(-2i/d)
    d = D // 2
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x[..., :d].double().reshape(B, NH, N, d // 2, 2).contiguous())
    ref = torch.view_as_real(
        z * torch.polar(torch.ones(N, d // 2, dtype=torch.float64), torch.outer(t.double(), inv_freq))
    )
    torch.testing.assert_close(out[..., :d], ref.flatten(-2).float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[..., d:], x[..., d:])  # y = 0: the y half is untouched


def test_axial_frequencies_follow_rope_vit():
    freqs = axial_frequencies(64, 100.0)
    assert freqs.shape == (2, 1, 32)
    expected = torch.tensor([100.0 ** (-4 * k / 64) for k in range(16)])
    torch.testing.assert_close(freqs[0, 0, :16], expected)
    torch.testing.assert_close(freqs[1, 0, 16:], expected)
    assert freqs[0, 0, 16:].abs().sum() == 0 and freqs[1, 0, :16].abs().sum() == 0


def test_mixed_init_is_a_rotated_axial_frame_per_head():
    freqs = mixed_frequencies(64, 6, 10.0, generator=torch.Generator().manual_seed(0))  # [2, nh, D/2]
    assert freqs.shape == (2, 6, 32)
    mag = torch.tensor([10.0 ** (-4 * k / 64) for k in range(16)])
    wx, wy = freqs
    torch.testing.assert_close(torch.hypot(wx, wy), torch.cat((mag, mag)).expand(6, 32))
    # the second half of the pairs turns along the direction orthogonal to the first half
    torch.testing.assert_close(wx[:, :16] * wx[:, 16:] + wy[:, :16] * wy[:, 16:], torch.zeros(6, 16), atol=1e-6, rtol=0)
    directions = torch.atan2(wy[:, 0], wx[:, 0])
    assert directions.unique().numel() == 6  # one random direction per head


def test_grid_positions_follow_patch_embed_flattening():
    h, w, p = 3, 4, 8
    pos = grid_positions(h, w)
    assert pos.shape == (h * w, 2) and pos.dtype == torch.float32
    embed = PatchEmbed(img_size=(h * p, w * p), patch_size=p, in_chans=1, embed_dim=1)
    torch.nn.init.ones_(embed.proj.weight)
    torch.nn.init.zeros_(embed.proj.bias)
    for row, col in [(0, 3), (2, 1), (1, 0)]:
        img = torch.zeros(1, 1, h * p, w * p)
        img[..., row * p, col * p] = 1.0
        token = embed(img)[0, :, 0].nonzero().item()
        assert pos[token].tolist() == [col, row]  # x = column, y = row


def test_tables_broadcast_and_prefix_rows_are_identity():
    pos = torch.randn(N, 2)
    cos, sin = RoPE2D(D, NH, "axial")(pos, num_prefix_tokens=2)
    assert cos.shape == sin.shape == (1, N + 2, D // 2)  # one value per channel pair
    assert (cos[:, :2] == 1).all() and (sin[:, :2] == 0).all()
    cos, sin = RoPE2D(D, NH, "mixed")(pos.expand(B, N, 2), num_prefix_tokens=1)
    assert cos.shape == (B, NH, N + 1, D // 2)
    x = torch.randn(B, NH, N + 1, D)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[:, :, 0], x[:, :, 0])


@pytest.mark.parametrize("batched", ["positions", "frequencies", "both", "neither"])
def test_tables_are_token_major_in_memory_as_the_rotation_reads_them(batched):
    """``[(B,) H, N, D/2]`` tables over ``[(B,) N, H, D/2]`` memory, prefix rows included: the fused rotation's
    ``[(B,) N, 1, H, D/2]`` view of them is contiguous, and the values are the head-major formula's."""
    pos = torch.randn(*((B,) if batched in ("positions", "both") else ()), N, 2) * 5
    freqs = torch.randn(*((B,) if batched in ("frequencies", "both") else ()), 2, NH, D // 2)
    angles = rope_angles(pos, freqs)
    x, y = pos[..., None, :, 0, None], pos[..., None, :, 1, None]  # [(B,) 1, N, 1]
    expected = x * freqs[..., 0, :, None, :] + y * freqs[..., 1, :, None, :]  # [(B,) H, N, D/2]
    torch.testing.assert_close(angles, expected.expand_as(angles), atol=1e-5, rtol=1e-6)
    head_major = rope_tables(angles.contiguous(), num_prefix_tokens=2)
    for table, same in zip(rope_tables(angles, num_prefix_tokens=2), head_major, strict=True):
        assert table.shape[-3:] == (NH, N + 2, D // 2) and table.transpose(-3, -2).is_contiguous()
        assert same.is_contiguous() and torch.equal(table, same)  # prefix rows too


def test_low_precision_inputs_keep_fp32_angles():
    rope = RoPE2D(D, NH, "mixed").to(torch.bfloat16)
    pos = torch.tensor([[1000.0, 517.0], [3.0, 4.0]])
    cos, _ = rope(pos)
    assert cos.dtype == torch.float32
    exact = rope_angles(pos.double(), rope.freqs.double())
    torch.testing.assert_close(rope_angles(pos, rope.freqs).double(), exact, atol=1e-3, rtol=0)
    x = torch.randn(B, NH, 2, D)
    out = apply_rope(x.bfloat16(), cos, _)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), apply_rope(x.bfloat16().float(), cos, _), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("kind", KINDS)
def test_autograd_is_exact(kind):
    rope = RoPE2D(D, 2, kind).double()
    x = torch.randn(1, 2, 4, D, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(4, 2, dtype=torch.float64)

    def f(x, freqs):
        return apply_rope(x, *rope_tables(rope_angles(pos, freqs)))

    freqs = rope.freqs.detach().clone().requires_grad_(kind == "mixed")
    assert torch.autograd.gradcheck(f, (x, freqs))


@pytest.mark.parametrize("naflex", [False, True])
def test_mixed_frequency_gradient_is_zero_on_p_ropes_unrotated_pairs(naflex):
    """``RoPE2D`` (per-sample positions on one grid, or on a grid per sample as in NaFlex batches, with per-sample
    policy-scaled frequencies) gives the frequencies a gradient, and none to p-RoPE's unrotated pairs."""
    rope = RoPE2D(D, NH, "mixed", train_grid=(4, 4), policy="interpolate", fraction=0.5).double()
    pos = torch.randn(B, N, 2, dtype=torch.float64) * 3
    grid = torch.tensor([[4, 6], [3, 5]]) if naflex else torch.tensor([[5, 6]])
    cos, sin = rope(pos, 2, grid)
    (cos * torch.randn_like(cos) + sin * torch.randn_like(sin)).sum().backward()
    grad = rope.freqs.grad
    assert grad.abs().sum() > 0 and (grad * (1 - rope.rotated)).abs().max() == 0


def test_a_head_width_off_a_multiple_of_4_is_refused_with_the_nearest():  # unknown kinds: test_golden_string.py
    with pytest.raises(ValueError, match=r"divisible by 4.*head_dim=30.*28 or 32"):
        RoPE2D(30, 2)


def test_earlier_argument_names_are_refused():
    """``normalize``, ``init`` and ``offset`` are the model's names without ``rope_`` now, and nothing else."""
    for old in ("normalize", "init", "offset", "thta"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            RoPE2D(D, NH, **{old: 1.0})


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 5e-5)])
def test_grid_tables_from_one_table_per_axis_equal_the_direct_tables(dtype, tol):
    """Values (angles up to a few hundred radians, offset positions, prefix rows) and the frequencies' gradient."""
    freqs = (mixed_frequencies(D, NH, 10.0) * 16).to(dtype).requires_grad_(True)
    xs, ys = torch.arange(7, dtype=dtype) + 1, torch.arange(5, dtype=dtype) + 1  # Perception Encoder's offset
    positions = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1).reshape(-1, 2)  # [35, 2] (x, y)
    weights = torch.randn(2, NH, 2 + 35, D // 2, dtype=dtype)

    def tables_and_grad(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        (grad,) = torch.autograd.grad((cos * weights[0] + sin * weights[1]).sum(), freqs)
        return cos, sin, grad

    mine = tables_and_grad(*grid_tables(xs, ys, freqs, 2))
    direct = tables_and_grad(*rope_tables(rope_angles(positions, freqs), 2))
    assert mine[0].transpose(0, 1).is_contiguous()  # token-major, as the fused rotation reads it
    for a, b in zip(mine, direct, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(b.detach().abs().max()))
    assert rope_angles(positions, freqs).abs().max() > 100


def test_mixed_tables_are_built_as_each_block_runs() -> None:
    """Per-block tables come from ``LazyBlockInputs``: block ``i`` runs after exactly ``i + 1`` tables were built, so a
    forward never holds every block's ``[H, N, D/2]`` tables at once (at 2048 px they are 0.8 GB for ViT-S)."""
    import timm

    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=3, num_classes=2, img_size=32).eval()
    built, seen = [], []
    for rope in model.pos_encoding:
        rope.register_forward_hook(lambda *args: built.append(1))
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda *args: seen.append(len(built)))
    with torch.inference_mode():
        lazy = model(torch.randn(1, 3, 32, 32))
    assert seen == [1, 2, 3]
    inputs = model.pos_encoding.block_inputs(*model._embed(torch.randn(1, 3, 32, 32))[1:2], 1)
    assert len(inputs) == 3 and len(inputs[0:2]) == 2 and inputs[-1][0].shape == inputs[0][0].shape
    with pytest.raises(IndexError):
        inputs[3]
    x = torch.randn(2, 3, 32, 32)
    model.train().set_grad_checkpointing(True)  # recomputation asks for a block's tables again
    checkpointed = model(x)
    checkpointed.sum().backward()
    model.set_grad_checkpointing(False)
    torch.testing.assert_close(checkpointed, model(x))
    assert lazy.shape == (1, 2) and model.pos_encoding[0].freqs.grad is not None
