"""Variable-resolution training: the per-step size draw, the token budget, the loader schedule and its config."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.stores import make_store, same
from vit_rope.checks import check_multiple
from vit_rope.data.pipeline import BatchLoader, TensorStore
from vit_rope.data.steps import SizeSchedule, budget_batch, budget_images, step_size
from vit_rope.errors import UserError
from vit_rope.train import loaders
from vit_rope.train.command_line import build_config

SIZES = (48, 64, 80, 96)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def loader(store: TensorStore, train: bool = True, **kwargs) -> BatchLoader:
    return BatchLoader(store, **({"batch_size": 4, "size": 16, "train": train, "scale": (0.35, 1.0)} | kwargs))


def test_step_size_is_a_function_of_seed_epoch_and_step_and_uniform() -> None:
    draws = [step_size(SIZES, 0, 0, step) for step in range(4000)]
    assert draws == [step_size(SIZES, 0, 0, step) for step in range(4000)]  # no hidden state: every rank agrees
    assert all(abs(count - 1000) < 150 for count in Counter(draws).values()) and set(draws) == set(SIZES)
    assert draws[:50] != [step_size(SIZES, 1, 0, step) for step in range(50)]  # another seed
    assert draws[:50] != [step_size(SIZES, 0, 1, step) for step in range(50)]  # another epoch
    assert step_size([64], 3, 7, 11) == 64


@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("img_size, batch_size", [(64, 128), (224, 256), (32, 8), (64, 2)])
def test_budget_batch_keeps_patches_per_step_within_one_batch_rounding(img_size: int, batch_size: int,
                                                                         even: bool) -> None:
    for size in (16, 32, 48, 64, 80, 96, 128, 160, 224, 320, 448):
        batch = budget_batch(batch_size, img_size, size, even)
        budget, step = batch_size * img_size**2, 2 if even else 1
        assert batch >= step and (batch % 2 == 0 or not even)
        assert batch == step or batch * size**2 <= budget < (batch + step) * size**2, (size, batch)
    assert budget_batch(batch_size, img_size, img_size, even) == batch_size - (batch_size % 2 if even else 0)


def test_budget_images_is_the_largest_count_within_the_budget_and_may_be_zero() -> None:
    for batch_size, img_size, size in ((128, 64, 96), (6, 32, 64), (3, 32, 64), (1, 16, 224), (7, 224, 112)):
        images = budget_images(batch_size, img_size, size)
        assert images * size**2 <= batch_size * img_size**2 < (images + 1) * size**2
    assert budget_images(1, 16, 224) == 0 and budget_batch(1, 16, 224) == 1  # the floor is budget_batch's alone


def test_schedule_without_budget_keeps_the_batch_and_describes_itself() -> None:
    fixed = SizeSchedule(SIZES, 64, 128, budget=False)
    assert {fixed(0, step)[1] for step in range(20)} == {128}
    budget = SizeSchedule(SIZES, 64, 128, even=True)
    assert [budget.batch_at(size) for size in SIZES] == [226, 128, 80, 56]
    assert "48 px x 226" in budget.describe() and "token budget of 128 x 64 px" in budget.describe()


def test_scheduled_loader_varies_size_per_step_and_ranks_agree() -> None:
    store = make_store(40)
    schedule = SizeSchedule((16, 24, 32), 24, 4, seed=5)
    runs = [loader(store, rank=rank, world_size=2, schedule=schedule) for rank in (0, 1)]
    for epoch in (0, 3):
        batches = []
        for run in runs:
            run.set_epoch(epoch)
            batches.append(list(run))
        expected = [schedule(epoch, step) for step in range(len(runs[0]))]
        for rank_batches in batches:  # the same (size, length) on both ranks, the schedule's, every step
            assert [(images.shape[-1], len(images)) for images, _, _ in rank_batches] == expected
            assert all(images.shape[1:] == (3, size, size) for (images, _, _), (size, _) in
                       zip(rank_batches, expected, strict=True))
        assert len(batches[0]) == len(runs[0]) == 5 and len({size for size, _ in expected}) > 1
        assert not set(torch.cat([t for _, t, _ in batches[0]]).tolist()) & set(
            torch.cat([t for _, t, _ in batches[1]]).tolist())  # the shards stay disjoint
        assert same(batches[1], list(runs[1]))  # the epoch again: the same sizes, lengths and crops


def test_a_constant_schedule_gives_exactly_the_unscheduled_batches() -> None:
    store = make_store()
    plain, constant = loader(store), loader(store, schedule=lambda epoch, step: (16, 4))
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        constant.set_epoch(epoch)
        assert same(list(plain), list(constant))
    validation = loader(store, train=False, schedule=SizeSchedule(SIZES, 16, 4))
    assert {images.shape[-1] for images, _, _ in validation} == {16}  # validation stays at the loader's size


@pytest.mark.parametrize("sizes, patch, message", [
    ([48, 40], 16, "train_sizes entry 40 is not a positive multiple of the patch size 16 of m: use 32 or 48"),
    ([8], (16, 16), "entry 8 is not a positive multiple of the patch size 16 of m: use 16"),
    ([21], (14, 7), "patch size 14 of m: use 14 or 28"),
    ([0], 16, "entry 0 is not a positive multiple of the patch size 16 of m: use 16"),
])
def test_a_size_that_does_not_tile_into_patches_is_named_with_a_fix(sizes, patch, message: str) -> None:
    def model(patch_size):
        return SimpleNamespace(patch_embed=SimpleNamespace(patch_size=patch_size))

    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        check_multiple("train_sizes entry", sizes, model(patch), "m")
    check_multiple("train_sizes entry", [48, 64], model(16), "m")
    check_multiple("train_sizes entry", [50, 77], SimpleNamespace(), "m")  # a CNN: any size runs


def test_config_keys_validate_and_leave_the_pipeline_choice_alone() -> None:
    assert build_config().train_sizes == [] and build_config().token_budget is True  # bad ones: test_config.py
    cfg = build_config(CONFIG_DIR / "imagenette_cpu_multires.yaml")
    assert cfg.train_sizes == list(SIZES) and cfg.output == "output/imagenette_cpu_multires" and cfg.img_size == 64
    for overrides in ([], ["pipeline=timm"], ["auto_augment=3a"], ["decoded_cache=false"]):
        with_sizes = build_config(CONFIG_DIR / "imagenette_cpu_multires.yaml", overrides)
        assert loaders.choose_pipeline(with_sizes) == loaders.choose_pipeline(build_config(
            CONFIG_DIR / "imagenette_cpu.yaml", overrides))  # train_sizes plays no part in the choice


@pytest.mark.parametrize("overrides, message", [
    (["batch_size=7", "mixup=0", "cutmix=0", "img_size=32", "train_sizes=[32, 64]"],
     "train_sizes entry 64 leaves 1 image(s) per step under the token budget (batch_size 7 x (32 / 64)^2), and a "
     "step needs at least 2 (Mixup pairs, batch statistics); raise batch_size to 8 or more, drop 64 from "
     "train_sizes, or set token_budget=false"),
    (["batch_size=2", "img_size=224", "train_sizes=[224, 448]"], "entry 448 leaves 0 image(s) per step"),
])
def test_a_budget_under_two_images_per_step_is_an_error_naming_the_size_and_the_fix(overrides: list[str],
                                                                                      message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        build_config(None, overrides)
    build_config(None, [*overrides, "token_budget=false"])  # without the budget every step takes batch_size
    cfg = build_config(None, [*overrides, "batch_size=8"])  # the smallest batch_size the message names is enough
    assert SizeSchedule(tuple(cfg.train_sizes), cfg.img_size, cfg.batch_size).batch_at(max(cfg.train_sizes)) == 2
