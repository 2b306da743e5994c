"""Block rotations applied straight from a projection whose q and k blocks alternate
(``vit_rope.layers.paired_rotation``), and ComRoPE's per-axis rotations taking that path
(``axis_rotation.AxisRotations.project``): the values and every gradient of the plain projection followed by the
rotation."""

from __future__ import annotations

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from helpers.models import randomize_
from vit_rope.encodings.base import image_positions
from vit_rope.encodings.generators import axis_rotation
from vit_rope.encodings.generators.axis_rotation import PAIRED_MIN_BATCH, AxisRotations
from vit_rope.encodings.generators.block_rotation import rotate_blocks
from vit_rope.encodings.generators.comrope import ComRoPE
from vit_rope.layers.attention import RoPEAttention
from vit_rope.layers.paired_rotation import RotatePaired, paired_projection, project_rotate_paired

DIM, HEADS, BLOCK = 32, 2, 4  # head width 16: 4 blocks of 4


def attention(**kwargs) -> RoPEAttention:
    torch.manual_seed(0)
    attn = RoPEAttention(DIM, num_heads=HEADS, qkv_bias=True, **kwargs).double()
    with torch.no_grad():
        attn.qkv.bias.normal_()
    return attn


def rotations(tokens: int) -> torch.Tensor:
    """Orthogonal ``[N, nh, m, b, b]`` blocks, token-major."""
    skew = torch.randn(tokens, HEADS, DIM // HEADS // BLOCK, BLOCK, BLOCK, dtype=torch.float64)
    return torch.linalg.matrix_exp(skew - skew.mT)


def plain(attn: RoPEAttention, x: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """timm's projection, then each block turned by its matrix (``rotate_blocks``, head-major table)."""
    q, k, v = attn.qkv(x).unflatten(-1, (3, HEADS, DIM // HEADS)).permute(2, 0, 3, 1, 4).unbind(0)
    head_major = table.transpose(0, 1)[None]  # [1, nh, N, m, b, b]
    return rotate_blocks(q, head_major), rotate_blocks(k, head_major), v


def test_paired_projection_is_the_projection_with_q_and_k_blocks_alternating():
    attn = attention()
    x = torch.randn(3, 5, DIM, dtype=torch.float64)
    qk, v = paired_projection(attn, x, BLOCK)  # [B, N, nh, m, 2, b], [B, nh, N, D]
    q, k, v_plain = attn.qkv(x).unflatten(-1, (3, HEADS, DIM // HEADS)).unbind(2)  # [B, N, nh, D] each
    torch.testing.assert_close(qk[..., 0, :].flatten(-2), q, rtol=0, atol=1e-12)
    torch.testing.assert_close(qk[..., 1, :].flatten(-2), k, rtol=0, atol=1e-12)
    torch.testing.assert_close(v, v_plain.transpose(1, 2), rtol=0, atol=1e-12)


def test_rotation_from_the_paired_projection_equals_projection_then_rotation_with_every_gradient():
    attn = attention()
    x = torch.randn(3, 5, DIM, dtype=torch.float64, requires_grad=True)
    table = rotations(5).requires_grad_(True)
    weights = torch.randn(3, 3, HEADS, 5, DIM // HEADS, dtype=torch.float64)
    outputs, grads = [], []
    for path in (project_rotate_paired, plain):
        out = path(attn, x, table)
        loss = sum((o * w).sum() for o, w in zip(out, weights, strict=True))
        outputs.append(out)
        grads.append(torch.autograd.grad(loss, (x, table, attn.qkv.weight, attn.qkv.bias)))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-11)
    assert all(out.stride(-1) == 1 for out in outputs[0])  # channels of stride 1: SDPA's fused kernels take them


def test_rotate_paired_gradcheck():
    qk = torch.randn(2, 3, HEADS, 2, 2, BLOCK, dtype=torch.float64, requires_grad=True)
    table = torch.randn(3, HEADS, 2, BLOCK, BLOCK, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(RotatePaired.apply, (qk, table))


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_comrope_per_axis_rotations_from_the_paired_projection_equal_the_per_axis_products(kind: str):
    """A batch of ``PAIRED_MIN_BATCH`` images takes the per-cell table from the per-axis ones (AP: each block its one
    axis; LD: both), prefix tokens included: values and gradients of the generators, the projection and the input
    equal those of ``rotate_axes``; a smaller batch keeps ``rotate_axes``."""
    torch.manual_seed(0)
    attn = attention()
    encoding = ComRoPE(kind, 1, HEADS, DIM // HEADS, (4, 4), block_size=BLOCK).double()
    positions = image_positions(encoding, 3, 4)
    x = torch.randn(PAIRED_MIN_BATCH, 2 + 12, DIM, dtype=torch.float64, requires_grad=True)
    results = []
    for paired in (True, False):
        block = encoding.block_inputs(positions, 2)[0]
        assert isinstance(block, AxisRotations)
        if paired:
            q, k, v = block.project(attn, x)
        else:
            q, k, v = block.transform(attn, x, *attention_qkv(attn, x))
        loss = (q * k.flip(0)).sum() + (k * v).sum()
        wrt = (x, attn.qkv.weight, attn.qkv.bias, *encoding.parameters())
        results.append(((q, k, v), torch.autograd.grad(loss, wrt)))
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-5)  # the tables are fp32 (as the encoding's)
    assert block.project(attn, x[: PAIRED_MIN_BATCH - 1]) is None


def attention_qkv(attn: RoPEAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return attn.qkv(x).unflatten(-1, (3, HEADS, DIM // HEADS)).permute(2, 0, 3, 1, 4).unbind(0)


def test_an_attention_with_qk_norms_or_a_hooked_projection_keeps_the_per_axis_products(monkeypatch):
    """The paired projection replaces the qkv projection: where q/k norms follow it or a hook watches it, the
    attention projects as usual and the rotations follow (``transform``)."""
    monkeypatch.setattr(axis_rotation, "PAIRED_MIN_BATCH", 1)
    encoding = ComRoPE("comrope_ld", 1, HEADS, DIM // HEADS, (4, 4), block_size=BLOCK).double()
    block = encoding.block_inputs(image_positions(encoding, 2, 2), 0)[0]
    x = torch.randn(2, 4, DIM, dtype=torch.float64)
    assert block.project(attention(), x) is not None
    assert block.project(attention(qk_norm=True, norm_layer=torch.nn.LayerNorm), x) is None
    hooked = attention()
    hooked.qkv.register_forward_hook(lambda module, args, out: None)
    assert block.project(hooked, x) is None
    backward_hooked = attention()  # a backward hook must see the projection's gradient in training
    backward_hooked.qkv.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    assert block.project(backward_hooked, x) is None
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    try:  # hooks for every module
        assert block.project(attention(), x) is None
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_a_comrope_model_trains_alike_on_either_path(kind: str, monkeypatch):
    """A ViT's training step (logits, every parameter's gradient) with a batch that takes the paired path equals the
    same step on the per-axis products."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", depth=2, img_size=64, num_classes=3)
    randomize_(model)  # a fresh ViT's attention barely moves its logits
    model = model.double().train()
    x = torch.randn(PAIRED_MIN_BATCH, 3, 64, 48, dtype=torch.float64)
    tokens = torch.randn(PAIRED_MIN_BATCH, 1 + 12, model.embed_dim, dtype=torch.float64)
    block = model.pos_encoding.block_inputs(image_positions(model.pos_encoding, 4, 3), 1)[0]
    assert block.project(model.blocks[0].attn, tokens) is not None  # the paired path is the one taken

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logits = model(x)
        logits.square().sum().backward()
        return logits, [p.grad.clone() for p in model.parameters()]

    paired = step()
    monkeypatch.setattr(axis_rotation, "PAIRED_MIN_BATCH", PAIRED_MIN_BATCH + 1)
    per_axis = step()
    torch.testing.assert_close(paired[0], per_axis[0], rtol=1e-6, atol=1e-6)
    for grad, expected in zip(paired[1], per_axis[1], strict=True):  # fp32 tables: to 1e-5 of each gradient's size
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
