"""Diagnostics: frequency coverage, attention entropy and the directions plot, on tiny models; the position ablation:
without its encoding every kind sees its patches as a set."""

import json
import math

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vit_rope  # noqa: F401  (registers the models)
from helpers.evaluation import ROPE, write_checkpoint
from helpers.models import perturbed
from helpers.naflex import pack
from vit_rope.eval.diagnostics import (
    attention_entropy,
    budget_coverage,
    frequency_coverage,
    main,
    position_reliance,
    without_positions,
)


def test_frequency_coverage_counts_channels_with_unseen_phases():
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=2, img_size=64)  # 4x4 training grid
    at_train = frequency_coverage(model, (4, 4))
    assert len(at_train) == 1 and at_train[0]["unseen"] == 0  # axial: one table for all layers
    larger = frequency_coverage(model, (16, 16))[0]
    train_turns = torch.tensor(larger["train_turns"])
    # with theta = 100 on a 4-wide grid, the low-frequency pairs never complete a turn: they meet new phases
    assert larger["unseen"] == int((train_turns < 1).sum()) > 0
    target_turns = torch.tensor(larger["target_turns"])
    torch.testing.assert_close(target_turns, train_turns * 15 / 3)  # extrapolate: the range grows with the grid
    model.set_resolution_policy("interpolate")
    interpolated = frequency_coverage(model, (16, 16))[0]
    torch.testing.assert_close(torch.tensor(interpolated["target_turns"]), train_turns * 3.75 / 3)  # in [0, 3.75]
    assert interpolated["unseen"] == 0  # 0.75 beyond the training range: less than one training step
    mixed = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=3, img_size=64)
    assert len(frequency_coverage(mixed, (8, 8))) == 3  # one row per layer


def test_attention_entropy_is_bounded_by_uniform():
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=2, img_size=32)
    images = torch.randn(2, 3, 64, 48)
    entropy = attention_entropy(model, images)
    assert len(entropy) == 2
    n_tokens = 1 + 4 * 3
    assert all(0 < e <= math.log(n_tokens) + 1e-5 for e in entropy)
    assert not any(blk.attn._forward_pre_hooks for blk in model.blocks)  # hooks removed


def test_cli_writes_report_and_plot(tmp_path, capsys):
    weights = tmp_path / "w.pth"
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=2, num_classes=3)
    torch.save(model.state_dict(), weights)
    argv = ["--model", "vit_rope_tiny_patch16_mixed_224", "--pretrained-file", str(weights), "--sizes", "32", "64",
            "--num-images", "2", "--output", str(tmp_path / "out"), "--model-kwargs", "depth=2", "num_classes=3"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "diagnostics.json").read_text())
    assert set(report["sizes"]) == {"32", "64"} and len(report["sizes"]["64"]["entropy"]) == 2
    assert (tmp_path / "out" / "rope_directions.png").stat().st_size > 1000
    # diagnosed without its classifier: how far its pooled features move without positions, no top-1 to keep
    assert set(report["sizes"]["64"]["without_positions"]) == {"output_change"}
    assert report["sizes"]["64"]["without_positions"]["output_change"] > 0
    assert "outputs move" in capsys.readouterr().out
    assert report["model"] == f"vit_rope_tiny_patch16_mixed_224 (depth=2) ({weights})"  # num_classes: no architecture
    assert main(argv[:5] + ["40"] + argv[7:]) == 2
    assert capsys.readouterr().err == ("error: --sizes entry 40 is not a positive multiple of the patch size 16 of "
                                       f"vit_rope_tiny_patch16_mixed_224 (depth=2) ({weights}): use 32 or 48\n")
    # evaluate's names of the same options are taken too
    same = ["--img-sizes" if arg == "--sizes" else "--limit" if arg == "--num-images" else arg for arg in argv]
    assert main([*same[:-4], str(tmp_path / "again"), *same[-3:]]) == 0
    assert json.loads((tmp_path / "again" / "diagnostics.json").read_text())["sizes"].keys() == {"32", "64"}


