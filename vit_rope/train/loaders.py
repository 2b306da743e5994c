"""Training and validation loaders from a config: the optional decoded cache and timm's per-image pipeline, the
batched one or timm's NaFlex loader, resumable at any step to the same batches (docs/training.md, "Data pipelines").
timm's auto-augment is made safe under the installed Pillow and probed before the loader starts, so that no string can
stop a run mid-epoch in a loader worker: timm's Posterize asks for 0 bits at some magnitudes, a black image before
Pillow 13, a ``ValueError`` since. ``make_safe`` gives the black image; ``safe_transform`` refuses what still raises."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import PIL
import torch
from PIL import Image
from timm.data import NaFlexMixup, create_transform
from timm.data import auto_augment as timm_aa
from timm.data.auto_augment import AugmentOp
from timm.data.distributed_sampler import RepeatAugSampler
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_random_erasing import PatchRandomErasing
from torch.utils.data import DataLoader, DistributedSampler, Subset

from vit_rope.data.folders import DecodedImages, ImageFolderDataset, Images, Sample, SizedImages
from vit_rope.data.naflex_loader import NaFlexLoader, NaFlexSteps
from vit_rope.data.pipeline import BatchLoader, TensorStore
from vit_rope.data.steps import SizeSchedule, StepSampler, global_rng_kept
from vit_rope.errors import UserError
from vit_rope.train.config import Config

Loader = DataLoader | BatchLoader | NaFlexLoader
T = TypeVar("T")
WORKING = "rand-m9-mstd0.5-inc1"  # DeiT's RandAugment, as timm documents it
_LEVEL_DENOM = 10.0  # timm's upper bound of the magnitude unless ``mmax`` is set (``AugmentOp.__call__``)


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's ``posterize``, with ``bits_to_keep <= 0`` the black image of Pillow < 13 (not Pillow 13's error)."""
    if bits_to_keep < 1:
        return img.point([0] * 256 * len(img.getbands()))
    return timm_aa.posterize(img, bits_to_keep, **kwargs)


def augment_ops(transform: Any) -> list[AugmentOp]:
    """Every ``AugmentOp`` inside ``transform`` (a ``Compose``, ``RandAugment``, ``AugMixAugment``, ``AutoAugment``)."""
    if isinstance(transform, AugmentOp):
        return [transform]
    if isinstance(transform, (list, tuple)):
        return [op for item in transform for op in augment_ops(item)]
    return [op for name in ("transforms", "ops", "policy") for op in augment_ops(getattr(transform, name, ()))]


def make_safe(transform: T) -> T:
    """``transform`` with timm's ``posterize`` replaced by ours in each op: per instance, so timm's module is
    untouched; module-level, so the transform still pickles into spawned workers."""
    for op in augment_ops(transform):
        if op.aug_fn is timm_aa.posterize:
            op.aug_fn = posterize
    return transform


def failures(transform: Any) -> list[str]:
    """Each op of ``transform`` that raises at an end of its magnitude range (timm's level functions are monotonic,
    so the ends bound every argument), with both signs and every interpolation the op picks from."""
    # every 8-bit value in each channel, for the lookup-table ops
    image = Image.frombytes("RGB", (16, 16), bytes(value for value in range(256) for _ in range(3)))
    found: list[str] = []
    with global_rng_kept():
        for op in augment_ops(transform):
            resample = op.kwargs.get("resample")
            modes = resample if isinstance(resample, (list, tuple)) else (resample,)
            upper = op.magnitude_max or _LEVEL_DENOM  # the magnitudes AugmentOp.__call__ can pass to the level_fn
            own = max(0.0, min(float(op.magnitude), upper))
            ends = (0.0, own) if op.magnitude_std == float("inf") else (0.0, upper) if op.magnitude_std > 0 else (own,)
            for magnitude, seed, mode in itertools.product(ends, (0, 1), modes):
                random.seed(seed)  # the sign of the level functions' _randomly_negate
                args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()
                try:
                    op.aug_fn(image, *args, **{**op.kwargs, "resample": mode})
                except Exception as err:  # whatever it is, it would kill a loader worker
                    found.append(f"{op.name} at magnitude {magnitude:g}: {type(err).__name__}: {err}")
    return list(dict.fromkeys(found))


