"""Diagnostics: frequency coverage, attention entropy and the directions plot, on tiny models."""

import json
import math

import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from vit_rope.diagnose import attention_entropy, frequency_coverage, main


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
    model.set_rope_policy("interpolate")
    interpolated = torch.tensor(frequency_coverage(model, (16, 16))[0]["target_turns"])
    torch.testing.assert_close(interpolated, train_turns * 3.75 / 3)  # positions squeezed into [0, 3.75]
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
    assert main(argv[:5] + ["40"] + argv[7:]) == 2
    assert "not multiples of the patch size 16" in capsys.readouterr().err
