"""Token budgets (vit_rope.eval.token_budget): timm's NaFlex eval transform keeps each image's aspect ratio within the
budget, a budget batch gives the logits of its resized images run alone, square images at the token count of a size
score as that size, and the command writes both protocols' rows or refuses bad budgets and models without NaFlex."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from helpers.evaluation import ROPE, run, write_checkpoint
from helpers.models import perturbed
from vit_rope.eval import harness
from vit_rope.eval import token_budget as naflex
from vit_rope.eval.loading import load_trained

PATCH = (16, 16)
PLAIN_VIT = ["--model", "vit_tiny_patch16_224", "--random-init", "--model-kwargs", "depth=1", "--train-size", "32"]


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    """A noisy RGB image: every resampling step shows in its pixels."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def grid(batch: dict[str, torch.Tensor], b: int = 0) -> tuple[int, int]:
    """Sample ``b``'s patch grid (h, w), from its valid coordinates."""
    coord = batch["patch_coord"][b][batch["patch_valid"][b]]  # [n, 2] (y, x)
    return int(coord[:, 0].max()) + 1, int(coord[:, 1].max()) + 1


@pytest.mark.parametrize("seq_len", [8, 50, 196])
def test_a_budget_keeps_the_aspect_ratio_within_a_patch_and_fills_the_budget(seq_len: int) -> None:
    """A 2:1 image at budget L: at most L valid patches, padded to L, a grid twice as wide as high to one patch, and
    as large as fits (one more patch on each side would exceed L)."""
    item = naflex.budget_transform(seq_len, PATCH)(picture(160, 80))
    batch, targets, skipped = naflex.BudgetCollator(seq_len)([(item, 2, 1)])
    height, width = grid(batch)
    valid = int(batch["patch_valid"].sum())
    assert batch["patches"].shape == (1, seq_len, 16 * 16 * 3) and batch["patch_valid"].shape == (1, seq_len)
    assert valid == height * width <= seq_len < (height + 1) * (width + 1)
    assert abs(width - 2 * height) <= 1
    assert targets.tolist() == [2] and skipped.tolist() == [1]  # the dataset's third field survives timm's collator
    assert 0 <= batch["patches"].min() and batch["patches"].max() <= 1  # pixels: each model normalises its own way


def test_a_budget_batch_gives_the_logits_of_its_resized_images_alone() -> None:
    """Images of three aspect ratios in one budget batch, normalised as the harness does: each sample's logits equal
    the model on that same resized image as a [1, C, H, W] tensor, under a policy that acts per grid too."""
    model = perturbed(ROPE, depth=2, img_size=32, num_classes=3)  # positions and padding show in the logits
    mean, std = harness.normalisation(model, "cpu")
    seq_len, pictures = 12, [picture(96, 48, 1), picture(40, 120, 2), picture(50, 50, 3)]
    transform = naflex.budget_transform(seq_len, PATCH)
    resize = transforms.Compose(transform.transforms[:-1])  # the same steps up to Patchify: the resized image
    batch = naflex.normalise(naflex.BudgetCollator(seq_len)([(transform(p), 0, 0) for p in pictures])[0], mean, std)
    for policy in ("extrapolate", "interpolate"):
        model.set_resolution_policy(policy)
        with torch.no_grad():
            logits = model(batch)
            for b, image in enumerate(pictures):
                alone = naflex.normalise(resize(image)[None], mean, std)  # [1, 3, H, W]
                assert alone.shape[-2:] == tuple(16 * side for side in grid(batch, b))
                torch.testing.assert_close(logits[b], model(alone)[0], rtol=1e-4, atol=1e-4)
        assert logits.abs().max() > 0.1
    assert [grid(batch, b) for b in range(3)] == [(2, 4), (6, 2), (3, 3)]  # 12 tokens: 2:1, 1:3 and 1:1 kept


def test_square_images_at_the_token_count_of_a_size_score_as_that_size(image_root: Path, tmp_path: Path) -> None:
    """The 40x40 val images at 4 tokens of 16 px are 32x32, as the square protocol's 32 px: the same rows, through
    the harness's loader, normalisation and bookkeeping."""
    model = load_trained(write_checkpoint(tmp_path / "best.pth"))
    rows = harness.evaluate_models([model], image_root, [32], ["interpolate"], device="cpu", workers=0, batch_size=5,
                                   seq_lens=[4])
    square, budget = rows
    assert (square["img_size"], square["seq_len"], budget["img_size"], budget["seq_len"]) == (32, None, None, 4)
    assert budget["patch_size"] == [16, 16] and budget["crop_pct"] is None and budget["images"] == 12
    for metric in ("top1", "top5", "loss"):
        assert budget[metric] == pytest.approx(square[metric], rel=1e-5)