def safe_transform(build: Callable[[str | None], T], auto_augment: str | None) -> T:
    """``make_safe(build(auto_augment))``, or a ``UserError`` if an op still raises under the installed Pillow."""
    found = failures(transform := make_safe(build(auto_augment)))
    if not found:
        return transform
    fix = "null for none" if failures(make_safe(build(WORKING))) else f"{WORKING} (DeiT's RandAugment)"
    raise UserError(f"auto_augment={auto_augment} would stop the run in a data loader worker under Pillow "
                    f"{PIL.__version__}: timm's {found[0]}; use auto_augment={fix}, or change the setting the error "
                    "names")


def _normalised(data_config: dict[str, Any]) -> dict[str, Any]:
    return {key: data_config[key] for key in ("interpolation", "mean", "std")}


def _train_transform(cfg: Config, data_config: dict[str, Any], **options: Any) -> Any:
    return safe_transform(lambda auto_augment: create_transform(
        is_training=True, scale=tuple(cfg.scale), hflip=cfg.hflip, color_jitter=cfg.color_jitter,
        auto_augment=auto_augment, **_normalised(data_config), **options), cfg.auto_augment)


def build_transforms(cfg: Config, data_config: dict[str, Any]) -> tuple[dict[int, Any], Any]:
    """timm's train transforms, one per training size, and its eval transform at ``img_size``."""
    train = {size: _train_transform(cfg, data_config, input_size=(3, size, size), train_crop_mode=cfg.train_crop_mode,
                                    re_prob=cfg.reprob, re_mode="pixel")
             for size in sorted(set(cfg.train_sizes) or {cfg.img_size})}
    val = create_transform(data_config["input_size"], is_training=False, crop_pct=data_config["crop_pct"],
                           crop_mode=data_config["crop_mode"], **_normalised(data_config))
    return train, val


def choose_pipeline(cfg: Config) -> tuple[str, str]:
    """``(pipeline, why)``: the batched one when the decoded cache is on and every augmentation batches."""
    if cfg.naflex:  # train.config_checks.check_config refuses pipeline=tensor and what NaFlex cannot do
        lengths = " ".join(map(str, cfg.naflex_seq_lens))
        return "naflex", f"naflex=true: native aspect ratios, sequence lengths {lengths}"
    per_image = [reason for reason, present in (
        ("decoded_cache is off", not cfg.decoded_cache),
        (f"auto_augment={cfg.auto_augment} is per image", cfg.auto_augment),
        (f"random erasing (reprob={cfg.reprob}) is per image", cfg.reprob > 0),
        (f"train_crop_mode={cfg.train_crop_mode} is timm's only", cfg.train_crop_mode != "rrc"),
        ("repeated_aug needs timm's sampler", cfg.repeated_aug)) if present]
    if cfg.pipeline == "timm":
        return "timm", "pipeline=timm"
    if not per_image:
        return "tensor", "decoded cache on and every augmentation of the config batches"
    if cfg.pipeline == "tensor":
        raise UserError(f"pipeline=tensor cannot run this config: {'; '.join(per_image)}; change those keys or set "
                        "pipeline=auto")
    return "timm", "; ".join(per_image)


