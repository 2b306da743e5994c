"""``train_sizes`` on the ImageNet recipes (``base.yaml``, RoPE-ViT's DeiT-III ``rope_vit_*``): each builds its loaders
with it on tiny generated data, keeps its pipeline, sampler and augmentations, and only the crop size changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from timm.data import Mixup, resolve_data_config
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DistributedSampler

from vit_rope.data import folders
from vit_rope.train import loaders
from vit_rope.train.command_line import build_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
RECIPES = [CONFIG_DIR / "base.yaml", *sorted(CONFIG_DIR.glob("rope_vit_*.yaml"))]
TINY = ["batch_size=8", "workers=0"]  # 24 train images: 3 steps; the recipes' own batches need ImageNet


@pytest.mark.parametrize("path", RECIPES, ids=lambda path: path.stem)
def test_recipe_trains_at_several_sizes_with_its_own_augmentations(path: Path, image_root: Path) -> None:
    plain = build_config(path, TINY)
    sizes = [plain.img_size - 64, plain.img_size, plain.img_size + 64]
    cfg = build_config(path, [*TINY, f"train_sizes={sizes}"])
    assert dataclasses.replace(cfg, train_sizes=[]) == plain
    assert loaders.choose_pipeline(cfg) == loaders.choose_pipeline(plain) and loaders.choose_pipeline(cfg)[0] == "timm"
    data_config = resolve_data_config({"input_size": (3, cfg.img_size, cfg.img_size), "crop_pct": cfg.crop_pct,
                                       "interpolation": cfg.interpolation})
    plain_train, plain_val = loaders.build_transforms(plain, data_config)
    (only,) = plain_train.values()  # at img_size
    transforms, val_tf = loaders.build_transforms(cfg, data_config)
    assert repr(val_tf) == repr(plain_val) and sorted(transforms) == sizes
    for size, transform in transforms.items():  # the recipe's transform, but for the crop's output size
        resized = f"size=({cfg.img_size}, {cfg.img_size})"
        assert repr(transform) == repr(only).replace(resized, f"size=({size}, {size})")

    train_samples, classes = folders.find_images(image_root / "train")
    val_samples, _ = folders.find_images(image_root / "val", classes)
    train, val = loaders.build_loaders(cfg, train_samples, val_samples, data_config)
    order = train.batch_sampler.order
    assert isinstance(order, RepeatAugSampler if cfg.repeated_aug else DistributedSampler)
    mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, num_classes=3) if cfg.mixup or cfg.cutmix else None
    loaders.set_epoch(train, 1)
    expected = [(size, len(indices)) for size, indices in train.batch_sampler.plan()]
    shapes = []
    for images, targets, _ in train:
        if mixup is not None:
            images, targets = mixup(images, targets)  # per batch, at the step's size: even batches
        shapes.append((images.shape[-1], len(images)))
        assert torch.isfinite(images).all()
    assert shapes == expected and len(shapes) == 3 and {size for size, _ in shapes} <= set(sizes)
    images, _, _ = next(iter(val))
    assert images.shape[-2:] == (cfg.img_size, cfg.img_size)  # validation at img_size
