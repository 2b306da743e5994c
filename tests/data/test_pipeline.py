"""Batched tensor pipeline: the store (padding, memory mapping, unreadable images) and the loader (reproducible,
resumable epochs, DDP shards, validation coverage, CUDA). The ops it calls are tested in test_augment.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from helpers.stores import make_store, same
from vit_rope.data.augment import crop_resize
from vit_rope.data.pipeline import BatchLoader, TensorStore
from vit_rope.errors import UserError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def loader(store: TensorStore, train: bool = True, **kwargs) -> BatchLoader:
    options = {"batch_size": 4, "size": 16, "train": train, "scale": (0.35, 1.0), "color_jitter": 0.4, "seed": 0,
               "mean": MEAN, "std": STD} | kwargs
    return BatchLoader(store, **options)


# ---- store and loader -----------------------------------------------------------------------------------------------


def test_padding_of_a_smaller_image_does_not_leak_into_its_crops() -> None:
    store = make_store(2, seed=3)
    padded, heights, widths = store.gather(torch.tensor([0, 1]))
    small = int((heights * widths).argmin())
    alone, _, _ = store.gather(torch.tensor([small]))
    box = torch.tensor([[widths[small] - 7.0, heights[small] - 5.0, float(widths[small]), float(heights[small])]])
    upscaled = crop_resize(padded, torch.cat([box, box]), 29)[small]  # samples up to half a pixel off the edge
    assert torch.allclose(upscaled, crop_resize(alone, box, 29)[0], atol=1e-4)


def test_hflip_one_mirrors_hflip_zero_under_the_same_random_state() -> None:
    store = make_store()
    plain, mirrored = (list(loader(store, hflip=p, color_jitter=0.4)) for p in (0.0, 1.0))
    for (a, ta, _), (b, tb, _) in zip(plain, mirrored, strict=True):
        assert torch.equal(ta, tb) and torch.allclose(a.flip(-1), b, atol=1e-5)


def test_output_is_normalised_float_on_the_device_with_long_targets() -> None:
    store = make_store(value=128)
    for train in (True, False):
        images, targets, skipped = next(iter(loader(store, train, color_jitter=0.0)))
        expected = ((128 / 255 - torch.tensor(MEAN)) / torch.tensor(STD))[None, :, None, None].expand(4, 3, 16, 16)
        assert images.dtype == torch.float32 and images.shape == (4, 3, 16, 16)
        assert targets.dtype == torch.long and targets.shape == (4,) and skipped.dtype == torch.long
        assert skipped.dim() == 0 and torch.allclose(images, expected, atol=1e-5)


def test_training_epochs_are_reproducible_resumable_and_differ_between_epochs() -> None:
    store = make_store()
    run = loader(store)
    first, again = list(run), list(run)
    run.set_epoch(1)
    second = list(run)
    resumed = loader(store)
    resumed.set_epoch(1)  # a run resumed at the start of epoch 1
    assert len(first) == len(run) == 10 and same(first, again) and same(second, list(resumed))
    assert not any(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))
    assert not same(first, list(loader(store, seed=1)))


def test_ranks_get_disjoint_distributed_sampler_shards_of_full_batches() -> None:
    store = make_store(41)
    seen = []
    for rank in (0, 1):
        run = loader(store, rank=rank, world_size=2, batch_size=3)
        run.set_epoch(2)
        targets = torch.cat([t for _, t, _ in run]).tolist()
        sampler = DistributedSampler(range(41), 2, rank, shuffle=True, seed=0)
        sampler.set_epoch(2)
        assert len(run) == 7 and targets == list(sampler)[:21]  # 21 per rank (padded), 7 full batches
        seen.append(set(targets))
    run = loader(make_store(40), world_size=2)
    shards = [set(torch.cat([t for _, t, _ in loader(run.store, rank=r, world_size=2)]).tolist()) for r in (0, 1)]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(40))


def test_validation_covers_every_image_once_across_ranks_with_the_last_partial_batch() -> None:
    store = make_store()
    targets, sizes = [], []
    for rank in range(3):
        run = loader(store, train=False, rank=rank, world_size=3)
        batches = list(run)
        assert len(batches) == len(run) and torch.equal(torch.cat([t for _, t, _ in batches]),
                                                        torch.arange(rank, 40, 3))
        targets += torch.cat([t for _, t, _ in batches]).tolist()
        sizes += [len(t) for _, t, _ in batches]
    assert sorted(targets) == list(range(40)) and sizes == [4, 4, 4, 2, 4, 4, 4, 1, 4, 4, 4, 1]
    assert same(batches, list(run))  # no randomness


def test_unreadable_images_are_replaced_by_the_next_readable_one_and_counted() -> None:
    store = make_store(unreadable=(3, 4, 39))
    resolved, skips = store.resolve(torch.tensor([3, 4, 5, 39]))
    assert resolved.tolist() == [5, 5, 5, 0] and skips.tolist() == [2, 1, 0, 1]
    batches = list(loader(store, train=False))
    assert torch.cat([t for _, t, _ in batches]).tolist() == [0, 1, 2, 5, 5] + list(range(5, 39)) + [0]
    assert sum(int(s) for _, _, s in batches) == 4
    train = list(loader(store))
    assert sum(int(s) for _, _, s in train) == 4 and 3 not in torch.cat([t for _, t, _ in train]).tolist()
    with pytest.raises(ValueError, match="resolve"):
        store.gather(torch.tensor([4]))


def test_unreadable_images_are_named_by_their_file_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(unreadable=(3, 4))
    named = TensorStore(store.data, store.offsets, store.shapes, store.targets, [f"/data/{i}.jpg" for i in range(40)])
    with caplog.at_level(logging.WARNING, logger="vit_rope.data.pipeline"):
        loader(named, train=False).make_batch(torch.tensor([2, 3, 4]), 16, None)
        loader(store, train=False).make_batch(torch.tensor([3]), 16, None)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["replacing unreadable image(s) /data/3.jpg, /data/4.jpg by the next readable one",
                        "replacing unreadable image(s) #3 by the next readable one"]  # no paths: indices
    with pytest.raises(ValueError, match="40 targets, 2 paths"):
        TensorStore(store.data, store.offsets, store.shapes, store.targets, ["a", "b"])


def test_a_store_of_unreadable_images_is_an_error_that_says_what_to_do() -> None:
    store = make_store(n=3)
    undecoded = torch.zeros_like(store.shapes)  # height 0: an image that could not be decoded
    with pytest.raises(UserError, match=r"none of the 3 images of this split could be decoded \(the first: /d/0.jpg\): "
                                        "replace the corrupt files"):
        TensorStore(store.data, store.offsets, undecoded, store.targets, [f"/d/{i}.jpg" for i in range(3)])


def test_the_loader_reads_only_the_store_never_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("an image was decoded again")

    import vit_rope.data.decoded

    monkeypatch.setattr(vit_rope.data.decoded, "decode_image", refuse)
    monkeypatch.setattr(Image, "open", refuse)
    store = make_store(unreadable=(7,))
    assert len(list(loader(store))) == 10 and len(list(loader(store, train=False))) == 10


def test_a_memory_mapped_store_is_shared_not_copied(tmp_path: Path) -> None:
    store = make_store()
    torch.save({"data": store.data, "offsets": store.offsets, "shapes": store.shapes}, tmp_path / "cache.pt")
    cache = torch.load(tmp_path / "cache.pt", mmap=True, weights_only=True)
    mapped = TensorStore(cache["data"], cache["offsets"], cache["shapes"], store.targets)
    assert mapped.data.data_ptr() == cache["data"].data_ptr() and same(list(loader(store)), list(loader(mapped)))


def test_make_batch_takes_any_size_and_batch_length_per_call() -> None:
    run = loader(make_store())
    images, targets, _ = run.make_batch(torch.arange(7), 24, torch.Generator().manual_seed(0))
    assert images.shape == (7, 3, 24, 24) and targets.tolist() == list(range(7))
    assert "train" in run.describe() and "40 decoded images" in repr(run)


@pytest.mark.cuda
@pytest.mark.parametrize("store_on_gpu", [False, True])
def test_cuda_batches_match_cpu_batches(store_on_gpu: bool) -> None:
    store = make_store(unreadable=(2,))
    for train in (True, False):
        cpu = list(loader(store, train))
        gpu = list(loader(store.to("cuda") if store_on_gpu else store, train, device="cuda"))
        for (a, ta, sa), (b, tb, sb) in zip(cpu, gpu, strict=True):
            assert b.is_cuda and tb.is_cuda and torch.equal(ta, tb.cpu()) and torch.equal(sa, sb)
            assert torch.allclose(a, b.cpu(), atol=1e-3)