def build_loaders(cfg: Config, train_samples: list[Sample], val_samples: list[Sample], data_config: dict[str, Any],
                  rank: int = 0, world_size: int = 1, device: torch.device | None = None, *, patch: int = 16,
                  num_classes: int = 0) -> tuple[Loader, Loader]:
    """Training and validation loaders (a disjoint slice per rank, no padding, so reduced accuracies are exact). The
    train cache's short side covers the largest training size (validation keeps its own, so its numbers do not move)."""
    device = device or torch.device("cpu")
    pipeline, why = choose_pipeline(cfg)
    if len(train_samples) < cfg.batch_size * world_size:
        raise UserError(f"the train split has {len(train_samples)} images, fewer than one batch of {cfg.batch_size} x "
                        f"{world_size} process(es); lower batch_size")
    if rank == 0:
        print(f"data pipeline: {pipeline} ({why})", flush=True)
    train_cache = val_cache = None
    if cfg.decoded_cache:
        short_side = cfg.cache_size or math.floor(cfg.img_size / data_config["crop_pct"])
        largest = [math.ceil(math.sqrt(max(cfg.naflex_seq_lens))) * patch] if cfg.naflex else cfg.train_sizes
        train_side = max([short_side, *largest])  # crops at the largest train size need its pixels
        cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else None
        if rank == 0:
            sides = f"{short_side} px" if train_side == short_side else (
                f"{train_side} px (train: the largest of train_sizes), {short_side} px (val)")
            print(f"decoded cache: {len(train_samples) + len(val_samples)} images at short side {sides}"
                  + (f" in {cache_dir}" if cache_dir else " in memory"), flush=True)
        decoders = max(cfg.workers, os.cpu_count() or 1)  # a one-off job with nothing else running: every core
        train_cache, val_cache = (DecodedImages.load_or_build([path for path, _ in samples], side, decoders, cache_dir)
                                  for samples, side in ((train_samples, train_side), (val_samples, short_side)))
    schedule = SizeSchedule(tuple(cfg.train_sizes), cfg.img_size, cfg.batch_size, cfg.seed, cfg.token_budget,
                            even=cfg.mixup > 0 or cfg.cutmix > 0) if cfg.train_sizes else None
    args = (cfg, Images(train_samples, cache=train_cache), Images(val_samples, cache=val_cache), data_config, rank,
            world_size, device)
    if pipeline == "naflex":
        train, val = _naflex_loaders(*args, patch, num_classes)
    else:
        train, val = (_tensor_loaders if pipeline == "tensor" else _per_image_loaders)(*args, schedule)
    if rank == 0 and schedule is not None:
        print(schedule.describe(), flush=True)
    return train, val


def _workers(cfg: Config, device: torch.device) -> dict[str, Any]:
    """Persistent workers, as timm's loaders: forking new ones as the last shut down can hang a DDP rank."""
    return dict(num_workers=cfg.workers, pin_memory=device.type == "cuda", persistent_workers=cfg.workers > 0)


def _per_image_loaders(cfg: Config, train: Images, val: Images, data_config: dict[str, Any], rank: int,
                       world_size: int, device: torch.device, schedule: SizeSchedule | None) -> tuple[DataLoader, ...]:
    """timm's transforms in ``DataLoader`` workers: ``StepSampler`` hands each worker a whole step, at its size."""
    train_tfs, val_tf = build_transforms(cfg, data_config)
    train_set = SizedImages(train.samples, train_tfs, cache=train.cache)
    if cfg.repeated_aug:
        order = RepeatAugSampler(train_set, num_replicas=world_size, rank=rank)
    else:
        order = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
    steps = StepSampler(order, cfg.batch_size, cfg.img_size, schedule, cfg.seed, rank)
    # its own generator: starting the workers draws nothing from the global RNG that drop-path and Mixup use
    train_loader = DataLoader(train_set, batch_sampler=steps, generator=torch.Generator(), **_workers(cfg, device))
    val_set = Subset(ImageFolderDataset(val.samples, val_tf, cache=val.cache), range(rank, len(val), world_size))
    return train_loader, DataLoader(val_set, cfg.batch_size, **_workers(cfg, device))


