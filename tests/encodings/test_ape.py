"""The +APE models' absolute position embedding from checkpoints: the source grid a state dict does not record, read
back exactly for the same model (square or not) and resampled for another grid, as timm resamples it."""

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed

import vit_rope  # noqa: F401  (registers the models)
from vit_rope.encodings.ape import fit_checkpoint_pos_embed, source_grids
from vit_rope.models.checkpoint import WeightsNotLoadedWarning, load_weights


@pytest.mark.parametrize(("rows", "grid", "prefix", "expected"), [
    (24, (4, 6), 0, [(0, (4, 6))]),  # the same non-square model
    (96, (4, 6), 0, [(0, (8, 12))]),  # a proportional size
    (197, (4, 6), 0, [(1, (14, 14))]),  # timm's square ViT, class token row included
    (196, (7, 7), 0, [(0, (14, 14))]),  # DeiT-III / RoPE-ViT: patch rows only
    (29, (4, 6), 5, [(5, (4, 6))]),  # class and register tokens with their rows
    (129, (4, 8), 0, [(1, (8, 16))]),  # a non-square timm ViT with a class token row
    # aspect ratios whose sides multiply to a square: the square reading first, as timm's checkpoints are square
    (577, (9, 16), 0, [(1, (24, 24)), (1, (18, 32))]),  # timm's ViT-B/16 at 384 px into a 16:9 model
    (50, (14, 28), 0, [(1, (7, 7)), (0, (5, 10))]),  # timm's ViT-B/32 at 224 px into a 1:2 model
    (196, (8, 32), 0, [(0, (14, 14)), (0, (7, 28))]),  # DeiT-III at 224 px into a 1:4 model
])
def test_source_grids_lists_square_readings_first(rows, grid, prefix, expected):
    assert source_grids(rows, grid, prefix) == expected


def test_a_length_that_fits_no_grid_is_an_error_naming_the_rows():
    model = ape_model((64, 96), seed=0)
    with pytest.raises(ValueError, match=r"23 rows.*4x6.*class_token, reg_tokens"):
        fit_checkpoint_pos_embed(torch.zeros(1, 23, 192), model)


def test_an_ambiguous_length_warns_naming_the_reading_taken_and_the_others():
    torch.manual_seed(0)
    square = torch.randn(1, 196, 192)  # DeiT-III's 14x14 at 224 px
    wide = ape_model((112, 448), seed=0)  # a 7x28 model: also 196 rows
    with pytest.warns(UserWarning, match=r"196 rows: read as a 7x28 grid after 0 prefix rows, though 14x14 after 0 "
                      r"prefix rows fits too"):
        taken = fit_checkpoint_pos_embed(square, wide)  # the model's own layout wins: a checkpoint of this model
    assert torch.equal(taken, square)
    tall = ape_model((128, 512), seed=0)  # 8x32: 14x14 read first, resampled
    with pytest.warns(UserWarning, match=r"read as a 14x14 grid after 0 prefix rows, though 7x28"):
        resampled = fit_checkpoint_pos_embed(square, tall)
    expected = resample_abs_pos_embed(square, new_size=[8, 32], old_size=[14, 14], num_prefix_tokens=0)
    torch.testing.assert_close(resampled, expected)


def ape_model(img_size, seed: int, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model("vit_rope_tiny_patch16_axial_ape_224", depth=1, num_classes=5, img_size=img_size,
                              **kwargs)
    torch.nn.init.normal_(model.pos_embed)  # distinct rows, so that any resampling shows
    return model


@pytest.mark.parametrize("kwargs", [{}, {"no_embed_class": False, "reg_tokens": 2}])
def test_non_square_checkpoint_loads_back_exactly(tmp_path, kwargs):
    source = ape_model((64, 96), seed=0, **kwargs)
    torch.save(source.state_dict(), tmp_path / "ape.pth")
    target = ape_model((64, 96), seed=1, **kwargs)
    assert not torch.equal(target.pos_embed, source.pos_embed)
    load_weights(target, tmp_path / "ape.pth")
    torch.testing.assert_close(target.pos_embed, source.pos_embed, atol=0, rtol=0)
    through_timm = timm.create_model("vit_rope_tiny_patch16_axial_ape_224", depth=1, num_classes=5,
                                     img_size=(64, 96), pretrained=True, **kwargs,
                                     pretrained_cfg_overlay=dict(file=str(tmp_path / "ape.pth"), num_classes=5))
    torch.testing.assert_close(through_timm.pos_embed, source.pos_embed, atol=0, rtol=0)


def test_non_square_timm_vit_is_resampled_from_its_own_grid():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=5, img_size=(128, 256))  # 8x16, class row
    torch.nn.init.normal_(vit.pos_embed)
    patches = vit.pos_embed[:, 1:]
    same, half = ape_model((128, 256), seed=1), ape_model((64, 128), seed=1)
    for model in (same, half):
        with pytest.warns(WeightsNotLoadedWarning, match="LayerScale set to the identity"):  # timm's ViT has none
            model.load_state_dict(vit_rope.convert_state_dict(vit.state_dict(), model))
    torch.testing.assert_close(same.pos_embed, patches, atol=0, rtol=0)
    expected = resample_abs_pos_embed(patches, new_size=[4, 8], old_size=[8, 16], num_prefix_tokens=0)
    torch.testing.assert_close(half.pos_embed, expected)


@pytest.mark.parametrize("kwargs", [{}, {"no_embed_class": False, "reg_tokens": 2}])
def test_set_input_size_resamples_the_table_that_the_encoding_reads(kwargs):
    """timm's ``set_input_size`` resamples ``pos_embed`` to the new grid, and the APE reads the table with that grid
    (the model's, not one of its own): a forward at the new size is the one before, bit for bit."""
    model = ape_model((32, 48), seed=0, **kwargs).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
        model.set_input_size(img_size=(64, 64))
        assert model.pos_embed.shape[1] == model.ape.num_prefix_rows + 16
        torch.testing.assert_close(model(x), before, atol=0, rtol=0)
