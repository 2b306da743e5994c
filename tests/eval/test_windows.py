"""A Swin's windows in the evaluation harness (``vit_rope.eval.windows``): kept, scaled or given per size, said in the
rows, a size they cannot tile refused before anything runs, NaFlex budgets refused for a Swin."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import timm
import torch

from helpers.evaluation import CLASSES, ROPE, run
from vit_rope.errors import UserError
from vit_rope.eval import windows
from vit_rope.train.state import save_checkpoint

SWIN = "swin_rope_mixed_tiny_patch4_window7_224"
KWARGS = {"num_classes": 3, "img_size": 32, "embed_dim": 32, "depths": [2, 2], "num_heads": [1, 2],
          "window_size": 4, "drop_path_rate": 0.0}  # 8x8 then 4x4 tokens at 32 px: one 4x4 window in stage 2


def swin_checkpoint(path: Path) -> Path:
    """A train.py checkpoint of a small RoPE-Swin trained at 32 px (random weights, larger so that policies show)."""
    torch.manual_seed(0)
    model = timm.create_model(SWIN, **KWARGS)
    for name, param in model.named_parameters():
        if name.endswith(("rope.freqs", "qkv.weight")):  # sharper attention, further-turning pairs
            param.data.mul_(4)
    save_checkpoint({"model_name": SWIN, "model_kwargs": KWARGS, "classes": CLASSES, "model": model.state_dict(),
                     "config": {"img_size": 32, "model": SWIN, "val_split": "val"}, "epoch": 1}, path)
    return path


def rows(out: Path) -> dict[tuple[int, str], dict]:
    return {(r["img_size"], r["policy"]): r for r in json.loads((out / "results.json").read_text())["results"]}


def test_window_rules_per_size_and_the_policies_they_leave_room_for(image_root: Path, tmp_path: Path) -> None:
    """keep: the trained windows at every size (a size they do not tile padded when asked); scale: windows grow
    with the image (timm's rule), so positions pass the trained window and the policies differ there; a number:
    that window in every stage, capped at a stage's grid."""
    checkpoint = swin_checkpoint(tmp_path / "swin.pth")
    common = ["--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--policy", "extrapolate",
              "interpolate"]
    assert run(*common, "--img-sizes", "32", "48", "64", "--pad-windows", "--output", str(tmp_path / "keep")) == 0
    kept = rows(tmp_path / "keep")
    assert {tuple(map(tuple, r["windows"])) for r in kept.values()} == {((4, 4), (4, 4))}
    assert kept[64, "extrapolate"]["loss"] == pytest.approx(kept[64, "interpolate"]["loss"], rel=1e-9)

    assert run(*common, "--img-sizes", "32", "48", "64", "--window-size", "scale", "--output",
               str(tmp_path / "scale")) == 0
    scaled = rows(tmp_path / "scale")
    assert [scaled[size, "extrapolate"]["windows"] for size in (32, 48, 64)] == [
        [[4, 4], [4, 4]], [[6, 6], [6, 6]], [[8, 8], [8, 8]]]
    assert scaled[32, "extrapolate"]["loss"] == pytest.approx(scaled[32, "interpolate"]["loss"], rel=1e-9)
    assert scaled[64, "extrapolate"]["loss"] != pytest.approx(scaled[64, "interpolate"]["loss"], rel=1e-9)

    assert run(*common, "--img-sizes", "64", "--window-size", "8", "--output", str(tmp_path / "eight")) == 0
    assert rows(tmp_path / "eight")[64, "extrapolate"]["windows"] == [[8, 8], [8, 8]]


def test_a_size_the_windows_do_not_tile_is_refused_before_anything_runs(image_root: Path, tmp_path: Path,
                                                                      capsys) -> None:
    checkpoint = swin_checkpoint(tmp_path / "swin.pth")
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--img-sizes", "32", "48",
               "--output", str(tmp_path / "eval")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "eval").exists()
    assert "at 48 px: stage 2's 6x6 tokens are not a whole number of 4x4 windows; evaluate at 32 or 64" in err
    assert "--pad-windows" in err
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--seq-lens", "16",
               "--output", str(tmp_path / "eval")) == 2  # a Swin takes no NaFlex batches
    assert "NaFlex" in capsys.readouterr().err


def test_window_arguments_and_the_check_without_a_harness() -> None:
    assert [windows.window_arg(text) for text in ("keep", "scale", "12")] == ["keep", "scale", 12]
    for bad in ("0", "-3", "big"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a window size"):
            windows.window_arg(bad)
    model = timm.create_model(SWIN, **KWARGS)
    assert windows.has_windows(model) and not windows.has_windows(timm.create_model(ROPE, depth=1))
    windows.check_windows(model, [32, 64, 96], "keep", False, "swin")  # 8/16/24 and 4/8/12 tokens: tiled
    windows.check_windows(model, [40], "keep", True, "swin")  # padded when asked
    with pytest.raises(UserError, match="swin at 40 px: stage 1's 10x10 tokens"):
        windows.check_windows(model, [40], "keep", False, "swin")
