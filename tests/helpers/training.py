"""Training runs of a tiny ViT on a generated ImageFolder: the folder (and a split's pixels, to compare a copy of it),
the arguments of a fast CPU run, the loaders train.py builds from them, and what a run wrote (metrics, weights), with
a way to kill a run mid-epoch, and zeros for random inits where no value matters."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import resolve_data_config

import vit_rope  # noqa: F401  (registers the vit_rope_* models)
from vit_rope.data import folders
from vit_rope.train import engine, loaders
from vit_rope.train.command_line import build_config

REPO = Path(__file__).resolve().parents[2]  # train.py is imported from there (pyproject's pythonpath)

TINY_MODEL = "vit_rope_tiny_patch16_mixed_224"

DATA_CONFIG = resolve_data_config({"input_size": (3, 32, 32), "crop_pct": 0.875, "interpolation": "bicubic"})
PER_IMAGE = ("img_size=32", "batch_size=8", "workers=0", "auto_augment=rand-m9-mstd0.5-inc1", "reprob=0.25",
             "mixup=0.8", "train_sizes=[16, 32, 48]")


def write_image_folder(root: Path, train_per_class: int = 8, val_per_class: int = 4) -> Path:
    """3 classes of 40x40 images whose dominant color channel is the class, as JPEG and PNG.

    The first train image of class 0 is grayscale and the first of class 1 is a CMYK JPEG, so that the
    conversion to RGB is exercised. Classes are easy to tell apart so that a 2-epoch run visibly learns.
    """
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label in range(3):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for index in range(count):
                pixels = rng.integers(0, 90, (40, 40, 3), dtype=np.uint8)
                pixels[..., label] += 160
                image = Image.fromarray(pixels)
                if split == "train" and index == 0 and label < 2:
                    image.convert(("L", "CMYK")[label]).save(folder / f"{index}.jpg")
                else:
                    image.save(folder / f"{index}.{('png', 'jpg')[index % 2]}")
    return root


def pixels(samples: list) -> list[tuple[int, bytes]]:
    """Each sample as (label, RGB bytes), sorted: a split's content whatever its order or the files' format."""
    return sorted((label, np.asarray(folders.decode_image(source)).tobytes()) for source, label in samples)


def tiny_args(data_dir: Path, output: Path, *extra: str) -> list[str]:
    """Command-line arguments for a fast CPU run of a 2-block tiny ViT at 32 px (overrides come last and win)."""
    return ["--data-dir", str(data_dir), "--output", str(output), "--model", TINY_MODEL, "--img-size", "32",
            "model_kwargs.depth=2", "--device", "cpu", "--epochs", "2", "--batch-size", "8", "--log-interval", "0",
            "threads=1", "workers=0", "warmup_epochs=0", "lr=2e-3", "min_lr=1e-4", "drop_path=0", "mixup=0", "cutmix=0",
            "auto_augment=null", "reprob=0", "smoothing=0", *extra]


def indexed_loaders(root: Path, *overrides: str, rank: int = 0, world_size: int = 1):
    """``build_loaders`` over the tiny ImageFolder with each train image's target = its index, to follow the order."""
    cfg = build_config(None, list(overrides))
    train, classes = folders.find_images(root / "train")
    val, _ = folders.find_images(root / "val", classes)
    return loaders.build_loaders(cfg, [(path, i) for i, (path, _) in enumerate(train)], val, DATA_CONFIG, rank,
                                 world_size)


def metrics(output: Path) -> list[dict[str, str]]:
    with (output / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def zero_inits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random inits fill zeros (torch's, timm's and transformers' all draw through these ``Tensor`` methods): for a
    test that reads models' structure or a benchmark's plumbing, never their values, where drawing the weights of
    large layers is much of the time."""
    for init in ("uniform_", "normal_", "erfinv_"):
        monkeypatch.setattr(torch.Tensor, init, lambda tensor, *args, **kwargs: tensor.zero_())


def killed_at(epoch: int, step: int) -> Callable:
    """A ``engine.Progress.update`` that stops the run after step ``step`` (1-based) of epoch ``epoch`` (1-based),
    before any checkpoint of that step: the work since the last checkpoint is lost, as in a killed job."""
    real = engine.Progress.update

    def update(self, index: int, **stats: str) -> None:
        real(self, index, **stats)
        if self.desc.startswith(f"epoch {epoch}/") and index + 1 == step:
            raise KeyboardInterrupt

    return update


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = (torch.load(path / "last.pth", weights_only=True) for path in (a, b))
    for key in ("model", "model_ema"):
        for name, tensor in first[key].items():
            torch.testing.assert_close(second[key][name], tensor, rtol=0, atol=1e-5, msg=f"{key}.{name}")
