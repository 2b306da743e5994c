"""Config checks beyond types, run by ``build_config`` before any data is read: each error names key, value and fix."""

from __future__ import annotations

import contextlib
import difflib
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from timm.data import create_transform
from timm.data.transforms import interp_mode_to_str
from timm.optim import list_optimizers
from timm.scheduler import create_scheduler_v2
from torch import nn
from torchvision.transforms import InterpolationMode

from vit_rope.checks import check_output_dir
from vit_rope.data.splits import WHERE, dataset_kind
from vit_rope.data.steps import budget_images
from vit_rope.errors import UserError
from vit_rope.train.config import Config
from vit_rope.train.loaders import safe_transform

# (test, wording, keys): each key's value must pass the test; None (an optional key left unset) is not checked
_RANGES: tuple[tuple[Callable[[float], bool], str, tuple[str, ...]], ...] = (
    (lambda v: v > 0, "> 0", ("img_size", "epochs", "batch_size", "lr", "decay_epochs", "decay_rate", "clip_grad",
                              "val_interval")),
    (lambda v: v >= 0, ">= 0", ("seed", "train_subset_seed", "workers", "threads", "log_interval",
                                "checkpoint_interval", "keep_every", "warmup_epochs", "cache_size", "weight_decay",
                                "momentum", "warmup_lr", "min_lr", "color_jitter", "mixup", "cutmix",
                                "grad_checkpointing")),
    (lambda v: 0 <= v <= 1, "between 0 and 1", ("hflip", "reprob", "mixup_prob", "mixup_switch_prob", "smoothing",
                                                "model_ema_decay")),
    (lambda v: 0 <= v < 1, "in [0, 1) (the probability that a block is skipped)", ("drop_path",)),
    (lambda v: 0 < v <= 1, "in (0, 1] (the fraction of the resized image that the center crop keeps)", ("crop_pct",)),
    (lambda v: 0 < v <= 1, "in (0, 1] (the fraction of each class's train images to train on)", ("train_fraction",)),
    (lambda v: v >= 0, ">= 1 patches, or 0 for (img_size / patch size)^2", ("naflex_val_seq_len",)),
)
_SCHEDULERS = ("cosine", "tanh", "step", "multistep", "plateau", "poly")  # the ones base.yaml documents


def check_config(cfg: Config) -> None:
    """Raise a ``UserError`` for the first value of ``cfg`` out of its range or unknown to timm."""
    check_output_dir(cfg.output, "output")
    for test, wording, keys in _RANGES:
        for key in keys:
            value = getattr(cfg, key)
            if value is not None and not test(value):
                raise UserError(f"config key '{key}' must be {wording}, got {value}")
    if len(cfg.scale) != 2 or not 0 < cfg.scale[0] <= cfg.scale[1] <= 1:
        raise UserError(f"config key 'scale' must be [min, max] crop area fractions with 0 < min <= max <= 1, got "
                        f"{cfg.scale}")
    for size in cfg.train_sizes:  # multiples of the patch size are checked once the model is built (train.py)
        if size <= 0:
            raise UserError(f"config key 'train_sizes' must list sizes > 0 (pixels), got {size} in {cfg.train_sizes}")
        batch = budget_images(cfg.batch_size, cfg.img_size, size)
        if cfg.token_budget and batch < 2:
            least = math.ceil(2 * size**2 / cfg.img_size**2)
            least += least % 2 if cfg.mixup > 0 or cfg.cutmix > 0 else 0  # an even batch_size, checked below
            raise UserError(f"train_sizes entry {size} leaves {batch} image(s) per step under the token budget "
                            f"(batch_size {cfg.batch_size} x ({cfg.img_size} / {size})^2), and a step needs at least 2 "
                            f"(Mixup pairs, batch statistics); raise batch_size to {least} or more, drop {size} from "
                            "train_sizes, or set token_budget=false")
    if cfg.naflex:
        _check_naflex(cfg)
    kind = dataset_kind(cfg.dataset)  # a kind this toolkit reads, with the data_dir it needs and the keys it uses
    if kind and not cfg.data_dir:
        raise UserError(f"dataset {cfg.dataset} reads data_dir, which is not set: set data_dir to the folder of "
                        f"{WHERE[kind]}")
    unused = [key for key in ("input_key", "target_key") if getattr(cfg, key) is not None]
    if unused and not kind:
        raise UserError(f"{' and '.join(unused)} name where shards or a dataset keep images and labels, and an image "
                        "folder has neither: remove them, or set dataset to wds/<name> or hfds/<name>")
    if cfg.warmup_epochs >= cfg.epochs > 0:
        warnings.warn(f"warmup_epochs {cfg.warmup_epochs} is not less than the {cfg.epochs} epochs of the run, so the "
                      f"learning rate never reaches lr={cfg.lr}; lower warmup_epochs below {cfg.epochs}", stacklevel=3)
    if cfg.keep_every > cfg.epochs:
        warnings.warn(f"keep_every {cfg.keep_every} is more than the {cfg.epochs} epochs of the run, so no epoch_E.pth "
                      f"will be kept (only last.pth and best.pth); set keep_every to {cfg.epochs} or less to keep some",
                      UserWarning, stacklevel=3)
    if (cfg.mixup > 0 or cfg.cutmix > 0) and cfg.batch_size % 2:
        raise UserError(f"batch_size must be even when mixup or cutmix is on (timm mixes pairs), got {cfg.batch_size}")
    if cfg.sched == "plateau" and cfg.val_interval != 1:
        raise UserError(f"sched=plateau steps on every epoch's val top-1, so it needs val_interval=1, got "
                        f"val_interval={cfg.val_interval}; set val_interval=1 or choose another sched (cosine, ...)")
    names, parts = list_optimizers(), cfg.opt.lower().split("_")
    if parts[-1] not in names or parts[:-1] not in ([], ["lookahead"]):  # timm: lookahead_<name> wraps <name>
        closest = difflib.get_close_matches(parts[-1], names, n=1, cutoff=0)[0]
        raise UserError(f"unknown optimizer opt={cfg.opt}; did you mean opt={closest}? (timm.optim.list_optimizers() "
                        "lists them; lookahead_<name> wraps one in Lookahead)")
    _check_scheduler(cfg)
    if cfg.interpolation is not None and cfg.interpolation not in _interpolations():
        raise UserError(f"config key 'interpolation' must be one of {', '.join(_interpolations())} or "
                        f"null (the model's default), got {cfg.interpolation!r}")
    if cfg.auto_augment is not None:
        try:  # timm parses the string, then every op runs at its extreme magnitudes (train.loaders)
            safe_transform(lambda aa: create_transform(input_size=cfg.img_size, is_training=True, auto_augment=aa,
                                                       interpolation=cfg.interpolation or "bilinear"), cfg.auto_augment)
        except (AssertionError, ValueError, KeyError, IndexError) as err:
            raise UserError(f"auto_augment={cfg.auto_augment} is not a timm auto-augment string ({err}); use e.g. "
                            "rand-m9-mstd0.5-inc1, 3a, augmix-m5, original, or null for none") from None


