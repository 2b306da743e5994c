"""Resolution policies and coordinate augmentation: identities at the training size, known special cases."""

import math

import pytest
import timm
import torch
from timm.layers.pos_embed_sincos import build_rotary_pos_embed

import vit_rope  # noqa: F401  (registers the models)
from vit_rope.encodings.base import image_coords
from vit_rope.encodings.policies import POLICIES, CoordAugment, ResolutionPolicy, augment_positions, policy_frequencies
from vit_rope.encodings.rope.tables import RoPE2D, axial_frequencies
from vit_rope.layers.rotary import apply_rope

D, NH, TRAIN = 16, 2, (6, 8)


def tables(rope: RoPE2D, grid: tuple[int, int], shift: float = 0.0, num_prefix_tokens: int = 1):
    """The tables of an image batch on ``grid``, as the model builds them, with every position moved by ``shift``."""
    coord, grids = image_coords(*grid)
    return rope(rope.place(coord, grids) + shift, num_prefix_tokens, grids)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "normalized"])
def test_every_policy_gives_training_tables_at_training_size(kind, policy):
    torch.manual_seed(0)
    rope = RoPE2D(D, NH, kind, train_grid=TRAIN)
    reference = tables(rope, TRAIN)
    rope.policy = ResolutionPolicy(policy)
    for got, ref in zip(tables(rope, TRAIN), reference, strict=True):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("policy", POLICIES)
def test_relative_position_invariance_holds_inside_a_grid(kind, policy):
    torch.manual_seed(0)
    rope = RoPE2D(D, NH, kind, train_grid=TRAIN, policy=policy)
    q, k = torch.randn(2, 1, NH, 1 + 12 * 10, D).unbind(0)
    grid = (12, 10)

    def scores(shift):
        cos, sin = tables(rope, grid, shift)
        return (apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-2, -1))[..., 1:, 1:]  # patch pairs

    torch.testing.assert_close(scores(torch.tensor([3.0, -7.5])), scores(0.0), atol=5e-4, rtol=1e-4)


