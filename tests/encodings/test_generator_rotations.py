"""Rotations from learned generators (vit_rope.encodings.generators.block_rotation, comrope, liere): parity with the
official code, the exportable exponential against torch's, the block rotation against a dense product, per-axis turns
against per-cell ones, and each kind's properties: norms kept, ComRoPE's matrices commuting (hence relative), LieRE
equal to exp(sum p_i A_i) and relative only where its generators commute."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vit_rope.encodings.base import image_positions
from vit_rope.encodings.generators import block_rotation
from vit_rope.encodings.generators.block_rotation import BlockRotations, rotate_blocks, rotate_qk
from vit_rope.encodings.generators.comrope import AxisRotations, ComRoPE
from vit_rope.encodings.generators.liere import LieRE
from vit_rope.layers.attention import RoPEAttention

# official outputs: make_generator_rotation_reference.py beside this file, ComRoPE at 7aeef083, LieRE at b27b41ba
REFERENCE = Path(__file__).with_name("generator_rotation_reference.pt")
TRAIN, LARGE = 4, 6


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return torch.load(REFERENCE, weights_only=True)


def comrope_attention(ref: dict[str, torch.Tensor], kind: str, policy: str) -> tuple[RoPEAttention, ComRoPE]:
    """Our attention and ComRoPE with the official layer's weights (q/k/v projections fused into our qkv)."""
    p = f"comrope_{kind}."
    attn = RoPEAttention(32, num_heads=2, qkv_bias=True).eval()
    encoding = ComRoPE(f"comrope_{kind}", 1, 2, 16, (TRAIN, TRAIN), policy, block_size=4)
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([ref[p + f"{n}_proj.weight"] for n in "qkv"]))
        attn.qkv.bias.copy_(torch.cat([ref[p + f"{n}_proj.bias"] for n in "qkv"]))
        attn.proj.weight.copy_(ref[p + "out_proj.weight"])
        attn.proj.bias.copy_(ref[p + "out_proj.bias"])
        encoding.freqs.copy_(ref[p + "freqs"][None])
        if kind == "ld":
            encoding.multiplier.copy_(ref[p + "multiplier"][None])
    return attn, encoding


@pytest.mark.parametrize("grid", [TRAIN, LARGE])
@pytest.mark.parametrize("policy", ["interpolate", "extrapolate"])
@pytest.mark.parametrize("kind", ["ap", "ld"])
def test_comrope_attention_equals_the_official_layer(reference, kind: str, policy: str, grid: int):
    attn, encoding = comrope_attention(reference, kind, policy)
    x = reference[f"comrope_{kind}.x{grid}"]
    inputs = encoding.block_inputs(image_positions(encoding, grid, grid), 1)[0]  # per axis: the grid's rows, columns
    assert isinstance(inputs, AxisRotations)
    with torch.no_grad():
        q, k, _ = attn.project(x, inputs)
        probs = ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)
        out = attn(x, inputs)
    expected = f"comrope_{kind}.{policy}{grid}"
    torch.testing.assert_close(probs, reference[expected + ".probs"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, reference[expected + ".out"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("grid", [TRAIN, LARGE])
def test_liere_attention_equals_the_official_layer(reference, grid: int):
    attn = RoPEAttention(128, num_heads=2, qkv_bias=False).eval()
    encoding = LieRE(1, 2, 64, (TRAIN, TRAIN), generator_dim=8)
    with torch.no_grad():
        attn.qkv.weight.copy_(reference["liere.to_qkv.weight"])
        attn.proj.weight.copy_(reference["liere.to_out.0.weight"])
        attn.proj.bias.copy_(reference["liere.to_out.0.bias"])
        encoding.generator_raw_params.copy_(reference["liere.generator_raw_params"])
        inputs = encoding.block_inputs(image_positions(encoding, grid, grid), 1)[0]
        out = attn(reference[f"liere.x{grid}"], inputs)
    torch.testing.assert_close(out, reference[f"liere.extrapolate{grid}.out"], atol=1e-5, rtol=1e-4)


def block_diagonal(rotation: torch.Tensor) -> torch.Tensor:
    """``[..., m, b, b]`` -> ``[..., m b, m b]``."""
    *lead, m, b, _ = rotation.shape
    dense = rotation.new_zeros(*lead, m * b, m * b)
    for j in range(m):
        dense[..., j * b:(j + 1) * b, j * b:(j + 1) * b] = rotation[..., j, :, :]
    return dense


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 3e-5)])
def test_the_exponential_and_its_gradient_equal_the_exact_one(dtype: torch.dtype, tol: float):
    """With autograd (``expm_by_squaring`` to the largest count) and under a capture (every squaring masked): the
    values and gradient of float64 ``matrix_exp``, from tiny norms to ~1e4 in fp64, to ~100 in fp32 (past what
    positions times generators reach). fp32's bound is rounding through up to 8 squarings of a norm-100 matrix (torch's
    own fp32 ``matrix_exp`` is off by 7e-6 in gradient there; ours by 2e-5 on an AMD EPYC and an Intel Xeon)."""
    torch.manual_seed(0)
    raw = torch.randn(64, 8, 8, dtype=torch.float64) * torch.logspace(-3, 2.5, 64, dtype=torch.float64)[:, None, None]
    exact = (raw - raw.mT)[: 64 if dtype == torch.float64 else 48].requires_grad_()
    expected = torch.linalg.matrix_exp(exact)
    grad = torch.randn_like(expected)
    (theirs,) = torch.autograd.grad(expected, exact, grad)
    scale = theirs.abs().amax((-1, -2), keepdim=True)  # relative to each matrix's gradient
    skew = exact.detach().to(dtype).requires_grad_()
    for ours in (block_rotation.expm(skew), block_rotation.expm(skew, captured=True)):
        torch.testing.assert_close(ours.double(), expected, atol=tol, rtol=tol)
        (mine,) = torch.autograd.grad(ours, skew, grad.to(dtype))
        torch.testing.assert_close(mine.double() / scale, theirs / scale, atol=tol, rtol=0)


