"""The attention-bias models (LookHere, 2D-ALiBi, FIRE) through timm and NaFlex batches: registered names, each
sample of a mixed-aspect batch equal to its image alone, logits that only offsets move (sparse and shifted coordinates
included), the bounded table cache across sizes and grad modes, the policies, and the errors for bad configurations."""

from __future__ import annotations

import pytest
import timm
import torch

from helpers.models import assert_fx_features_match_eager, assert_same_gradients, perturbed
from helpers.naflex import images, pack, samples_equal_images
from vit_rope.encodings.base import image_positions
from vit_rope.encodings.bias.attn_bias import alibi_slopes, offset_alibi
from vit_rope.encodings.bias.lookhere import PRESETS, head_plan, lookhere_penalty
from vit_rope.encodings.bias.offset_attention import scaled_offsets

BASE = dict(img_size=80, embed_dim=48, depth=2, num_heads=3, num_classes=7, init_values=0.5)
KINDS = {  # name -> (model, extra kwargs)
    "alibi": ("vit_rope_tiny_patch16_alibi_224", {}),
    "lh180": ("vit_rope_tiny_patch16_lookhere_224", {"encoding_options": {"config": "lh180"}}),
    "lh90": ("vit_rope_tiny_patch16_lookhere_224",
             {"encoding_options": {"config": "lh90"}, "num_heads": 4, "embed_dim": 32}),
    "lh45_regs": ("vit_rope_tiny_patch16_lookhere_224", {"encoding_options": {"config": "lh45"}, "reg_tokens": 2}),
    "lh_center_max": ("vit_rope_tiny_patch16_lookhere_224", {"encoding_options": {"config": dict(
        global_slope=1.0, layer_slopes=[1.0, 0.5], head_directions="center", distance="sqrt", fill_with="max")}}),
    "fire": ("vit_rope_tiny_patch16_fire_224", {"reg_tokens": 1}),
}


def build(kind: str, policy: str = "extrapolate", **kwargs) -> torch.nn.Module:
    name, extra = KINDS[kind]
    return perturbed(name, policy, **{**BASE, **extra, **kwargs})


def test_a_registered_lookhere_model_takes_the_halves_preset() -> None:  # the names at three sizes: test_models.py
    model = timm.create_model("vit_rope_small_patch16_lookhere_224", depth=1, num_classes=3)
    assert model.encoding_kind == "lookhere" and model.pos_encoding.config["head_directions"] == "halves"
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 3)


@pytest.mark.parametrize("kind,policy", [(k, "extrapolate") for k in KINDS]
                         + [("alibi", "interpolate"), ("lh45_regs", "interpolate"), ("fire", "interpolate")])
def test_each_sample_of_a_mixed_batch_equals_its_image_alone(kind: str, policy: str) -> None:
    model = build(kind, policy)
    logits, batch = samples_equal_images(model)
    with torch.no_grad():
        for blk in model.blocks:  # the explicit path is the reference of the fused one
            blk.attn.fused_attn = False
        torch.testing.assert_close(model(batch), logits, rtol=1e-5, atol=1e-5)
    assert logits.abs().max() > 0.1


# FIRE also reads the grid's size, which a NaFlex batch takes from its coordinates (tests/encodings/test_fire.py)
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "fire"])
def test_only_offsets_move_the_logits_of_sparse_shifted_samples(kind: str) -> None:
    """Prefix tokens are unbiased, so the whole output depends on offsets only (for RoPE, whose unrotated class token
    meets rotated patches, only the patch-patch logits do)."""
    model = build(kind)
    batch = pack(images())
    torch.manual_seed(2)
    batch["patch_valid"] &= torch.rand(batch["patch_valid"].shape) > 0.3  # holes: sparse grids
    shifted = {**batch, "patch_coord": batch["patch_coord"] + torch.tensor([3, 5])}  # no sample starts at (0, 0)
    moved = {**batch, "patch_coord": batch["patch_coord"].clone()}
    moved["patch_coord"][:, 0] += torch.tensor([3, 1])  # one patch of each sample 3 rows down, 1 right
    with torch.no_grad():
        logits = model(batch)
        torch.testing.assert_close(model(shifted), logits, rtol=1e-4, atol=1e-4)
        changed = (model(moved) - logits).abs().amax(-1)  # [B]
    assert (changed > 1e-4).all(), changed  # (equal ones differ by < 1e-6)


@pytest.mark.parametrize("name", ["alibi", *PRESETS])
def test_penalties_depend_on_offsets_only_even_fractional_ones(name: str) -> None:
    torch.manual_seed(3)
    positions = torch.rand(2, 9, 2) * 5  # fractional, anywhere
    shift = torch.tensor([[[2.37, -1.61]], [[-0.5, 7.25]]])

    def penalty(pos: torch.Tensor) -> torch.Tensor:
        if name == "alibi":
            return offset_alibi(scaled_offsets(pos, None), alibi_slopes(6))
        return lookhere_penalty(pos, *head_plan(PRESETS[name]["head_directions"], 6))

    before = penalty(positions)
    torch.testing.assert_close(penalty(positions + shift), before, rtol=1e-4, atol=1e-4)
    one = positions.clone()
    one[:, 4] += 0.75
    assert ((penalty(one) - before).abs().nan_to_num(1.0).amax((1, 2, 3)) > 1e-3).all()


