"""``train.py`` with ``naflex=true``: timm's NaFlex loader feeding our models and timm's NaFlexViT (resume and DDP are
covered with the other pipelines in test_train.py)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import timm
import torch
from PIL import Image

import train
from helpers.training import tiny_args

NAFLEX = ("naflex=true", "naflex_seq_lens=[4, 9, 16]")


def rows(output: Path) -> list[dict[str, str]]:
    with (output / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_naflex_run_learns_and_logs_tokens_and_padding(image_root: Path, tmp_path: Path, capsys) -> None:
    for index in range(4):  # 3:1 images: their crops tile no budget exactly
        Image.new("RGB", (72, 24), (200, 10, 10)).save(image_root / "train" / "class_0" / f"wide_{index}.png")
    out = tmp_path / "run"
    assert train.main(tiny_args(image_root, out, *NAFLEX, "--epochs", "3", "mixup=0.8", "cutmix=1.0",
                                "reprob=0.25", "smoothing=0.1")) == 0
    printed = capsys.readouterr().out
    assert "data pipeline: naflex (" in printed and "to at most 4 patches" in printed  # val: (32 / 16)^2
    log = rows(out)
    assert list(log[0])[-1] == "padding"
    assert {entry.split(":")[0] for row in log for entry in row["sizes"].split()} <= {"4t", "9t", "16t"}
    steps = int(re.search(r"NaFlex train: (\d+) steps per epoch", printed).group(1))
    assert sum(int(entry.split(":")[1]) for entry in log[0]["sizes"].split()) == steps
    assert 0 < float(log[0]["padding"]) < 0.5
    # tokens/s counts valid patches only: fewer than the padded sequences would give
    assert float(log[0]["tokens_per_s"]) < 16 * float(log[0]["images_per_s"])
    assert float(log[-1]["train_loss"]) < float(log[0]["train_loss"])
    ckpt = torch.load(out / "last.pth", weights_only=True)
    net = timm.create_model(ckpt["model_name"], **ckpt["model_kwargs"])
    net.load_state_dict(ckpt["model"])
    assert net(torch.zeros(1, 3, 32, 48)).shape == (1, 3)  # a NaFlex-trained model still takes image batches


def test_timms_naflexvit_trains_too(image_root: Path, tmp_path: Path) -> None:
    assert train.main(tiny_args(image_root, tmp_path / "run", *NAFLEX, "--epochs", "1", "--model",
                                "naflexvit_base_patch16_gap", "model_kwargs={depth: 1, embed_dim: 48, num_heads: 2}"
                                )) == 0
    assert rows(tmp_path / "run")[0]["padding"]


def test_the_decoded_cache_holds_the_longest_sequences_pixels(image_root: Path, tmp_path: Path, capsys) -> None:
    assert train.main(tiny_args(image_root, tmp_path / "run", *NAFLEX, "--epochs", "1", "decoded_cache=true")) == 0
    assert "short side 64 px (train" in capsys.readouterr().out  # sqrt(16) patches of 16 px; val keeps 32 / crop_pct
