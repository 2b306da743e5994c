"""Batched tensor pipeline: its ops against the laws they copy (timm's random-resized crop, timm's eval crop with
torchvision's rounding, roi_align resampling, torchvision's colour jitter), the store (padding, memory mapping,
unreadable images) and the loader (reproducible, resumable epochs, DDP shards, validation coverage, CUDA)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from timm.data import create_transform
from timm.data.transforms import RandomResizedCropAndInterpolation
from torch.utils.data import DistributedSampler

from helpers.stores import make_store, same
from vit_rope.data import folders, pipeline
from vit_rope.data.pipeline import BatchLoader, TensorStore, center_boxes, crop_resize, rrc_boxes
from vit_rope.errors import UserError


def random_sizes(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(20, 51, (count,), generator=gen), torch.randint(20, 51, (count,), generator=gen)


def timm_eval(array: np.ndarray, size: int, crop_pct: float) -> torch.Tensor:
    """timm's eval transform of an HWC uint8 image, in 0..255 units ``[3, s, s]``."""
    tf = create_transform(input_size=(3, size, size), is_training=False, crop_pct=crop_pct, interpolation="bilinear",
                          mean=(0, 0, 0), std=(1, 1, 1))
    return tf(Image.fromarray(array)) * 255


def ours_eval(array: np.ndarray, size: int, crop_pct: float) -> torch.Tensor:
    images = torch.from_numpy(array).permute(2, 0, 1)[None]  # [1, 3, H, W]
    box = center_boxes(torch.tensor([array.shape[0]]), torch.tensor([array.shape[1]]), size, crop_pct)
    return crop_resize(images, box, size)[0]


def test_rrc_boxes_lie_inside_with_area_and_aspect_in_range_and_cover_the_scale_range() -> None:
    heights, widths = random_sizes(4000)
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    boxes = rrc_boxes(heights, widths, scale, ratio, torch.Generator().manual_seed(0)).double()
    x0, y0, x1, y1 = boxes.unbind(1)
    assert torch.equal(boxes, boxes.round()) and (x0 >= 0).all() and (y0 >= 0).all()
    assert (x1 <= widths).all() and (y1 <= heights).all() and (x1 - x0 >= 1).all() and (y1 - y0 >= 1).all()
    fallback = rrc_boxes(heights, widths, (2.0, 3.0), ratio, torch.Generator())  # nothing fits: all fall back
    drawn = (boxes != fallback).any(1)
    assert drawn.float().mean() > 0.97
    w, h, area = (x1 - x0)[drawn], (y1 - y0)[drawn], (heights * widths)[drawn].double()
    # w = round(sqrt(target_area * aspect)), h = round(sqrt(target_area / aspect)): bounds up to rounding
    assert ((w - 0.5) * (h - 0.5) <= scale[1] * area + 1e-9).all() and ((w + 0.5) * (h + 0.5) >= scale[0] * area).all()
    assert ((w - 0.5) / (h + 0.5) <= ratio[1]).all() and ((w + 0.5) / (h - 0.5) >= ratio[0]).all()
    fraction = w * h / area
    assert fraction.min() < 0.1 and fraction.max() > 0.95
    fraction = (lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) / (heights * widths))(
        rrc_boxes(heights, widths, (0.35, 1.0), ratio, torch.Generator().manual_seed(1)))
    assert 0.3 < fraction.min() < 0.4 and fraction.max() > 0.95


@pytest.mark.parametrize("height, width", [(10, 100), (100, 10), (40, 45), (30, 41), (41, 30), (20, 50), (50, 50)])
def test_rrc_fallback_is_timms_clamped_center_crop(height: int, width: int) -> None:
    i, j, h, w = RandomResizedCropAndInterpolation.get_params(Image.new("RGB", (width, height)), (2.0, 3.0),
                                                             (3 / 4, 4 / 3))
    box = rrc_boxes(torch.tensor([height]), torch.tensor([width]), (2.0, 3.0), generator=torch.Generator())
    assert box[0].tolist() == [j, i, j + w, i + h]


def test_rrc_no_attempt_fits_an_elongated_image() -> None:
    boxes = rrc_boxes(torch.full((50,), 10), torch.full((50,), 100), (0.9, 1.0), generator=torch.Generator())
    assert boxes.tolist() == [[43.0, 0.0, 56.0, 10.0]] * 50  # h = 10, w = round(10 * 4/3), centred


