"""DINOv3's RoPE (vit_rope.encodings.rope.dinov3_rope, RoPE2D kind "dinov3") held to timm's RotaryEmbeddingDinoV3 by
value."""

import itertools
import math

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, _apply_coord_augs, _build_grid, apply_rot_embed_cat

from vit_rope.encodings.base import image_coords
from vit_rope.encodings.policies import CoordAugment, augment_positions
from vit_rope.encodings.rope.dinov3_rope import qk_permutation
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.layers.rotary import apply_rope, rope_angles

D, HEADS = 64, 3
GRIDS = [(14, 14), (10, 17), (24, 9)]
OPTIONS = list(itertools.product(["separate", "min", "max"], [(None, None), (0.5, 80.0)]))


def ours(grid, normalize="separate", periods=(None, None), train_grid=(14, 14), **kwargs) -> RoPE2D:
    return RoPE2D(D, HEADS, "dinov3", train_grid=train_grid, min_period=periods[0], max_period=periods[1],
                  normalize_coords=normalize, **kwargs)


def placed(rope: RoPE2D, grid: tuple[int, int]) -> torch.Tensor:
    """Positions ``[N, 2]`` of an image batch's ``grid`` as ``rope`` places them."""
    return rope.place(*image_coords(*grid))


def timm_rope(normalize="separate", periods=(None, None)) -> RotaryEmbeddingDinoV3:
    return RotaryEmbeddingDinoV3(D, temperature=100, min_period=periods[0], max_period=periods[1],
                                 normalize_coords=normalize)


@pytest.mark.parametrize(("normalize", "periods"), OPTIONS)
@pytest.mark.parametrize("grid", GRIDS)
def test_rotated_queries_and_angles_match_timm(grid, normalize, periods):
    theirs = timm_rope(normalize, periods).get_embed(list(grid))  # [N, 2D]: sin, cos in rotate-half layout
    rope, (coord, grids) = ours(grid, normalize, periods), image_coords(*grid)
    cos, sin = rope(rope.place(coord, grids), 0, grids)  # [1, N, D/2]: an image batch's, as the model builds them
    index = qk_permutation("rotate_half", D)
    q = torch.randn(2, HEADS, grid[0] * grid[1], D)
    expected = apply_rot_embed_cat(q, theirs, half=True)
    torch.testing.assert_close(apply_rope(q[..., index], cos, sin), expected[..., index], atol=1e-5, rtol=1e-5)
    # the angles themselves: timm's pair i is our pair (i + D/4) mod D/2
    their_angles = torch.atan2(theirs[:, : D // 2], theirs[:, D:D + D // 2])  # [N, D/2]
    our_angles = torch.atan2(sin[0], cos[0])[:, (torch.arange(D // 2) - D // 4) % (D // 2)]
    torch.testing.assert_close(torch.remainder(our_angles - their_angles + math.pi, 2 * math.pi) - math.pi,
                               torch.zeros_like(our_angles), atol=1e-5, rtol=0)


def test_positions_are_timms_centred_grid_in_x_y_order():
    for grid, normalize in itertools.product(GRIDS, ["separate", "min", "max"]):
        timm_grid = _build_grid(list(grid), grid_type="centered", normalize_coords=normalize).flatten(0, 1)  # (y, x)
        torch.testing.assert_close(placed(ours(grid, normalize), grid), timm_grid.flip(-1))


def test_the_rotate_half_permutation_is_a_permutation_pairing_halves():
    index = qk_permutation("rotate_half", D)
    assert sorted(index.tolist()) == list(range(D))
    assert torch.equal(index[1::2] - index[0::2], torch.full((D // 2,), D // 2))  # our pair = their (c, c + D/2)


def test_batch_coordinate_draw_repeats_timm_under_the_same_random_state():
    grid = (10, 17)
    coords = _build_grid(list(grid), grid_type="centered").flatten(0, 1)  # (y, x)
    aug = CoordAugment(shift=0.3, jitter=1.4, rescale=2.0, per_image=False)
    torch.manual_seed(7)
    expected = _apply_coord_augs(coords, 0.3, 1.4, 2.0).flip(-1)
    torch.manual_seed(7)
    got = augment_positions(placed(ours(grid), grid), 4, aug)
    assert got.shape == (grid[0] * grid[1], 2)  # one transform for the batch, as DINOv3
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_policies_for_normalised_coordinates():
    rope = ours((14, 14))
    assert rope.policy.name == "normalized"  # DINOv3's own
    torch.testing.assert_close(placed(rope, (28, 28)).abs().max(), torch.tensor(1 - 1 / 28))
    rope.policy = "extrapolate"  # the training step between patches: a 2x grid reaches twice as far
    torch.testing.assert_close(placed(rope, (28, 28)).amax() - placed(rope, (28, 28)).amin(), torch.tensor(2 * 27 / 14))
    torch.testing.assert_close(placed(rope, (14, 14)), placed(ours((14, 14)), (14, 14)))
    for name in ("interpolate", "ntk", "yarn"):
        with pytest.raises(ValueError, match=rf"{name}.*does not apply to DINOv3.*'normalized'.*'extrapolate'"):
            rope.policy = name


def test_fixed_frequencies_are_never_saved():
    rope = ours((14, 14))
    assert not list(rope.parameters()) and not rope.state_dict()  # rebuilt, never saved
    assert rope_angles(torch.zeros(1, 2), rope.freqs).abs().max() == 0


def test_bad_options_name_their_values():
    with pytest.raises(ValueError, match="normalisation 'mean'"):
        ours((14, 14), normalize="mean")
    with pytest.raises(ValueError, match="both min_period and max_period"):
        ours((14, 14), periods=(1.0, None))
    with pytest.raises(ValueError, match="0 < min_period <= max_period"):
        ours((14, 14), periods=(5.0, 1.0))
