"""Shared fixtures: for the training-side tests a tiny generated ImageFolder and the arguments of a tiny run; for the
benchmarks' smoke tests a run of a benchmark's ``main`` that returns the JSON it wrote."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vit_rope  # noqa: F401  (registers the vit_rope_* models)

REPO = Path(__file__).resolve().parent.parent  # train.py is imported from there (pyproject's pythonpath)

# One thread: the test models are so small that thread hand-offs cost more than they save, and the DDP test runs
# two processes on the two cores of the CI machine.
torch.set_num_threads(1)

ROPE_MODEL = "vit_rope_tiny_patch16_mixed_224"
TINY_MODEL = ROPE_MODEL if ROPE_MODEL in timm.list_models("vit_rope*") else "vit_tiny_patch16_224"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: ``pytest -m cuda`` must see the marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cuda`` every test parametrised with the device ``"cuda"`` (as well as those marked by hand), so that
    ``pytest -m cuda`` selects all the GPU checks on a GPU machine, and skip them where PyTorch sees no GPU."""
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and any(isinstance(value, str) and value == "cuda" for value in params.params.values()):
            item.add_marker(pytest.mark.cuda)
        if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
            item.add_marker(skip)


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


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """A fresh tiny ImageFolder (train/ and val/) that a test may modify."""
    return write_image_folder(tmp_path / "data")


def tiny_args(data_dir: Path, output: Path, *extra: str) -> list[str]:
    """Command-line arguments for a fast CPU run of a 2-block tiny ViT at 32 px (overrides come last and win)."""
    return ["--data-dir", str(data_dir), "--output", str(output), "--model", TINY_MODEL, "--img-size", "32",
            "model_kwargs.depth=2", "--device", "cpu", "--epochs", "2", "--batch-size", "8", "--log-interval", "0",
            "threads=1", "workers=0", "warmup_epochs=0", "lr=2e-3", "min_lr=1e-4", "drop_path=0", "mixup=0", "cutmix=0",
            "auto_augment=null", "reprob=0", "smoothing=0", *extra]


@pytest.fixture
def run_benchmark(tmp_path: Path) -> Callable[[Callable[[list[str]], int], list[str]], dict[str, Any]]:
    """``run(main, argv)``: a benchmark script's ``main`` with ``argv`` and ``--json`` into a temporary file, checked
    to succeed and to mark its result complete (written after its last setting); the result."""
    def run(main: Callable[[list[str]], int], argv: list[str]) -> dict[str, Any]:
        out = tmp_path / "benchmark.json"
        assert main([*argv, "--json", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["complete"]
        return result

    return run