def test_rrc_law_matches_timm_statistically() -> None:
    height, width, count, scale = 37, 53, 4000, (0.35, 1.0)
    random.seed(0)
    image = Image.new("RGB", (width, height))
    theirs = torch.tensor([RandomResizedCropAndInterpolation.get_params(image, scale, (3 / 4, 4 / 3))
                           for _ in range(count)], dtype=torch.float64)  # i, j, h, w
    theirs = torch.stack([theirs[:, 1], theirs[:, 0], theirs[:, 1] + theirs[:, 3], theirs[:, 0] + theirs[:, 2]], 1)
    ours = rrc_boxes(torch.full((count,), height), torch.full((count,), width), scale,
                     generator=torch.Generator().manual_seed(0)).double()

    def stats(b: torch.Tensor) -> torch.Tensor:
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        return torch.stack([w * h / (height * width), w / h, (b[:, 0] + b[:, 2]) / 2 / width,
                            (b[:, 1] + b[:, 3]) / 2 / height]).mean(1)

    assert torch.allclose(stats(ours), stats(theirs), atol=0.02), (stats(ours), stats(theirs))


def test_rrc_boxes_are_deterministic_for_a_seed() -> None:
    heights, widths = random_sizes(64)
    first, again, other = (rrc_boxes(heights, widths, generator=torch.Generator().manual_seed(s)) for s in (3, 3, 4))
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("height, width, size, crop_pct", [(40, 60, 20, 0.5), (40, 61, 20, 0.5), (61, 40, 20, 0.5),
                                                           (42, 47, 21, 0.5), (32, 32, 32, 1.0), (44, 70, 39, 0.875)])
def test_center_boxes_show_exactly_timms_eval_region(height: int, width: int, size: int, crop_pct: float) -> None:
    # the short side already is floor(size / crop_pct): no resampling, so every pixel must match exactly
    array = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    assert torch.allclose(ours_eval(array, size, crop_pct), timm_eval(array, size, crop_pct), atol=1e-3)


def test_center_boxes_follow_torchvisions_rounding() -> None:
    # 50 x 70 -> short side floor(32 / 0.875) = 36, long side int(36 * 70 / 50) = 50; crop 32 at top 2, left 9
    box = center_boxes(torch.tensor([50]), torch.tensor([70]), 32, 0.875)[0]
    assert torch.allclose(box, torch.tensor([9 * 70 / 50, 2 * 50 / 36, 41 * 70 / 50, 34 * 50 / 36]))


@pytest.mark.parametrize("height, width, size, crop_pct", [(50, 70, 32, 0.875), (90, 64, 24, 0.9), (64, 96, 16, 0.5)])
def test_center_crops_match_timms_eval_transform_after_resampling(height: int, width: int, size: int,
                                                                  crop_pct: float) -> None:
    y, x = np.mgrid[0:height, 0:width]
    array = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height) + 64], -1).astype(np.uint8)
    diff = (ours_eval(array, size, crop_pct) - timm_eval(array, size, crop_pct)).abs()
    assert diff.mean() < 0.5 and diff.max() < 2  # gray levels; a half-pixel shift would exceed 2


def test_crop_resize_of_the_whole_image_at_its_own_size_is_the_identity() -> None:
    images = torch.randint(0, 256, (3, 3, 24, 24), dtype=torch.uint8)
    out = crop_resize(images, torch.tensor([[0.0, 0.0, 24.0, 24.0]] * 3), 24)
    assert out.dtype == torch.float32 and torch.allclose(out, images.float(), atol=1e-3)


def test_crop_resize_by_half_is_two_by_two_average_pooling() -> None:
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    out = crop_resize(images, torch.tensor([[0.0, 0.0, 32.0, 32.0]] * 2), 16)
    assert torch.allclose(out, torch.nn.functional.avg_pool2d(images.float(), 2), atol=1e-3)


def test_jitter_factors_lie_in_torchvisions_ranges() -> None:
    for strength, (lo, hi) in ((0.4, (0.6, 1.4)), (1.5, (0.0, 2.5)), (0.0, (1.0, 1.0))):
        factors = pipeline.jitter_factors(2000, strength, torch.Generator().manual_seed(0))
        assert factors.shape == (2000, 3) and factors.min() >= lo and factors.max() <= hi
        assert factors.min() < lo + 0.01 and factors.max() > hi - 0.01
    images = torch.rand(4, 3, 8, 8) * 255
    assert torch.equal(pipeline.color_jitter(images, torch.ones(4, 3)), images)


def test_color_jitter_has_torchvisions_semantics() -> None:
    images = torch.rand(6, 3, 12, 12) * 255
    factors = pipeline.jitter_factors(6, 0.8, torch.Generator().manual_seed(0))
    ours = pipeline.color_jitter(images, factors)
    for image, (b, c, s), out in zip(images / 255, factors.tolist(), ours, strict=True):
        theirs = TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(image, b), c), s) * 255
        assert torch.allclose(out, theirs, atol=0.2)  # torchvision's tensor grayscale weighs red 0.2989, not 0.299


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

    monkeypatch.setattr(folders, "decode_image", refuse)
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
