"""``train.py`` with ``naflex=true``: timm's NaFlex loader feeding our models and timm's NaFlexViT (resume and DDP are
covered with the other pipelines in test_train.py)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
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


def test_an_unreadable_image_is_counted(image_root: Path, tmp_path: Path, capsys) -> None:
    (image_root / "train" / "class_1" / "5.jpg").write_bytes(b"not an image at all")
    assert train.main(tiny_args(image_root, tmp_path / "run", *NAFLEX, "--epochs", "1")) == 0
    assert "(1 unreadable image(s) skipped)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (("train_sizes=[32, 48]",), "naflex=true does not go with train_sizes (NaFlex draws each step's sequence length "
                                "from naflex_seq_lens): set train_sizes=[]"),
    (("repeated_aug=true",), "naflex=true does not go with repeated_aug"),
    (("pipeline=tensor",), "naflex=true does not go with pipeline=tensor"),
    (("train_crop_mode=rkrc",), "naflex=true does not go with train_crop_mode=rkrc"),
    (("naflex_seq_lens=[]",), "config key 'naflex_seq_lens' must list sequence lengths >= 1"),
    (("naflex_seq_lens=[0, 16]",), "config key 'naflex_seq_lens' must list sequence lengths >= 1"),
    (("naflex_val_seq_len=-1",), "config key 'naflex_val_seq_len' must be >= 1 patches, or 0"),
    (("--model", "resnet10t", "model_kwargs={}"), "naflex=true needs a model that takes NaFlex batches with square "
                                                  "patches, and 'resnet10t' (ResNet) does not"),
])
def test_bad_naflex_settings_exit_2_before_any_image_is_decoded(image_root: Path, tmp_path: Path, capsys,
                                                                extra: tuple[str, ...], message: str) -> None:
    cache = tmp_path / "cache"
    assert train.main(tiny_args(image_root, tmp_path / "run", *NAFLEX, "decoded_cache=true", f"cache_dir={cache}",
                                *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists() and not cache.exists()


def test_the_decoded_cache_holds_the_longest_sequences_pixels(image_root: Path, tmp_path: Path, capsys) -> None:
    assert train.main(tiny_args(image_root, tmp_path / "run", *NAFLEX, "--epochs", "1", "decoded_cache=true")) == 0
    assert "short side 64 px (train" in capsys.readouterr().out  # sqrt(16) patches of 16 px; val keeps 32 / crop_pct