def _tensor_loaders(cfg: Config, train: Images, val: Images, data_config: dict[str, Any], rank: int, world_size: int,
                    device: torch.device, schedule: SizeSchedule | None) -> tuple[BatchLoader, BatchLoader]:
    """The batched pipeline over the decoded caches; on CUDA the stores move to the GPU (crops never leave it)."""
    common = dict(size=cfg.img_size, mean=data_config["mean"], std=data_config["std"], seed=cfg.seed, rank=rank,
                  world_size=world_size, device=device)
    train_store, val_store = (
        TensorStore(split.cache.data, split.cache.offsets, split.cache.shapes, [target for _, target in split.samples],
                    [str(path) for path, _ in split.samples]).to(device) for split in (train, val))
    train_loader = BatchLoader(train_store, cfg.batch_size, train=True, scale=cfg.scale, hflip=cfg.hflip,
                               color_jitter=cfg.color_jitter, schedule=schedule, **common)
    val_loader = BatchLoader(val_store, cfg.batch_size, train=False, crop_pct=data_config["crop_pct"], **common)
    if rank == 0:
        print(f"{train_loader.describe()}\n{val_loader.describe()}", flush=True)
    return train_loader, val_loader


def _naflex_loaders(cfg: Config, train: Images, val: Images, data_config: dict[str, Any], rank: int, world_size: int,
                    device: torch.device, patch: int, num_classes: int) -> tuple[NaFlexLoader, NaFlexLoader]:
    """timm's NaFlex pipeline; ``batch_size`` is the images of a step at the longest sequence length: every step holds
    about ``batch_size`` x that many tokens (timm's ``max_tokens_per_batch``)."""
    longest = max(cfg.naflex_seq_lens)
    # timm calls it with max_seq_len and patch_size, for each sequence length
    transform_factory = functools.partial(_train_transform, cfg, data_config, naflex=True, use_prefetcher=True)
    mixup = NaFlexMixup(num_classes=num_classes, mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix,
                        switch_prob=cfg.mixup_switch_prob, prob=cfg.mixup_prob, label_smoothing=cfg.smoothing
                        ) if cfg.mixup > 0 or cfg.cutmix > 0 else None
    with contextlib.redirect_stdout(io.StringIO()):  # timm prints its schedule on every rank; describe() says it once
        steps = NaFlexSteps(train, transform_factory, mixup, patch_size=patch,
                            seq_lens=tuple(cfg.naflex_seq_lens), max_tokens_per_batch=cfg.batch_size * longest,
                            seed=cfg.seed, rank=rank, world_size=world_size, batch_divisor=math.gcd(8, cfg.batch_size))
    # set_epoch reaches the workers through shared counters; its own generator, as the per-image loader's
    train_loader = DataLoader(steps, batch_size=None, generator=torch.Generator(), **_workers(cfg, device))
    val_len = cfg.naflex_val_seq_len or (cfg.img_size // patch) ** 2
    val_tf = create_transform(is_training=False, naflex=True, max_seq_len=val_len, patch_size=patch, patchify=True,
                              use_prefetcher=True, **_normalised(data_config))
    val_set = Subset(ImageFolderDataset(val.samples, val_tf, cache=val.cache), range(rank, len(val), world_size))
    val_loader = DataLoader(val_set, max(1, cfg.batch_size * longest // val_len), collate_fn=NaFlexCollator(val_len),
                            **_workers(cfg, device))
    erasing = PatchRandomErasing(erase_prob=cfg.reprob, mode="pixel", device=device) if cfg.reprob > 0 else None
    norm = dict(mean=data_config["mean"], std=data_config["std"], device=device)
    if rank == 0:
        lengths = " ".join(f"{length}x{batch}" for length, batch in sorted(set(steps.schedule)))
        print(f"NaFlex train: {len(steps)} steps per epoch of (sequence length x images) {lengths}, patch {patch}, "
              f"Mixup/CutMix {'in the loader' if mixup else 'off'}, patch erasing {cfg.reprob}; NaFlex val: each "
              f"image resized, aspect ratio kept, to at most {val_len} patches", flush=True)
    return (NaFlexLoader(train_loader, erasing=erasing, seed=cfg.seed, rank=rank, **norm),
            NaFlexLoader(val_loader, **norm))


def set_epoch(loader: Loader, epoch: int, start_step: int = 0) -> None:
    """Select epoch ``epoch`` of a training loader, iterated from step ``start_step`` (a resumed run)."""
    getattr(loader, "batch_sampler", loader).set_epoch(epoch, start_step)  # DataLoader: its StepSampler