def test_policy_option_diagnoses_under_another_resolution_policy(tmp_path, capsys):
    argv = ["--model", ROPE, "--random-init", "--model-kwargs", "depth=1", "img_size=32", "--sizes", "32", "128",
            "--num-images", "1"]
    turns = {}
    for policy in ("extrapolate", "interpolate"):
        assert main([*argv, "--policy", policy, "--output", str(tmp_path / policy)]) == 0
        report = json.loads((tmp_path / policy / "diagnostics.json").read_text())
        assert report["policy"] == policy and f"policy {policy}" in capsys.readouterr().out
        turns[policy] = torch.tensor(report["sizes"]["128"]["coverage"][0]["target_turns"])
    # on an 8x8 grid of a 2x2-trained model, interpolate keeps positions within 1.75 patches, extrapolate spans 7
    torch.testing.assert_close(turns["interpolate"] * 7 / 1.75, turns["extrapolate"])
    dinov3 = ["--model", "vit_rope_small_patch16_dinov3", "--random-init", "--model-kwargs", "depth=1", "--sizes", "32",
              "--num-images", "1", "--policy", "yarn", "--output", str(tmp_path / "dinov3")]
    assert main(dinov3) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --policy yarn: RoPE policy 'yarn' does not apply to DINOv3's RoPE") and \
        err.count("\n") == 1 and not (tmp_path / "dinov3").exists()


def test_a_model_without_weights_needs_random_init_and_is_labelled(tmp_path, capsys):
    argv = ["--model", ROPE, "--model-kwargs", "depth=1", "--sizes", "32", "--num-images", "1", "--output",
            str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model {ROPE} has no weights") and "--random-init" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert main([*argv, "--random-init"]) == 0
    assert capsys.readouterr().out.startswith(f"{ROPE} (depth=1, random init): RoPE mixed")
    assert json.loads((tmp_path / "out" / "diagnostics.json").read_text())["model"] == f"{ROPE} (depth=1, random init)"


@pytest.mark.parametrize("case, message", [
    ("zero_size", "error: --sizes entry 0 is not a positive multiple of the patch size 16 of"),
    ("no_images", "error: --num-images 0 must be > 0"),
    ("missing_dir", "missing does not exist; pass an ImageFolder root"),
    ("no_val", "val does not exist; the data dir needs val/ with one folder per class; it has test/: set "
               "--split=test to use that"),
    ("not_rope", "vit_tiny_patch16_224 (depth=1, random init) is a VisionTransformer, not a vit_rope model"),
])
def test_bad_input_is_one_error_line_before_any_work(case, message, image_root, tmp_path, capsys):
    weights = tmp_path / "w.pth"
    torch.save(timm.create_model(ROPE, depth=1).state_dict(), weights)
    model = ["--model", "vit_tiny_patch16_224", "--random-init"] if case == "not_rope" else [
        "--model", ROPE, "--pretrained-file", str(weights)]
    if case == "no_val":
        (image_root / "val").rename(image_root / "test")
    argv = [*model, "--model-kwargs", "depth=1", "--sizes", "0" if case == "zero_size" else "32", "--num-images",
            "0" if case == "no_images" else "1", "--data-dir", str(tmp_path / "missing" if case == "missing_dir"
                                                                   else image_root), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_images_come_from_the_val_split_of_the_checkpoint_or_the_option(image_root, tmp_path, capsys):
    (image_root / "val").rename(image_root / "test")
    checkpoint = write_checkpoint(tmp_path / "best.pth", val_split="test")
    argv = ["--sizes", "32", "--num-images", "3", "--data-dir", str(image_root), "--output", str(tmp_path / "out")]
    assert main(["--checkpoint", str(checkpoint), *argv]) == 0  # the run validated on test/: so does diagnose
    measured = json.loads((tmp_path / "out" / "diagnostics.json").read_text())["sizes"]["32"]
    from_split = measured["entropy"]
    # a classifier: the share of the 3 images whose top-1 class survives without positions
    kept = measured["without_positions"]["predictions_kept"]
    assert 0 <= kept <= 1 and kept * 3 == pytest.approx(round(kept * 3))
    assert "top-1" in capsys.readouterr().out
    assert main(["--checkpoint", str(checkpoint), *argv[:-1], str(tmp_path / "noise")]) == 0
    (image_root / "test").rename(image_root / "holdout")
    assert main(["--checkpoint", str(checkpoint), "--val-split", "holdout", *argv]) == 0
    assert json.loads((tmp_path / "out" / "diagnostics.json").read_text())["sizes"]["32"]["entropy"] == from_split
    assert main(["--checkpoint", str(checkpoint), *argv]) == 2
    assert "test does not exist" in capsys.readouterr().err


def test_attention_entropy_of_a_naflex_batch_is_over_its_real_tokens():
    """An image packed with padding into a longer sequence has the entropy of the image alone: padding is hidden
    from the keys and its queries are not counted."""
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=2, img_size=32)
    torch.manual_seed(0)
    image = torch.randn(3, 32, 64)
    packed = pack([image], length=20)  # 8 real tokens, 12 of padding
    torch.testing.assert_close(attention_entropy(model, packed), attention_entropy(model, image[None]))


def test_budget_coverage_counts_a_channel_unseen_on_any_grid():
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1, img_size=64)  # 4x4 training grid
    wide, tall = budget_coverage(model, [(2, 12)])[0], budget_coverage(model, [(12, 2)])[0]
    assert wide["unseen"] == frequency_coverage(model, (2, 12))[0]["unseen"] > 0
    both = budget_coverage(model, [(2, 12), (12, 2)])[0]
    assert max(wide["unseen"], tall["unseen"]) < both["unseen"] <= wide["unseen"] + tall["unseen"]  # x and y pairs