@pytest.mark.parametrize("shared", [True, False])
def test_rotate_blocks_is_the_dense_block_diagonal_product_and_rotate_qk_the_same(shared: bool):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 5, 12)  # [B, H, N, D], blocks of 4
    skew = torch.randn(1 if shared else 3, 2, 5, 3, 4, 4)
    rotation = torch.linalg.matrix_exp(skew - skew.transpose(-1, -2))
    dense = block_diagonal(rotation)  # [1 or B, H, N, D, D]
    torch.testing.assert_close(rotate_blocks(x, rotation), (dense @ x[..., None])[..., 0])
    if shared:  # one table for the batch: q's and k's samples as the rows of one matmul
        torch.testing.assert_close(rotate_qk(x, x.flip(0), rotation), (rotate_blocks(x, rotation),
                                                                       rotate_blocks(x.flip(0), rotation)))


def encodings() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {"comrope_ap": ComRoPE("comrope_ap", 2, 2, 16, (4, 4), block_size=4),
            "comrope_ld": ComRoPE("comrope_ld", 2, 2, 16, (4, 4), block_size=4),
            "liere": LieRE(2, 2, 16, (4, 4), generator_dim=4)}


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld", "liere"])
def test_every_rotation_keeps_norms(kind: str):
    encoding = encodings()[kind]
    positions = image_positions(encoding, 5, 7)
    q, k = torch.randn(2, 2, 2, 36, 16).unbind(0)
    for x, rotated in zip((q, k), encoding.block_inputs(positions, 1)[0].rotate(q, k), strict=True):
        torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    with torch.no_grad():
        rotation = encoding.tables(positions.coords, 1)  # [L, 1, H, P + N, m, b, b]
    eye = torch.eye(rotation.shape[-1])
    torch.testing.assert_close(rotation @ rotation.transpose(-1, -2), eye.expand_as(rotation), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_comrope_matrices_commute_and_scores_see_offsets_only(kind: str):
    encoding = encodings()[kind]
    with torch.no_grad():
        gens = encoding.generators()  # [L, H, 2, m, b, b]
        ax, ay = gens[:, :, 0], gens[:, :, 1]
        assert (ax @ ay - ay @ ax).abs().max() < 1e-5
        assert ax.abs().amax() > 0.1 and ay.abs().amax() > 0.1
        p, r = torch.tensor([[0.3, 1.7], [2.5, -0.4]]), torch.tensor([[1.1, 0.2]])
        rot = encoding.tables(torch.cat((p, p + r)), 0)[:, 0]  # [L, H, 4, m, b, b]
        moved = rot[:, :, :2].transpose(-1, -2) @ rot[:, :, 2:]  # R(p)^T R(p + r) for both p
        torch.testing.assert_close(moved[:, :, 0], moved[:, :, 1], atol=1e-5, rtol=1e-5)


def test_liere_is_the_exponential_of_its_generators_and_relative_only_where_they_commute():
    encoding = encodings()["liere"]
    with torch.no_grad():
        gens = encoding.generators()[0]  # [H, 2, m, g, g]
        p = torch.tensor([[0.3, 1.7], [2.5, -0.4], [1.4, 1.9], [3.6, -0.2]])  # pairs 0, 1 and 2, 3: offset (1.1, 0.2)
        rot = encoding.tables(p, 0)[0, 0]  # [H, 4, m, g, g]
        dense = torch.linalg.matrix_exp(block_diagonal(p[:, 0, None, None, None] * gens[:, None, 0]
                                                       + p[:, 1, None, None, None] * gens[:, None, 1]))
        torch.testing.assert_close(block_diagonal(rot), dense, atol=1e-5, rtol=1e-5)

        def offset_maps(rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return rot[:, 0].transpose(-1, -2) @ rot[:, 2], rot[:, 1].transpose(-1, -2) @ rot[:, 3]

        first, second = offset_maps(rot)
        assert (first - second).abs().max() > 1e-2  # free generators: the same offset, different maps
        # so exp(y A_y) exp(x A_x) is not exp(x A_x + y A_y): LieRE's tables are never turned per axis, as ComRoPE's
        assert isinstance(encoding.block_inputs(image_positions(encoding, 4, 4), 0)[0], BlockRotations)
        raw = encoding.generator_raw_params
        raw[1] = 2.0 * raw[0]  # A_y = 2 A_x: commuting generators
        first, second = offset_maps(encoding.tables(p, 0)[0, 0])
        torch.testing.assert_close(first, second, atol=1e-4, rtol=1e-4)  # angles up to ~50 rad in fp32


def test_bad_block_sizes_and_generators_are_errors_that_say_what_fits():
    with pytest.raises(ValueError, match=r"block_size'\]=5 must divide the head width 16.*\[2, 4, 8, 16\]"):
        ComRoPE("comrope_ld", 1, 2, 16, (4, 4), block_size=5)
    with pytest.raises(ValueError, match=r"block_size'\]=16 leaves 1 blocks.*\[2, 4, 8\]"):
        ComRoPE("comrope_ap", 1, 2, 16, (4, 4), block_size=16)
    with pytest.raises(ValueError, match=r"generator_dim'\]=6 must divide the head width 16"):
        LieRE(1, 2, 16, (4, 4), generator_dim=6)
    with pytest.raises(ValueError, match="'yarn' does not apply to liere.*'extrapolate'"):
        LieRE(1, 2, 16, (4, 4), policy="yarn")


@pytest.mark.parametrize("cls_position", [0.5, None])
@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_comrope_turns_per_axis_equal_one_exponential_per_cell(kind: str, cls_position: float | None):
    """An image batch is turned per axis (``rotate_axes``: one exponential per row and per column, applied column by
    column, then row by row; AP's blocks by their one axis), since the generators commute: q and k equal those turned
    by ``exp(x A_x + y A_y)`` of each cell, prefix tokens included, and so do the generators' gradients."""
    torch.manual_seed(0)
    encoding = ComRoPE(kind, 2, 2, 16, (4, 4), block_size=4, cls_position=cls_position)
    positions = image_positions(encoding, 5, 3)
    q, k = torch.randn(2, 3, 2, 2 + 15, 16).unbind(0)  # a class token and a register
    inputs = encoding.block_inputs(positions, 2)
    assert all(isinstance(item, AxisRotations) for item in inputs)
    per_cell = encoding.tables(positions.coords, 2)[1]  # [1, H, P + N, m, b, b]
    by_axes = inputs[1].rotate(q, k)
    expected = rotate_blocks(q, per_cell), rotate_blocks(k, per_cell)
    torch.testing.assert_close(by_axes, expected, atol=1e-5, rtol=1e-5)
    grads = [torch.autograd.grad(sum((a * b).sum() for a, b in zip(out, (k, q), strict=True)),
                                 encoding.parameters()) for out in (by_axes, expected)]
    torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4)


def test_tables_without_autograd_are_built_a_chunk_of_tokens_at_a_time(monkeypatch):
    """Evaluation's tables (chunks of tokens, each exponential its own) equal one call's and training's (autograd:
    ``expm_by_squaring``) to fp32 rounding: ``matrix_exp`` picks its degree and squarings per batch."""
    torch.manual_seed(0)
    encoding = LieRE(depth=2, num_heads=2, head_dim=16, train_grid=(4, 4), per_layer=True)
    positions = torch.rand(13, 2) * 3
    training = encoding.tables(positions, 2).detach()
    with torch.no_grad():
        whole = encoding.tables(positions, 2)
        monkeypatch.setattr(block_rotation, "TABLE_CHUNK", 2 * 2 * 2 * 3)  # 3 tokens per chunk
        torch.testing.assert_close(encoding.tables(positions, 2), whole, rtol=0, atol=3e-5)
    torch.testing.assert_close(whole, training, rtol=0, atol=3e-5)