def test_the_command_writes_both_protocols_rows(image_root: Path, tmp_path: Path, capsys) -> None:
    """A RoPE checkpoint under two policies and timm's NaFlexViT, at square sizes and token budgets, on val images
    that include a 2:1 one: every (model, policy) row at every size and budget, labelled apart in the tables."""
    picture(80, 40).save(image_root / "val" / "class_0" / "wide.png")
    checkpoint, out = write_checkpoint(tmp_path / "best.pth"), tmp_path / "eval"
    assert run("--checkpoint", str(checkpoint), "--model", "naflexvit_base_patch16_gap", "--random-init",
               "--model-kwargs", "depth=1", "embed_dim=32", "num_heads=2", "--train-size", "32", "--data-dir",
               str(image_root), "--img-sizes", "32", "48", "--seq-lens", "4", "9", "--policy", "extrapolate",
               "interpolate", "--output", str(out)) == 0
    printed = capsys.readouterr().out.splitlines()[0]
    assert "center-crop" in printed and "; token budgets: resize keeping the aspect ratio" in printed
    assert "sizes [32, 48]; budgets [4, 9];" in printed

    saved = json.loads((out / "results.json").read_text())
    assert saved["protocol"] in printed
    rows = {(r["model"].split(" ")[0], r["policy"], r["img_size"], r["seq_len"]) for r in saved["results"]}
    columns = [(32, None), (48, None), (None, 4), (None, 9)]
    expected = {(ROPE, policy, *column) for policy in ("extrapolate", "interpolate") for column in columns}
    expected |= {("naflexvit_base_patch16_gap", None, *column) for column in columns}
    assert rows == expected and len(saved["results"]) == len(expected)
    assert all(r["images"] == 13 and 0 <= r["top1"] <= r["top5"] <= 100 for r in saved["results"])
    ours = {(r["policy"], r["seq_len"]): r["loss"] for r in saved["results"] if r["model"].startswith(ROPE)}
    assert ours["extrapolate", 9] != pytest.approx(ours["interpolate", 9], rel=1e-6)  # the policy acts per budget

    table = (out / "results.md").read_text()
    assert "| model | policy | 32* | 48 | 4 tokens* | 9 tokens |" in table  # 4 tokens (32 px's 2x2): apart
    assert "`L tokens`: a token budget" in table
    assert table.count(f"| {ROPE} (depth=2) ({checkpoint}) | interpolate | **") == 3  # top-1, top-5, images/s
    assert (out / "accuracy_vs_resolution.png").stat().st_size > 1000


@pytest.mark.parametrize("case, message", [
    ("zero", "error: --seq-lens 0 is below one patch: a token budget is the most patches an image is cut into"),
    ("no_naflex", "error: vit_tiny_patch16_224 (depth=1, random init) cannot be evaluated at token budgets: a "
                  "VisionTransformer does not take NaFlex batches (its forward has no patch_coord); drop --seq-lens "
                  "to evaluate it at square --img-sizes"),
])
def test_bad_budgets_and_models_without_naflex_are_one_error_line(case: str, message: str, image_root: Path,
                                                                   tmp_path: Path, capsys) -> None:
    """Exit code 2, one line naming the value or the model (timm's ViT: no NaFlex forward) and what to do, before
    anything is evaluated."""
    budget = "0" if case == "zero" else "4"  # a negative budget: the same check (seq_len < 1)
    source = PLAIN_VIT if case == "no_naflex" else ["--checkpoint", str(write_checkpoint(tmp_path / "c.pth"))]
    code = run(*source, "--data-dir", str(image_root), "--img-sizes", "32", "--seq-lens", "9", budget,
               "--output", str(tmp_path / "eval"))
    captured = capsys.readouterr()
    assert code == 2 and captured.err.startswith(message) and captured.err.count("\n") == 1
    assert "protocol:" not in captured.out and not (tmp_path / "eval").exists()
