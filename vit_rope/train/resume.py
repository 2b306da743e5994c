"""Resuming a run: the settings it goes on with, and the training state put back from its checkpoint. The optimizer and
schedule go on from their saved state whatever the command line says, so ``reconcile`` keeps their keys and names every
other difference in one warning."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch
from timm.utils import ModelEmaV3

from vit_rope.errors import UserError
from vit_rope.train import engine
from vit_rope.train.config import Config, typed
from vit_rope.train.config_checks import check_config
from vit_rope.train.distributed import DistEnv
from vit_rope.train.state import load_checkpoint, load_state, set_rng_state

# Carried by the optimizer's and the scheduler's saved state: a resumed run keeps the checkpoint's values anyway.
STATE_KEYS = ("opt", "lr", "weight_decay", "momentum", "sched", "warmup_epochs", "warmup_lr", "min_lr", "decay_epochs",
              "decay_rate")
# Where and how fast a run goes, not what it computes (at most float rounding on CUDA): free to change on resume.
FREE_KEYS = ("output", "data_dir", "resume", "finetune", "download_size", "device", "log_interval",
             "checkpoint_interval", "keep_every", "val_interval", "threads", "workers", "cache_dir", "cache_size",
             "compile", "channels_last", "tf32")


def saved_settings(path: str | Path) -> dict[str, Any]:
    """The settings of the run that wrote the checkpoint ``path``, ``output`` its folder (wherever it has moved)."""
    saved = load_checkpoint(path, mmap=True).get("config") or {}
    settings = typed(saved, f"in the config saved in {path}")
    settings.pop("resume", None)
    return {**settings, "output": str(Path(path).parent)}


def reconcile(cfg: Config, resume: dict[str, Any], warn: bool = True) -> Config:
    """``cfg`` with the ``STATE_KEYS`` of the checkpoint ``resume``, checked again, and (``warn``) one warning naming
    every other difference but the ``FREE_KEYS``; a key added since is compared with its default."""
    if not resume.get("config"):  # a checkpoint without its config: nothing to compare
        return cfg
    saved = dataclasses.asdict(Config()) | typed(resume["config"], f"in the config saved in {cfg.resume}")
    differ = [key for key, value in saved.items() if key not in FREE_KEYS and getattr(cfg, key) != value]
    if not differ:
        return cfg
    kept = [f"{key} {saved[key]!r} (not {getattr(cfg, key)!r})" for key in differ if key in STATE_KEYS]
    changed = [f"{key} {getattr(cfg, key)!r} (the run's {saved[key]!r})" for key in differ if key not in STATE_KEYS]
    length = {"epochs", "batch_size", "train_fraction"} & set(differ)
    if warn:
        warnings.warn(
            f"resume: {cfg.resume} was written with other settings than this run's. "
            + (f"Kept from its optimizer and schedule state: {', '.join(kept)}. " if kept else "")
            + (f"Taken from this run, so it goes on differently from the run that stopped: {', '.join(changed)}. "
               if changed else "")
            + (f"The learning-rate schedule keeps the run's length in optimizer updates (its saved state) whatever "
               f"{' and '.join(sorted(length))} now say: updates past its end run at min_lr. " if length else "")
            + "To go on as the run was, resume with --resume alone (its settings are the defaults then).", stacklevel=2)
    cfg = dataclasses.replace(cfg, **{key: saved[key] for key in differ if key in STATE_KEYS})
    check_config(cfg)
    return cfg


def restore(resume: dict[str, Any], cfg: Config, env: DistEnv, steps_per_epoch: int,
            optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler, ema: ModelEmaV3 | None
            ) -> tuple[int, int, engine.EpochTotals | None, float]:
    """Put the training state back but the weights: ``(epochs done, next step, its epoch's totals, best top-1)``."""
    states = {"optimizer state": (optimizer, resume["optimizer"]), "scheduler": (scheduler, resume["scheduler"])}
    if resume["scaler"]:  # empty when the run used no float16 loss scaling
        states["grad scaler"] = (scaler, resume["scaler"])
    if ema is not None:  # a run that turns EMA on at resume starts it from the weights
        states["EMA weights"] = (ema.module, resume.get("model_ema", resume["model"]))
    for what, (obj, state) in states.items():
        load_state(obj, state, what, cfg.resume)
    set_rng_state(resume["rng"][env.rank % len(resume["rng"])])
    start_epoch, best_top1, start_step = resume["epoch"], resume["best_top1"], resume.get("step", 0)
    if start_step > steps_per_epoch:
        raise UserError(f"{cfg.resume} stopped at step {start_step} of epoch {start_epoch + 1}, but this run's "
                        f"epochs have {steps_per_epoch} steps; resume with the batch_size and data of the run "
                        "that wrote it")
    totals = engine.EpochTotals(**resume["epoch_totals"]) if start_step else None
    return start_epoch, start_step, totals, best_top1