def test_seq_lens_measure_at_token_budgets_over_the_images_own_grids(image_root, tmp_path, capsys):
    """Square 40x40 images at 4 tokens are the 32 px images: the same entropy; a 2:1 image at 12 tokens has a grid of
    its own, reported with the budget."""
    weights = tmp_path / "w.pth"
    torch.save(timm.create_model(ROPE, depth=2, num_classes=3).state_dict(), weights)
    argv = ["--model", ROPE, "--pretrained-file", str(weights), "--model-kwargs", "depth=2", "num_classes=3",
            "img_size=32", "--data-dir", str(image_root), "--num-images", "13", "--output", str(tmp_path / "out")]
    assert main([*argv, "--sizes", "32", "--seq-lens", "4"]) == 0
    report = json.loads((tmp_path / "out" / "diagnostics.json").read_text())
    square, budget = report["sizes"]["32"], report["seq_lens"]["4"]
    assert budget["grids"] == [[2, 2]] and budget["unseen"] == square["unseen"]
    assert budget["entropy"] == pytest.approx(square["entropy"], rel=1e-5)
    labels = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert ["32", "px"] in labels and ["4", "tokens"] in labels  # the console table's rows
    Image.fromarray(np.full((40, 80, 3), 128, dtype=np.uint8)).save(image_root / "val" / "class_0" / "wide.png")
    assert main([*argv, "--seq-lens", "12"]) == 0  # budgets alone: no default sizes
    report = json.loads((tmp_path / "out" / "diagnostics.json").read_text())
    assert report["sizes"] == {} and report["seq_lens"]["12"]["grids"] == [[2, 4], [3, 3]]


