"""FIRE (``vit_rope.encodings.bias.fire``) by its definition: biases of offsets only on a given grid, inputs of its
MLPs within [-1, 1] on any grid (progressive interpolation), ``interpolate`` placing a larger grid's offsets where the
training grid's are, the two paths (table per offset, dense from positions) equal, and the policies it refuses."""

from __future__ import annotations

import pytest
import timm
import torch

from vit_rope.encodings.base import Positions, image_coords
from vit_rope.encodings.bias.fire import Fire
from vit_rope.encodings.bias.offset_attention import dense_bias


def fire(policy: str = "extrapolate") -> Fire:
    torch.manual_seed(0)
    encoding = Fire(num_heads=3, depth=2, train_grid=(6, 6), policy=policy)
    with torch.no_grad():
        encoding.log_scale.copy_(torch.tensor([0.7, 1.9]))
    return encoding


def positions(h: int, w: int, shift: tuple[float, float] = (0.0, 0.0)) -> Positions:
    coord, grids = image_coords(h, w)
    return Positions(coord.flip(-1).float() + torch.tensor(shift), grids, None)


@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
def test_the_bias_of_a_grid_depends_on_offsets_only(policy: str) -> None:
    encoding = fire(policy)
    for a, b in zip(encoding(positions(5, 7)), encoding(positions(5, 7, (3.0, -11.0))), strict=True):
        torch.testing.assert_close(a, b)
    bias = encoding(positions(5, 7))[1][0]  # [H, N, N]
    grid = torch.arange(35).reshape(5, 7)
    torch.testing.assert_close(bias[:, grid[0, 0], grid[1, 2]], bias[:, grid[3, 4], grid[4, 6]])  # one offset, twice


def test_mlp_inputs_stay_in_the_trained_range_on_any_grid() -> None:
    encoding, seen = fire(), []
    encoding.mlps[0].register_forward_hook(lambda module, args, out: seen.append(args[0].abs().max()))
    for grid in [(6, 6), (12, 12), (64, 40), (1, 3)]:
        encoding._offset_tables(grid)
    assert all(0 < value <= 1 for value in seen), seen


def test_interpolate_places_a_larger_grid_where_the_training_grid_is() -> None:
    """At twice the training grid, ``interpolate`` gives offset 2d the bias that offset d has in training;
    ``extrapolate`` (FIRE's own normalisation) does not, and both are the same at the training grid."""
    train = fire("interpolate")._offset_tables((6, 6))[0]  # [H, 11, 11]: offsets -5..5
    double = fire("interpolate")._offset_tables((12, 12))[0]  # offsets -11..11
    torch.testing.assert_close(double[:, 1::2, 1::2], train)
    assert not torch.allclose(fire("extrapolate")._offset_tables((12, 12))[0][:, 1::2, 1::2], train)
    torch.testing.assert_close(fire("extrapolate")._offset_tables((6, 6))[0], train)


@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
def test_the_table_per_offset_is_the_dense_bias_of_the_positions(policy: str) -> None:
    encoding = fire(policy)
    for h, w in [(6, 6), (4, 9)]:
        dense = encoding(positions(h, w), 2)
        for table, expected in zip(encoding._offset_tables((h, w)), dense, strict=True):
            torch.testing.assert_close(dense_bias(table, (h, w), 2)[None], expected)


@pytest.mark.parametrize("policy", ["ntk", "yarn", "normalized"])
def test_rope_policies_are_refused_by_name(policy: str) -> None:
    model = timm.create_model("vit_rope_tiny_patch16_fire_224", depth=1, num_classes=3)
    with pytest.raises(ValueError, match=f"Policy '{policy}' does not apply to FIRE"):
        model.set_resolution_policy(policy)


def test_fire_models_are_registered_and_learn_their_bias() -> None:
    names = set(timm.list_models("vit_rope_*_fire_224"))
    assert names == {f"vit_rope_{size}_patch16_fire_224" for size in ("tiny", "small", "base")}
    model = timm.create_model("vit_rope_tiny_patch16_fire_224", depth=2, num_classes=3, dynamic_img_size=True)
    model(torch.randn(2, 3, 64, 96)).sum().backward()
    grads = {name: p.grad for name, p in model.pos_encoding.named_parameters()}
    assert set(grads) >= {"mlps.0.fc1.weight", "mlps.1.fc2.bias", "log_scale", "threshold"}
    assert all(g is not None for name, g in grads.items() if name != "threshold")  # tau is below these grids