def test_interpolate_matches_timm_ref_feat_shape():
    """EVA-02 / timm: positions t -> t / size * ref_size."""
    grid = (9, 13)
    rope = RoPE2D(64, 1, "axial", train_grid=TRAIN, policy="interpolate")
    cos, sin = tables(rope, grid, num_prefix_tokens=0)
    timm_sin, timm_cos = build_rotary_pos_embed(
        list(grid), dim=64, temperature=100.0, in_pixels=False, ref_feat_shape=list(TRAIN), grid_indexing="xy"
    )
    # timm repeats each pair's value for its two channels; ours has one per pair
    torch.testing.assert_close(cos[0].repeat_interleave(2, -1), timm_cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(sin[0].repeat_interleave(2, -1), timm_sin, atol=1e-5, rtol=0)


def test_ntk_is_a_larger_base_per_axis():
    rope = RoPE2D(D, NH, "axial", theta=100.0, train_grid=TRAIN, policy="ntk")
    s, d = 2.0, D // 2
    freqs = rope.freqs
    scaled, temperature = policy_frequencies(freqs, torch.tensor([[TRAIN[0], TRAIN[1] * 2]]), TRAIN,
                                             rope.resolution, 100.0, D)
    scaled = scaled[0]  # the one grid's
    expected_x = axial_frequencies(D, 100.0 * s ** (d / (d - 2)))[0]
    torch.testing.assert_close(scaled[0], expected_x)  # x grew by 2: new base on the x pairs
    torch.testing.assert_close(scaled[1], freqs[1])  # y did not grow: unchanged
    assert temperature is None  # no attention temperature
    lowest = D // 4 - 1
    torch.testing.assert_close(scaled[0, 0, lowest], freqs[0, 0, lowest] / s)  # lowest frequency fully interpolated


def test_yarn_ramps_between_interpolation_and_extrapolation():
    policy = ResolutionPolicy("yarn", yarn_alpha=0.5, yarn_beta=2.0)
    rope = RoPE2D(64, 1, "axial", train_grid=(14, 14), policy=policy)
    scaled, temperature = policy_frequencies(rope.freqs, torch.tensor([[28, 28]]), (14, 14), policy, 100.0, 64)
    scaled = scaled[0]  # the one grid's
    turns = 14 * rope.freqs[0, 0, :16] / (2 * math.pi)
    ratio = scaled[0, 0, :16] / rope.freqs[0, 0, :16]
    assert torch.allclose(ratio[turns >= 2.0], torch.tensor(1.0))  # many turns seen: extrapolate
    assert torch.allclose(ratio[turns <= 0.5], torch.tensor(0.5))  # under half a turn: interpolate
    middle = (turns > 0.5) & (turns < 2.0)
    assert middle.any() and ((ratio[middle] > 0.5) & (ratio[middle] < 1.0)).all()
    assert temperature.item() == pytest.approx(0.1 * math.log(2.0) + 1.0)


def test_normalized_axial_is_dinov3_rope():
    """DINOv3: coords in [-1, 1] (cell centres), angle = 2 pi c / period_k, period_k = 100 ** (2k / (D/2))."""
    rope = RoPE2D(D, 1, "axial", theta=100.0, policy="normalized")
    grid = (4, 6)
    pos = rope.place(*image_coords(*grid))
    cos, _ = rope(pos)
    c = (torch.arange(6) + 0.5) / 6 * 2 - 1  # x of the first row
    periods = 100.0 ** (2 * torch.arange(D // 4) / (D // 2))
    expected = torch.cos(2 * math.pi * c[:, None] / periods)  # [6, D/4]
    torch.testing.assert_close(cos[0, :6, : D // 4], expected, atol=1e-5, rtol=0)
    assert pos.abs().max() <= 2 * math.pi


def test_policy_on_a_built_model():
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=2, num_classes=3, img_size=64,
                              init_values=1.0).eval()
    small, large = torch.randn(1, 3, 64, 64), torch.randn(1, 3, 128, 96)
    with torch.no_grad():
        base_small, base_large = model(small), model(large)
        model.set_resolution_policy("interpolate")
        assert model.resolution_policy.name == "interpolate"
        torch.testing.assert_close(model(small), base_small)
        assert (model(large) - base_large).abs().max() > 1e-4
    with pytest.raises(ValueError, match="extrapolate, interpolate, ntk, yarn, normalized"):
        model.set_resolution_policy("stretch")
    mixed = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=2,
                              resolution_policy={"name": "yarn", "yarn_beta": 4})
    assert all(r.policy.yarn_beta == 4 for r in mixed.pos_encoding)


def test_coordinate_augmentation_only_in_training():
    aug = dict(shift=2.0, jitter=1.5, rescale=2.0, subpixel=0.25)
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1, num_classes=3, rope_coord_aug=aug)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
        positions = model._embed(x).positions.coords
        assert positions.shape == (4, 2)  # eval: the plain grid, one set of positions (and tables) for the batch
        model.train()
        positions = model._embed(x).positions.coords
    assert positions.shape == (2, 4, 2) and not torch.equal(positions[0], positions[1])  # one draw per image


def test_augmentation_draw_statistics():
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    n = 4000
    shifted = augment_positions(pos, n, CoordAugment(shift=2.0), generator=g)
    offsets = shifted[:, 0]  # the position (0, 0) moves by the shift itself
    assert offsets.abs().max() <= 2.0 and offsets.mean(0).abs().max() < 0.1
    assert offsets.std(0).sub(2.0 / math.sqrt(3)).abs().max() < 0.05  # uniform on [-2, 2]
    torch.testing.assert_close(shifted[:, 1] - shifted[:, 0], pos[1].expand(n, 2))  # same shift for the whole image

    jittered = augment_positions(pos, n, CoordAugment(jitter=2.0), generator=g)
    log_scale = jittered[:, 1, 0].log()  # x of (1, 0) is the x scale
    assert log_scale.abs().max() <= math.log(2.0) + 1e-6 and log_scale.mean().abs() < 0.03
    assert not torch.allclose(jittered[:, 1, 0], jittered[:, 2, 1])  # per-axis scales differ

    rescaled = augment_positions(pos, n, CoordAugment(rescale=3.0), generator=g)
    torch.testing.assert_close(rescaled[:, 1, 0], rescaled[:, 2, 1])  # one scale shared by both axes
    log_scale = rescaled[:, 1, 0].log()  # log-uniform on [-ln 3, ln 3], as DINOv3 draws it
    assert log_scale.abs().max() <= math.log(3.0) + 1e-6 and abs(log_scale.var() - math.log(3.0) ** 2 / 3) < 0.03

    noisy = augment_positions(pos, n, CoordAugment(subpixel=0.25), generator=g)
    assert (noisy - pos).abs().max() <= 0.25 and (noisy[:, 1] - noisy[:, 0]).std() > 0.05  # per patch


def test_bad_options():
    with pytest.raises(ValueError, match="yarn_alpha < yarn_beta"):
        ResolutionPolicy("yarn", yarn_alpha=3.0, yarn_beta=2.0)
    with pytest.raises(ValueError, match="Unknown RoPE policy options"):
        ResolutionPolicy.create({"name": "ntk", "alpha": 1})
    with pytest.raises(ValueError, match="jitter >= 1"):
        CoordAugment(jitter=0.5)