@pytest.mark.parametrize("budget, message", [
    ("0", "error: --seq-lens 0 is below one patch"),
    ("12", "error: --seq-lens resizes images keeping their aspect ratio, and the noise fed without --data-dir has "
           "none: pass --data-dir DIR"),
])
def test_bad_budgets_or_budgets_of_noise_are_refused(budget, message, tmp_path, capsys):
    argv = ["--model", ROPE, "--random-init", "--model-kwargs", "depth=1", "--seq-lens", budget, "--output",
            str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_without_sizes_a_checkpoint_is_inspected_at_rope_vits_ratios_of_its_training_size(tmp_path, capsys):
    """A 32 px run with 16 px patches: 1x, 1.43x, 1.71x and 2.29x in whole patches are 32, 48, 48 and 80 px."""
    checkpoint = write_checkpoint(tmp_path / "best.pth")
    assert main(["--checkpoint", str(checkpoint), "--num-images", "1", "--output", str(tmp_path / "out")]) == 0
    assert list(json.loads((tmp_path / "out" / "diagnostics.json").read_text())["sizes"]) == ["32", "48", "80"]


def test_model_options_with_a_checkpoint_are_a_usage_error(tmp_path, capsys):
    """A checkpoint rebuilds its own model: --model-kwargs with it alone would be ignored, as in vit_rope.evaluate."""
    checkpoint = write_checkpoint(tmp_path / "best.pth")
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(checkpoint), "--model-kwargs", "depth=3", "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "go with --model" in capsys.readouterr().err


PATCH = 16
BASE = dict(img_size=64, embed_dim=48, depth=2, num_heads=3, num_classes=5, init_values=0.5)
KINDS = {  # every encoding: RoPE tables, STRING, RoPE + APE (patches only or with the class token), DINOv3, biases
    "axial": ("vit_rope_tiny_patch16_axial_224", {}),
    "mixed": ("vit_rope_tiny_patch16_mixed_224", {}),
    "golden": ("vit_rope_tiny_patch16_golden_224", {}),
    "string_mixed": ("vit_rope_tiny_patch16_string_mixed_224", {}),
    "axial_ape": ("vit_rope_tiny_patch16_axial_ape_224", {}),
    "mixed_ape_cls": ("vit_rope_tiny_patch16_mixed_ape_224", {"no_embed_class": False}),
    "dinov3": ("vit_rope_tiny_patch16_axial_224", {"encoding": "dinov3", "reg_tokens": 2}),
    "lookhere": ("vit_rope_tiny_patch16_lookhere_224", {}),
    "alibi": ("vit_rope_tiny_patch16_alibi_224", {}),
}


def build(kind: str, **kwargs) -> torch.nn.Module:
    name, extra = KINDS[kind]
    return perturbed(name, None, **{**BASE, **extra, **kwargs})


def shuffle_patches(images: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` with its PATCH x PATCH patches moved to the raster positions ``order``."""
    B, C, H, W = images.shape
    h, w = H // PATCH, W // PATCH
    patches = images.reshape(B, C, h, PATCH, w, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C, PATCH, PATCH)
    patches = patches[:, order].reshape(B, h, w, C, PATCH, PATCH)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [64, 96])  # the training grid and a larger one
def test_without_positions_every_kind_is_blind_to_where_patches_are(kind: str, size: int) -> None:
    model = build(kind)
    torch.manual_seed(1)
    images = torch.randn(2, 3, size, size)
    moved = shuffle_patches(images, torch.randperm((size // PATCH) ** 2))
    with torch.no_grad():
        assert not torch.allclose(model(moved), model(images), atol=1e-3)  # with its encoding, where matters
        with without_positions(model):
            torch.testing.assert_close(model(moved), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["mixed_ape_cls", "lookhere"])
def test_leaving_restores_the_encoding_even_after_an_error(kind: str) -> None:
    model = build(kind)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(images)
        ape = None if model.pos_embed is None else model.pos_embed.clone()
        with pytest.raises(RuntimeError, match="inside"), without_positions(model):
            assert not torch.allclose(model(images), before, atol=1e-3)
            raise RuntimeError("inside")
        torch.testing.assert_close(model(images), before, atol=0, rtol=0)
    assert ape is None or torch.equal(model.pos_embed, ape)
    assert not any(blk._forward_pre_hooks for blk in model.blocks)


def test_other_models_are_refused_not_half_ablated() -> None:
    with pytest.raises(TypeError, match="got Eva, whose position encoding"), without_positions(timm.create_model(
            "vit_small_patch16_rope_mixed_224", depth=1)):
        pass


def test_reliance_is_zero_for_a_model_that_has_no_positions_to_lose() -> None:
    images = torch.randn(4, 3, 64, 64)
    blind = build("axial", rope_fraction=0.0)  # every pair unrotated, no APE: positions never reach it
    assert position_reliance(blind, images) == {"output_change": pytest.approx(0, abs=1e-6), "predictions_kept": 1.0}
    reliance = position_reliance(build("axial"), images)
    assert reliance["output_change"] > 1e-2 and 0 <= reliance["predictions_kept"] <= 1


@pytest.mark.parametrize("kind", ["lookhere", "axial_ape"])
def test_without_positions_a_naflex_sample_still_equals_its_image_alone(kind: str) -> None:
    """The padding mask is no position: it stays when the bias goes, so each sample is still its image alone."""
    torch.manual_seed(3)
    inputs = [torch.randn(3, 64, 96), torch.randn(3, 80, 48)]
    model = build(kind)
    with torch.no_grad(), without_positions(model):
        logits = model(pack(inputs, length=28))
        for b, image in enumerate(inputs):
            torch.testing.assert_close(logits[b], model(pack([image], length=28))[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits[b], model(image[None])[0], atol=1e-4, rtol=1e-4)


def test_reliance_of_a_naflex_batch_and_of_a_model_without_classifier() -> None:
    torch.manual_seed(2)
    batch = pack([torch.randn(3, 64, 96), torch.randn(3, 80, 48)], length=28)
    model = build("mixed")
    reliance = position_reliance(model, batch)
    with torch.no_grad():
        logits = model(batch)
        with without_positions(model):
            blind = model(batch)
    change = ((blind - logits).norm(dim=-1) / logits.norm(dim=-1)).mean()
    assert float(change) > 0 and reliance["output_change"] == pytest.approx(float(change), rel=1e-6)
    assert reliance["predictions_kept"] == float((blind.argmax(-1) == logits.argmax(-1)).float().mean())
    features = position_reliance(build("lookhere", num_classes=0), torch.randn(2, 3, 64, 64))
    assert set(features) == {"output_change"} and features["output_change"] > 0  # pooled features, no top-1


def test_reliance_restores_training_mode_even_when_the_forward_fails() -> None:
    model = build("axial").train()
    with pytest.raises(RuntimeError):
        position_reliance(model, torch.randn(2, 5, 64, 64))  # five channels: the patch embedding refuses them
    assert model.training and all(module.training for module in model.modules())
