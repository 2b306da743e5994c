"""timm's NaFlex batches through ``vit_rope.data.naflex_loader``: step order, seeds, ranks, Mixup, erasing, bad
files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from timm.data import NaFlexMixup, create_transform
from timm.data.naflex_random_erasing import PatchRandomErasing
from torch.utils.data import DataLoader

from helpers.training import write_image_folder
from vit_rope.data.folders import Images, find_images
from vit_rope.data.naflex_loader import NaFlexLoader, NaFlexSteps

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def transform_factory(max_seq_len: int, patch_size: tuple[int, int]):
    return create_transform(is_training=True, naflex=True, max_seq_len=max_seq_len, patch_size=patch_size,
                            scale=(0.3, 1.0), ratio=(0.5, 2.0), auto_augment="rand-m9-mstd0.5-inc1",
                            use_prefetcher=True)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, int]]:
    root = write_image_folder(tmp_path_factory.mktemp("naflex"), train_per_class=10)
    return find_images(root / "train")[0]


def loader(samples: list, workers: int = 0, rank: int = 0, world_size: int = 1, mixup: bool = False,
           erase: bool = False) -> NaFlexLoader:
    steps = NaFlexSteps(Images(samples), transform_factory, seq_lens=(4, 9, 16), max_tokens_per_batch=64,
                        patch_size=8, seed=3, rank=rank, world_size=world_size, batch_divisor=1,
                        mixup=NaFlexMixup(num_classes=3) if mixup else None)
    erasing = PatchRandomErasing(erase_prob=1.0, mode="pixel", device="cpu") if erase else None
    data = DataLoader(steps, batch_size=None, num_workers=workers, persistent_workers=workers > 0)  # as training's
    return NaFlexLoader(data, MEAN, STD, torch.device("cpu"), erasing=erasing, seed=3, rank=rank)


def epoch(data: NaFlexLoader, index: int, start: int = 0) -> list[tuple[dict, torch.Tensor, torch.Tensor]]:
    data.set_epoch(index, start)
    return list(data)


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (inputs_a, targets_a, _), (inputs_b, targets_b, _) in zip(a, b, strict=True):
        assert inputs_a.keys() == inputs_b.keys()
        for key in ("patches", "patch_coord", "patch_valid"):
            torch.testing.assert_close(inputs_a[key], inputs_b[key], rtol=0, atol=0)
        torch.testing.assert_close(targets_a, targets_b, rtol=0, atol=0)


def test_a_step_is_the_same_batch_whatever_the_workers_and_wherever_the_epoch_starts(samples: list) -> None:
    # every source of randomness on: RandAugment, the crop to the token budget, Mixup/CutMix, patch erasing
    in_process = epoch(loader(samples, mixup=True, erase=True), 1)
    with_workers = loader(samples, workers=2, mixup=True, erase=True)
    assert_same(in_process, epoch(with_workers, 1))
    assert_same(in_process[2:], epoch(loader(samples, mixup=True, erase=True), 1, start=2))  # a resumed epoch
    assert_same(in_process[2:], epoch(with_workers, 1, start=2))  # set_epoch reaches the running workers
    other = epoch(loader(samples, mixup=True, erase=True), 2)
    assert not torch.equal(other[0][0]["patches"][:1], in_process[0][0]["patches"][:1])  # a new epoch, new draws
    assert_same(other, epoch(with_workers, 2))


def test_batches_hold_native_aspect_ratios_within_each_steps_sequence_length(samples: list) -> None:
    data = loader(samples)
    batches = epoch(data, 0)
    assert len(batches) == len(data) == len(data.steps.schedule)
    assert sum(len(targets) for _, targets, _ in batches) == len(samples)  # one pass over the split
    for inputs, targets, skipped in batches:
        length = inputs["patches"].shape[1]
        assert length in (4, 9, 16) and len(targets) <= 64 // length  # 64 tokens a step, the last one fewer
        assert inputs["patches"].shape[2] == 8 * 8 * 3 and skipped.tolist() == [0] * len(targets)
        for coord, valid in zip(inputs["patch_coord"], inputs["patch_valid"], strict=True):
            rows, cols = coord[valid].max(0).values + 1
            assert rows * cols == valid.sum() <= length  # a full grid of its own aspect ratio, then padding
            assert not coord[~valid].any()  # padding sits at (0, 0), masked out by patch_valid
    assert abs(batches[0][0]["patches"].mean()) < 3  # normalised by the prefetcher, not raw 0-255 pixels


def test_ranks_share_the_schedule_and_split_the_images(samples: list) -> None:
    ranks = [epoch(loader(samples, rank=rank, world_size=2), 0) for rank in (0, 1)]
    assert [inputs["patches"].shape[:2] for inputs, _, _ in ranks[0]] == [
        inputs["patches"].shape[:2] for inputs, _, _ in ranks[1]]  # the same lengths and batches at every step
    first = [inputs["patches"][0, 0] for inputs, _, _ in ranks[0]]
    assert not any(torch.equal(a, inputs["patches"][0, 0]) for a, (inputs, _, _) in zip(first, ranks[1], strict=True))


def test_mixup_makes_soft_targets_in_the_loader(samples: list) -> None:
    for _, targets, _ in epoch(loader(samples, mixup=True), 0):
        assert targets.shape == (len(targets), 3) and torch.allclose(targets.sum(1), torch.ones(len(targets)))
        assert targets.min() >= 0


def test_an_unreadable_image_is_replaced_and_counted(tmp_path: Path, samples: list) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    broken = [(str(bad), 0), *samples[1:]]
    batches = epoch(loader(broken), 0)
    assert sum(int(skipped.sum()) for _, _, skipped in batches) == 1
    assert sum(len(targets) for _, targets, _ in batches) == len(broken)  # the batch kept its size


def test_start_step_outside_the_epoch_is_refused(samples: list) -> None:
    data = loader(samples)
    with pytest.raises(ValueError, match="start_step 99 is outside the epoch's"):
        data.set_epoch(0, 99)