def test_prefix_tokens_are_unbiased_and_own_rows_and_columns_are_zero() -> None:
    model = build("lh180", reg_tokens=2)
    tables = model.pos_encoding(image_positions(model.pos_encoding, 3, 4), model.num_prefix_tokens)
    P = model.num_prefix_tokens
    assert tables[0].shape == (1, 3, P + 12, P + 12)
    assert tables[0][..., :P, :].abs().max() == 0 and tables[0][..., :, :P].abs().max() == 0
    assert tables[0][0, 0].diagonal().abs().max() == 0  # a patch sees itself, unpenalised
    assert torch.isinf(tables[0][0, 0]).any()  # and "up" hides what is below


def test_cache_is_bounded_and_follows_grad_modes() -> None:
    model = build("alibi")
    for size in (48, 64, 80, 96):
        with torch.no_grad():
            model(torch.randn(1, 3, size, size))
    assert len(model.pos_encoding._cache) == model.pos_encoding.CACHE_SIZE
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        model(x)
    model.train()
    model(x).square().sum().backward()  # tables made under inference_mode are not reused for autograd
    assert model.blocks[0].attn.qkv.weight.grad is not None
    assert not any("anchor" in key or "cache" in key for key in model.state_dict())


def test_interpolate_scales_positions_to_the_training_grid_and_rope_policies_are_refused() -> None:
    model = build("alibi", "interpolate")
    with torch.no_grad():
        train = model.pos_encoding(image_positions(model.pos_encoding, 5, 5), 0)[0]
        double = model.pos_encoding(image_positions(model.pos_encoding, 10, 10), 0)[0]
    torch.testing.assert_close(double[..., 0, 1], train[..., 0, 1] / 2)  # half the step between neighbours
    assert model(torch.randn(1, 3, 160, 160)).isfinite().all()
    for policy in ("ntk", "yarn", "normalized"):  # those without meaning for a bias are refused
        with pytest.raises(ValueError, match=f"'{policy}' does not apply to alibi, an attention bias.*'extrapolate'"):
            model.set_resolution_policy(policy)


@pytest.mark.parametrize("kwargs,message", [
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, 0], head_directions="halves-sideways")}),
     "Unknown LookHere direction 'sideways'.*choose groups of none, zero"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, 0],
                                           head_directions="halves-corners-triangles-none")}, num_heads=3),
     "has 4 groups, more than num_heads=3"),
    (dict(encoding_options={"config": "lh360"}), "Unknown LookHere preset 'lh360'.*lh180, lh90, lh45"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, 0], head_directions="halves",
                                           fill="inf")}),
     r"unknown keys \['fill'\]"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, 0], head_directions="halves",
                                           distance="cosine")}),
     "distance='cosine'.*linear, sqrt, square"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, 0], head_directions=["halves"] * 3)}),
     "one per layer: got 3 for depth 2"),
    (dict(encoding_options={"config": dict(global_slope="big", layer_slopes=[1, 0], head_directions="halves")}),
     "global_slope must be a number .*got 'big'"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=0.5, head_directions="halves")}),
     r"layer_slopes must be two numbers \[first, last\].*got 0\.5"),
    (dict(encoding_options={"config": dict(global_slope=1.0, layer_slopes=[1, "x"], head_directions="halves")}),
     r"layer_slopes must be two numbers.*got \[1, 'x'\]"),
])
def test_bad_lookhere_configurations_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        timm.create_model("vit_rope_tiny_patch16_lookhere_224", **{**BASE, **kwargs})


def test_head_plans_follow_the_official_splits_and_cover_tiny() -> None:
    directions, slopes = head_plan("halves", 12)
    assert directions[:4] == (("up",), ("down",), ("left",), ("right",)) and slopes == (0.5,) * 4 + (0.25,) * 4 + (
        0.125,) * 4
    directions, slopes = head_plan("halves", 3)  # tiny: the group's directions in turn
    assert directions == (("up",), ("down",), ("left",)) and slopes == (0.5,) * 3
    directions, _ = head_plan("eighths1-eighths2", 6)  # official: 4 + 2
    assert directions[4:] == (("tri_up", "right"), ("tri_down", "right"))
    directions, _ = head_plan("eighths1-eighths2", 3)  # ours: 2 + 1
    assert directions == (("tri_up", "left"), ("tri_down", "left"), ("tri_up", "right"))


def test_forward_intermediates_and_features_only() -> None:
    model = build("lh90")
    maps = model.forward_intermediates(torch.randn(1, 3, 48, 80), indices=2, intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(1, 32, 3, 5)] * 2
    backbone = timm.create_model("vit_rope_tiny_patch16_alibi_224", features_only=True, depth=2, out_indices=(1,))
    assert backbone(torch.randn(1, 3, 64, 48))[0].shape == (1, 192, 4, 3)


@pytest.mark.parametrize("kind", ["alibi", "lh45_regs"])
def test_fx_feature_extraction_with_timms_tracer_options(kind: str) -> None:
    """timm's tracer keeps ``AttnBias`` whole (a leaf), so the traced graph calls it with the real grid."""
    assert_fx_features_match_eager(build(kind))


def test_compiled_model_equals_eager_on_images_and_naflex_batches_with_gradients() -> None:
    """torch.compile gives the eager logits on images and on a NaFlex batch, and a training step's gradients at
    another size (a graph of its own). ``aot_eager``: the traced graphs hold what a bias kind adds (inductor's code
    generation is other tests'); one block, whose graph every block shares; LookHere, whose ``AttnBias`` serves
    ALiBi too."""
    model = build("lh90", depth=1)
    compiled = torch.compile(model, dynamic=False, backend="aot_eager")
    with torch.no_grad():
        x = torch.randn(2, 3, 80, 80)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        batch = pack(images())
        torch.testing.assert_close(compiled(batch), model(batch), rtol=1e-4, atol=1e-4)
    assert_same_gradients(model, compiled, model, torch.randn(2, 3, 96, 96))
