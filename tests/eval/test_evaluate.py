"""The evaluation harness: protocol, checkpoints (from a real train.py run too), timm models, policies, reports,
errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, ImageNetInfo
from timm.data.transforms import MaybeToTensor
from torchvision import transforms

import train
import vit_rope
from helpers.checkpoints import save_source, write_corrupt
from helpers.evaluation import CLASSES, ROPE, run, write_checkpoint
from helpers.training import tiny_args
from vit_rope.encodings.policies import POLICIES
from vit_rope.errors import UserError
from vit_rope.eval import harness as evaluate
from vit_rope.eval import report
from vit_rope.eval.loading import EvalModel, load_trained
from vit_rope.models.checkpoint import WeightsNotLoadedWarning


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "best.pth")


def test_transform_is_the_protocol() -> None:
    """timm's eval transform is exactly: short side to floor(size / crop_pct) bicubic, center crop, pixels in [0, 1];
    each model then gets the mean/std it was trained with (ImageNet's for ours, 0.5 for timm's augreg ViT)."""
    steps = evaluate.eval_transform(64, 0.875).transforms
    assert [type(step) for step in steps] == [transforms.Resize, transforms.CenterCrop, MaybeToTensor,
                                              transforms.Normalize]
    assert steps[0].size == 73 and steps[0].interpolation == transforms.InterpolationMode.BICUBIC  # int: short side
    assert list(steps[1].size) == [64, 64]
    assert steps[3].mean.tolist() == [0.0, 0.0, 0.0] and steps[3].std.tolist() == [1.0, 1.0, 1.0]
    assert evaluate.eval_transform(64, 1.0).transforms[0].size == 64
    ours = evaluate.normalisation(timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1), "cpu")
    assert ours[0].flatten().tolist() == pytest.approx(IMAGENET_DEFAULT_MEAN)
    assert ours[1].flatten().tolist() == pytest.approx(IMAGENET_DEFAULT_STD)
    augreg = evaluate.normalisation(timm.create_model("vit_tiny_patch16_224", depth=1), "cpu")
    assert augreg[0].flatten().tolist() == [0.5, 0.5, 0.5] and augreg[1].flatten().tolist() == [0.5, 0.5, 0.5]


def test_subset_is_even_and_deterministic() -> None:
    assert evaluate.subset(12, 3) == [0, 4, 8]  # one image of each of 3 classes of 4
    assert evaluate.subset(5, 10) == evaluate.subset(5, None) == [0, 1, 2, 3, 4]


def test_checkpoint_and_timm_models(image_root: Path, checkpoint: Path, tmp_path: Path, capsys) -> None:
    """A RoPE checkpoint under two policies, timm's APE ViT and timm's RoPE port: all three reports."""
    out = tmp_path / "eval"
    assert run("--checkpoint", str(checkpoint), "--model", "vit_tiny_patch16_224", "vit_small_patch16_rope_mixed_224",
               "--model-kwargs", "depth=1", "--train-size", "32", "--random-init", "--data-dir", str(image_root),
               "--img-sizes", "32", "48", "64", "--policy", "extrapolate", "interpolate", "--output", str(out)) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("protocol: resize the short side to floor(size / 1.0) px (PIL bicubic), center-crop")
    assert ("warning: vit_tiny_patch16_224, vit_small_patch16_rope_mixed_224 evaluated with random weights "
            "(--random-init)") in printed

    results = json.loads((out / "results.json").read_text())["results"]
    rows = {(r["model"].split(" ")[0], r["policy"], r["img_size"]) for r in results}
    expected = {(ROPE, p, s) for p in ("extrapolate", "interpolate") for s in (32, 48, 64)}
    timm_models = ("vit_tiny_patch16_224", "vit_small_patch16_rope_mixed_224")
    expected |= {(m, None, s) for m in timm_models for s in (32, 48, 64)}
    assert rows == expected and len(results) == len(expected)
    assert all(0 <= r["top1"] <= r["top5"] <= 100 and r["images"] == 12 and r["train_size"] == 32 for r in results)
    assert all(r["loss"] > 0 and r["images_per_s"] > 0 for r in results)
    ours = {(r["policy"], r["img_size"]): r["loss"] for r in results if r["model"].startswith(ROPE)}
    assert ours["extrapolate", 32] == pytest.approx(ours["interpolate", 32])  # policies agree at the training size
    assert ours["extrapolate", 64] != pytest.approx(ours["interpolate", 64], rel=1e-6)  # and the policy is applied

    table = (out / "results.md").read_text()
    assert "| model | policy | 32* | 48 | 64 |" in table
    assert "| vit_tiny_patch16_224 (depth=1, random init) | - | **" in table
    assert table.count(f"| {ROPE} (depth=2) ({checkpoint}) | interpolate | **") == 3  # top-1, top-5, images/s
    with Image.open(out / "accuracy_vs_resolution.png") as image:
        assert image.format == "PNG" and image.size[0] > 100


def test_train_py_checkpoint(image_root: Path, tmp_path: Path) -> None:
    """The checkpoint of a real one-epoch train.py run, rebuilt and evaluated; --limit takes one image per class."""
    assert train.main(tiny_args(image_root, tmp_path / "run", "--epochs", "1", "model_ema=true")) == 0
    results = evaluate.evaluate_models([load_trained(tmp_path / "run" / "best.pth")], image_root, [32, 64],
                                       ["yarn"], device="cpu", limit=3, batch_size=3, workers=0)
    assert [(r["policy"], r["img_size"], r["images"]) for r in results] == [("yarn", 32, 3), ("yarn", 64, 3)]
    assert all(r["top1"] in (0, 100 / 3, 200 / 3, 100) for r in results)


def test_classes_matched_by_name(checkpoint: Path) -> None:
    """Outputs are looked up by class name: a reordered checkpoint, or an ImageNet-1k model on a few synsets."""
    model = load_trained(checkpoint)
    model.classes = CLASSES[::-1]
    assert evaluate.label_map(model, CLASSES, Path("val")).tolist() == [2, 1, 0]
    imagenet = EvalModel("in1k", model.model, 224, ImageNetInfo().label_names())
    assert evaluate.label_map(imagenet, ["n01440764", "n01443537"], Path("val")).tolist() == [0, 1]
    with pytest.raises(UserError, match=r"has classes \['dog'\] that in1k was not trained on"):
        evaluate.label_map(imagenet, ["dog"], Path("val"))
    imagenet.data_dir = "data/imagenet"  # a checkpoint names the data its run read: the error says where to look
    with pytest.raises(UserError, match=r"folder of its classes \(its run trained on data/imagenet: --data-dir "):
        evaluate.label_map(imagenet, ["dog"], Path("val"))


def test_plot_skipped_without_matplotlib(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    results = [{"model": "m", "policy": None, "img_size": 32, "train_size": 32, "top1": 50.0, "top5": 100.0,
                "images_per_s": 10.0}]
    report.write_reports(results, tmp_path, "protocol")
    assert capsys.readouterr().out.startswith("warning: matplotlib is not installed, skipping the plot")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]


@pytest.mark.parametrize("case, message", [
    ("size", "size 100 is not a positive multiple of the patch size 16 of vit_rope_tiny_patch16_mixed_224"),
    ("policy", f"unknown RoPE policy bogus: choose from {', '.join(POLICIES)}"),
    ("no_name", "has no model_name, so its model cannot be rebuilt"),
    ("state_dict", "is not a vit-rope training checkpoint"),
    ("no_val", "missing/val does not exist"),
    ("model", "unknown model 'vit_tiny_patch16_22'; did you mean 'vit_tiny_patch16_224'?"),
    ("corrupt_pretrained", "garbage_header.safetensors is not a readable checkpoint: the file is truncated or "
                           "corrupt (or not a weights file); download it again or save it again [SafetensorError: "),
    ("no_weights", f"--model {ROPE} has no weights, so the command would evaluate its random initialisation: pass "
                   "--pretrained-file PATH or --model-kwargs pretrained=true for timm's published weights, or "
                   "--random-init to evaluate random weights on purpose"),
    ("crop_pct", "--crop-pct 1.5 is outside (0, 1]: it is the fraction of the resized image that the center crop "
                 "keeps"),
    ("split", "val does not exist; the data dir needs val/ with one folder per class; it has test/: set "
              "--split=test to use that"),
    ("axial_into_mixed", f"axial.pth has no learned RoPE frequencies for {ROPE}, a mixed RoPE model"),
    ("twice", "best.pth) is given twice, and its rows would merge in the reports"),
    ("output_file", "is a file, not a folder: name a folder to write into"),
    ("folder_checkpoint", "is a folder; pass OUTPUT/last.pth"),
])
def test_bad_input(case: str, message: str, image_root: Path, checkpoint: Path, tmp_path: Path, capsys) -> None:
    """Each mistake: exit code 2, one line naming the value, and nothing evaluated or written."""
    source = ["--checkpoint", str(checkpoint)]
    source = {"model": ["--model", "vit_tiny_patch16_22"], "no_weights": ["--model", ROPE, "--model-kwargs", "depth=1"],
              "crop_pct": [*source, "--crop-pct", "1.5"], "twice": [*source, str(checkpoint)],
              "folder_checkpoint": ["--checkpoint", str(tmp_path)]}.get(case, source)
    if case == "no_name":  # or any other key the rebuild reads: the same check of one list
        source[1] = str(write_checkpoint(tmp_path / "bad.pth", drop=("model_name",)))
    if case == "state_dict":
        torch.save(timm.create_model(ROPE, depth=1).state_dict(), tmp_path / "weights.pth")
        source[1] = str(tmp_path / "weights.pth")
    if case == "split":
        (image_root / "val").rename(image_root / "test")
    if case == "corrupt_pretrained":
        source = ["--model", ROPE, "--pretrained-file", str(write_corrupt(tmp_path / "garbage_header.safetensors"))]
    if case == "axial_into_mixed":  # a plain ViT's file fails the same check (its load: test_checkpoint.py)
        axial = save_source("axial", tmp_path / "axial.pth", num_classes=3)
        source = ["--model", ROPE, "--pretrained-file", str(axial), "--model-kwargs", "depth=2", "num_classes=3",
                  "--train-size", "32"]
    code = run(*source, "--data-dir", str(tmp_path / "missing" if case == "no_val" else image_root),
               "--img-sizes", "32", *(["100"] if case == "size" else []),
               "--policy", "bogus" if case == "policy" else "extrapolate",
               "--output", str(checkpoint if case == "output_file" else tmp_path / "eval"))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "eval").exists()
    if case == "size":
        assert err.rstrip().endswith("use 96 or 112")
    if case == "axial_into_mixed":
        assert err.rstrip().endswith("for an axial RoPE checkpoint pick vit_rope_tiny_patch16_axial_224")


@pytest.mark.parametrize("kind, classes, warning, message", [
    ("axial", 3, "", "has no learned RoPE frequencies"),
    ("mixed", 5, "classifier of another size", r"does not give m its classifier \(classifier of another size: "
                                               r"the checkpoint has 5 classes, the model 3\), so it would be evaluated "
                                               "with a random one"),
])
def test_evaluate_models_refuses_a_model_its_file_did_not_fully_load(kind: str, classes: int, warning: str,
                                                                     message: str, image_root: Path,
                                                                     tmp_path: Path) -> None:
    """The Python API too: ``load_weights`` of an axial file into a mixed model, or of another classifier size,
    then ``evaluate_models``."""
    model = timm.create_model(ROPE, depth=2, num_classes=3)
    source = save_source(kind, tmp_path / f"{kind}.pth", num_classes=classes)
    with pytest.warns(WeightsNotLoadedWarning, match=warning):
        vit_rope.load_weights(model, source)
    with pytest.raises(UserError, match=f"^{source} {message}"):
        evaluate.evaluate_models([EvalModel("m", model, 32)], image_root, [32], device="cpu", workers=0)


def test_val_split_defaults_to_the_checkpoints_and_can_be_chosen(image_root: Path, tmp_path: Path, capsys) -> None:
    """A run that validated on test/ (CIFAR-10 as an ImageFolder) is evaluated there; --val-split picks another;
    checkpoints of different splits need the choice made."""
    (image_root / "val").rename(image_root / "test")
    test_run = write_checkpoint(tmp_path / "test_run.pth", val_split="test")
    args = ["--data-dir", str(image_root), "--img-sizes", "32", "--output", str(tmp_path / "eval")]
    assert run("--checkpoint", str(test_run), *args) == 0
    assert f"; {image_root / 'test'}" in capsys.readouterr().out.splitlines()[0]
    shutil.copytree(image_root / "test", image_root / "holdout")
    val_run = write_checkpoint(tmp_path / "val_run.pth")
    assert run("--checkpoint", str(test_run), str(val_run), *args) == 2
    err = capsys.readouterr().err
    assert err == (f"error: the checkpoints were validated on different splits ({ROPE} (depth=2) ({test_run}): test, "
                   f"{ROPE} (depth=2) ({val_run}): val); pass --split to pick the one to evaluate on\n")
    assert run("--checkpoint", str(test_run), str(val_run), "--val-split", "holdout", *args) == 0
    assert f"; {image_root / 'holdout'}" in capsys.readouterr().out.splitlines()[0]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert {row["model"] for row in results} == {f"{ROPE} (depth=2) ({test_run})", f"{ROPE} (depth=2) ({val_run})"}


def test_an_unreadable_val_image_is_left_out_not_counted_twice(image_root: Path, checkpoint: Path, capsys) -> None:
    """Its slot holds the next readable image, which is also evaluated in its own: the metrics are those of the
    readable images alone, as if the broken file were not there."""
    model = load_trained(checkpoint)
    broken = sorted((image_root / "val" / "class_1").iterdir())[:2]  # neighbours: the first slot skips two files
    for path in broken:
        path.write_bytes(b"not an image")
    with_broken = evaluate.evaluate_models([model], image_root, [32], device="cpu", workers=0)[0]
    total = len(list((image_root / "val").rglob("*.*")))
    assert f"2 unreadable image(s) left out at 32 px: top-1 and top-5 are over the {total - 2} of {total}" in \
        capsys.readouterr().out
    for path in broken:
        path.unlink()
    without = evaluate.evaluate_models([model], image_root, [32], device="cpu", workers=0)[0]
    assert with_broken["images"] == without["images"]
    for metric in ("top1", "top5", "loss"):
        assert with_broken[metric] == pytest.approx(without[metric])


@pytest.mark.parametrize("option, message", [
    (["--train-size", "64"], "--train-size goes with --model"),
    (["--model-kwargs", "depth=3"], "--model-kwargs goes with --model"),
    (["--seq-lens", "196", "1.5"], "argument --seq-lens: '1.5' is not a whole number of tokens"),
])
def test_usage_errors(option: list[str], message: str, checkpoint: Path, image_root: Path, capsys) -> None:
    """--train-size and --model-kwargs build --model models (a checkpoint is rebuilt with its run's size and
    model_kwargs, so with it alone they would be ignored); a token budget is a whole number."""
    with pytest.raises(SystemExit) as exit_info:
        run("--checkpoint", str(checkpoint), *option, "--data-dir", str(image_root))
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_without_img_sizes_each_model_is_evaluated_at_its_training_size_and_budgets_alone_at_none(
        checkpoint: Path, image_root: Path, tmp_path: Path, capsys) -> None:
    """--seq-lens without --img-sizes: the budgets asked for, not the training size besides."""
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--output", str(tmp_path / "e")) == 0
    rows = json.loads((tmp_path / "e" / "results.json").read_text())["results"]
    assert {row["img_size"] for row in rows} == {32} and all(row["train_size"] == 32 for row in rows)
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--seq-lens", "4", "--limit", "3",
               "--output", str(tmp_path / "budgets")) == 0
    assert "sizes []; budgets [4];" in capsys.readouterr().out
    rows = json.loads((tmp_path / "budgets" / "results.json").read_text())["results"]
    assert [(row["img_size"], row["seq_len"]) for row in rows] == [(None, 4)]
