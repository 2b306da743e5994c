"""The steps of an epoch (``vit_rope.data.steps.StepSampler``) and the per-image pipeline with ``train_sizes``: sizes
and batches as the schedule draws them, the same plan as the tensor pipeline, timm's transform built once per size,
augmentation that depends neither on the loader workers nor on where a run resumed."""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, DistributedSampler

from helpers.stores import same
from helpers.training import PER_IMAGE, indexed_loaders
from vit_rope.data.pipeline import BatchLoader
from vit_rope.data.steps import SizeSchedule, StepSampler, sample_seeds
from vit_rope.train import loaders


def sampler(n: int = 40, batch_size: int = 4, schedule=None, rank: int = 0, world_size: int = 1) -> StepSampler:
    order = DistributedSampler(range(n), world_size, rank, shuffle=True, seed=3)
    return StepSampler(order, batch_size, 16, schedule, seed=3, rank=rank)


def epoch(loader, number: int, start_step: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    loaders.set_epoch(loader, number, start_step)
    return list(loader)


def test_steps_follow_the_schedule_and_walk_the_epoch_order_wrapping_around() -> None:
    schedule = SizeSchedule((8, 16, 24), 16, 4, seed=5)
    steps = sampler(schedule=schedule)
    steps.set_epoch(2)
    plan = steps.plan()
    assert len(steps) == len(plan) == 10  # 40 images // 4, whatever the sizes
    assert [(size, len(indices)) for size, indices in plan] == [schedule(2, step) for step in range(10)]
    order = list(steps.order)
    flat = torch.cat([indices for _, indices in plan]).tolist()
    assert flat == [order[i % 40] for i in range(len(flat))] and len({size for size, _ in plan}) == 3
    items = list(steps)
    assert [[(index, size) for index, size, _ in step] for step in items] == [
        [(index, size) for index in indices.tolist()] for size, indices in plan]


def test_without_a_schedule_the_steps_are_the_drop_last_batches_of_the_order() -> None:
    steps = sampler(41, batch_size=6)
    steps.set_epoch(4)
    plain = DataLoader(range(41), 6, sampler=steps.order, drop_last=True)
    assert [[index for index, _, _ in step] for step in steps] == [batch.tolist() for batch in plain]
    assert {size for step in steps for _, size, _ in step} == {16}


def test_a_mid_epoch_start_yields_the_rest_of_the_epoch_and_len_stays_whole() -> None:
    steps = sampler(schedule=SizeSchedule((8, 16, 24), 16, 4, seed=5))
    steps.set_epoch(1)
    whole = list(steps)
    steps.set_epoch(1, start_step=7)
    assert list(steps) == whole[7:] and len(steps) == 10
    with pytest.raises(ValueError, match="start_step 11 is outside the epoch's 10 steps"):
        steps.set_epoch(1, start_step=11)


def test_augmentation_seeds_are_a_function_of_seed_epoch_rank_step_and_position() -> None:
    seeds = {(epoch, rank, step): tuple(sample_seeds(0, epoch, rank, step, 8)) for epoch in range(3)
             for rank in range(2) for step in range(20)}
    assert all(tuple(sample_seeds(0, *key, 8)) == value for key, value in seeds.items())  # no hidden state
    flat = [seed for value in seeds.values() for seed in value]
    assert len(set(flat)) == len(flat)  # every image of every step, rank and epoch its own stream
    assert sample_seeds(0, 0, 0, 0, 3) == sample_seeds(0, 0, 0, 0, 8)[:3] != sample_seeds(1, 0, 0, 0, 3)


def test_both_pipelines_cut_the_same_steps_from_the_same_config(image_root: Path) -> None:
    tensor, _ = indexed_loaders(image_root, *PER_IMAGE, "decoded_cache=true", "auto_augment=null", "reprob=0")
    per_image, _ = indexed_loaders(image_root, *PER_IMAGE, "decoded_cache=true")
    assert isinstance(tensor, BatchLoader) and isinstance(per_image, DataLoader)
    for number in (0, 3):
        tensor.set_epoch(number)
        per_image.batch_sampler.set_epoch(number)
        plan = [(size, indices.tolist()) for size, indices in tensor.steps.plan()]
        assert plan == [(size, indices.tolist()) for size, indices in per_image.batch_sampler.plan()]
        batches = epoch(per_image, number)
        assert [(images.shape[-1], targets.tolist()) for images, targets, _ in batches] == plan


def test_per_image_batches_depend_neither_on_workers_nor_on_a_mid_epoch_resume(image_root: Path) -> None:
    in_process, _ = indexed_loaders(image_root, *PER_IMAGE)
    with_workers, _ = indexed_loaders(image_root, *PER_IMAGE, "workers=2")
    first = epoch(in_process, 1)
    assert len(first) == 3 and len({images.shape[-1] for images, _, _ in first + epoch(in_process, 2)}) > 1
    assert same(first, epoch(with_workers, 1))  # RandAugment, erasing: each image seeded, whichever worker runs it
    assert same(first[1:], epoch(with_workers, 1, start_step=1)) and same(first[2:], epoch(in_process, 1, 2))
    assert not same(first, epoch(in_process, 2)[:len(first)])


def test_loader_workers_start_once_per_run_and_serve_every_pass(image_root: Path) -> None:
    """Forking new workers as the last ones shut down (the next epoch; with an EMA, its validation pass right after the
    model's) can hang a DDP rank, so the per-image loaders keep their workers; every pass still sees its whole split
    in order, and each training epoch the batches set_epoch chose."""
    train, val = indexed_loaders(image_root, *PER_IMAGE, "workers=2")
    in_process, _ = indexed_loaders(image_root, *PER_IMAGE)
    before = {child.pid for child in multiprocessing.active_children()}

    def workers() -> set[int]:
        return {child.pid for child in multiprocessing.active_children()} - before

    passes = [[(images, targets) for images, targets, _ in val]]
    started = workers()
    passes += [[(images, targets) for images, targets, _ in val] for _ in range(2)]
    assert len(started) == 2 and workers() == started
    assert sum(len(targets) for _, targets in passes[0]) == 12  # the tiny ImageFolder: 3 classes x 4 val images
    assert all(same(passes[0], other) for other in passes[1:])
    first = epoch(train, 1)
    started = workers()
    assert len(started) == 4 and same(epoch(train, 2), epoch(in_process, 2)) and workers() == started
    assert same(first, epoch(in_process, 1))


def test_in_process_augmentation_leaves_the_training_random_state_alone(image_root: Path) -> None:
    loader, _ = indexed_loaders(image_root, *PER_IMAGE)
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = random.random(), np.random.rand(), torch.rand(1)  # what drop-path and Mixup would draw next
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    epoch(loader, 0)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_timms_transform_is_built_once_per_size_and_each_step_trains_at_its_size(image_root: Path,
                                                                                  monkeypatch) -> None:
    built = []
    real = loaders.create_transform

    def counting(input_size, **kwargs):
        built.append((input_size, kwargs["is_training"]))
        return real(input_size, **kwargs)

    monkeypatch.setattr(loaders, "create_transform", counting)
    train, val = indexed_loaders(image_root, *PER_IMAGE, "workers=1")
    assert sorted(built) == [((3, 16, 16), True), ((3, 32, 32), False), ((3, 32, 32), True), ((3, 48, 48), True)]
    for number in range(3):
        loaders.set_epoch(train, number)
        sizes = [size for size, _ in train.batch_sampler.plan()]
        assert [tuple(images.shape[1:]) for images, _, _ in train] == [(3, size, size) for size in sizes]
    assert len(built) == 4  # the count is the property: no transform built per image, per step or per epoch
    assert {tuple(images.shape[1:]) for images, _, _ in val} == {(3, 32, 32)}  # validation at img_size


def test_repeated_augmentation_keeps_timms_sampler_under_train_sizes(image_root: Path) -> None:
    loader, _ = indexed_loaders(image_root, *PER_IMAGE, "repeated_aug=true")
    assert isinstance(loader.batch_sampler.order, RepeatAugSampler)
    loader.batch_sampler.set_epoch(0)
    order = list(loader.batch_sampler.order)
    assert order[0::3] == order[1::3] == order[2::3]  # each image three times in a row, for three augmentations
    batches = epoch(loader, 0)
    seen = torch.cat([targets for _, targets, _ in batches]).tolist()
    assert seen == [order[i % len(order)] for i in range(len(seen))]
    pairs = [(images[j - 1], images[j]) for images, targets, _ in batches for j in range(1, len(targets))
             if targets[j] == targets[j - 1]]
    assert pairs and not any(torch.equal(a, b) for a, b in pairs)  # one image's copies are augmented apart