def _check_naflex(cfg: Config) -> None:
    """Keys that NaFlex (sizes from ``naflex_seq_lens``, timm's loader and crop) would silently ignore are errors."""
    if not cfg.naflex_seq_lens or min(cfg.naflex_seq_lens) < 1:
        raise UserError(f"config key 'naflex_seq_lens' must list sequence lengths >= 1 (patches per image), got "
                        f"{cfg.naflex_seq_lens}; e.g. [128, 256, 576, 784, 1024] for 16 px patches around 224 px")
    conflicts = [why for why, present in (
        ("train_sizes (NaFlex draws each step's sequence length from naflex_seq_lens): set train_sizes=[]",
         cfg.train_sizes),
        ("repeated_aug (timm's NaFlex loader has no repeated augmentation): set repeated_aug=false", cfg.repeated_aug),
        ("pipeline=tensor (NaFlex runs timm's NaFlex loader): set pipeline=auto", cfg.pipeline == "tensor"),
        (f"train_crop_mode={cfg.train_crop_mode} (NaFlex crops with timm's random-resized crop to a token budget): "
         "set train_crop_mode=rrc", cfg.train_crop_mode != "rrc")) if present]
    if conflicts:
        raise UserError(f"naflex=true does not go with {conflicts[0]}, or naflex=false")


def scheduler_args(cfg: Config) -> dict[str, Any]:
    """``create_scheduler_v2``'s arguments but ``updates_per_epoch`` (``plateau`` steps on epochs' val top-1)."""
    return dict(sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs, warmup_lr=cfg.warmup_lr,
                min_lr=cfg.min_lr, decay_epochs=cfg.decay_epochs, decay_rate=cfg.decay_rate,
                step_on_epochs=cfg.sched == "plateau")


def _check_scheduler(cfg: Config) -> None:
    """Build the schedule on a one-parameter optimizer: timm lists no names, and this checks the other arguments."""
    probe = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    try:
        with warnings.catch_warnings():  # timm's deprecation notices come once, when train.py builds the schedule
            warnings.simplefilter("ignore")
            scheduler, _ = create_scheduler_v2(probe, **scheduler_args(cfg), updates_per_epoch=1)
    except (ValueError, AssertionError) as err:
        if "nknown" not in str(err):
            raise UserError(f"sched={cfg.sched} does not fit this config ({err}); change the keys it names") from None
        closest = difflib.get_close_matches(cfg.sched, _SCHEDULERS, n=1, cutoff=0)[0]
        raise UserError(f"unknown scheduler sched={cfg.sched}; did you mean sched={closest}? (timm's "
                        f"create_scheduler_v2 takes {', '.join(_SCHEDULERS)}, ...)") from None
    if scheduler is None:
        raise UserError(f"sched={cfg.sched} builds no schedule, and train.py steps one every update; pick one of "
                        f"{', '.join(_SCHEDULERS)} (sched=step with decay_rate=1 keeps the lr fixed)")


def _interpolations() -> list[str]:
    """The names timm's ``str_to_interp_mode`` takes, in torchvision's order (timm's public API)."""
    names = []
    for mode in InterpolationMode:
        with contextlib.suppress(KeyError):
            names.append(interp_mode_to_str(mode))
    return names


def check_ranks_agree(settings: dict[str, Any], world_size: int) -> None:
    """A ``UserError`` on every rank (a collective) when the ranks hold different ``settings``: each cuts its steps
    locally, so ranks launched with other configs or data would hang or mix sizes in one gradient."""
    if world_size < 2:
        return
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, settings)
    for rank, other in enumerate(gathered[1:], 1):
        differ = [f"{key} (rank 0: {gathered[0][key]}, rank {rank}: {other[key]})" for key in settings
                  if other[key] != gathered[0][key]]
        if differ:
            raise UserError(f"the DDP ranks do not agree on {', '.join(differ)}; each rank derives every step's "
                            "size, images and checkpoints from these, so launch every rank with the same config, "
                            "command-line overrides and data")
