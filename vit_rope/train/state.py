"""Resumable training state: checkpoints written atomically and tagged with their format, every rank's RNG states as
tensors and scalars (which ``weights_only=True`` loads), and resuming a run: the settings it goes on with, and the state
put back from its checkpoint. The optimizer and schedule go on from their saved state whatever the command line says,
so ``reconcile`` keeps their keys and names every other difference in one warning."""

from __future__ import annotations

import dataclasses
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from timm.utils import ModelEmaV3
from torch import nn

from vit_rope.errors import UserError
from vit_rope.models.pos_encoding import encoding_keys
from vit_rope.train import engine
from vit_rope.train.config import Config, typed
from vit_rope.train.config_checks import check_config
from vit_rope.train.distributed import DistEnv
from vit_rope.weights import atomic_save, unreadable_reason, weights_mismatch

CHECKPOINT_FORMAT = "vit_rope.train/1"


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch, CUDA, numpy, python) as tensors and scalars, so ``weights_only`` loads them."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, mt_state, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached_gaussian)},
            "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64),
                       "gauss_next": gauss_next}}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    py_state = state["python"]
    random.setstate((py_state["version"], tuple(py_state["state"].tolist()), py_state["gauss_next"]))


def gather_rng_states(env: DistEnv) -> list[dict[str, Any]]:
    """RNG states of all ranks, indexed by rank (a collective: every rank must call it)."""
    states: list[Any] = [rng_state()] * env.world_size
    if env.distributed:
        dist.all_gather_object(states, states[0])
    return states


# model arguments of earlier versions: the argument now, and the key their value goes under there (None: as it is)
RENAMED = {"rope_kind": ("encoding", None), "rope_policy": ("resolution_policy", None),
           "lh_config": ("encoding_options", "config")}


def current_model_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in kwargs.items() if key not in RENAMED}
    for old, (new, key) in RENAMED.items():
        if old in kwargs:
            out[new] = kwargs[old] if key is None else {**(out.get(new) or {}), key: kwargs[old]}
    return out


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write a training checkpoint (see ``train.py`` for its keys), tagged so ``load_checkpoint`` can recognise it."""
    atomic_save({"format": CHECKPOINT_FORMAT, **state}, path)


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """A ``save_checkpoint`` file (``weights_only``: no code runs) or a ``UserError``; old model arguments renamed."""
    if not Path(path).is_file():
        what = "is a folder" if Path(path).is_dir() else "does not exist"
        raise UserError(f"checkpoint {path} {what}; pass OUTPUT/last.pth (or a kept OUTPUT/epoch_E.pth) of "
                        "an earlier run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # torch raises several types (UnpicklingError, RuntimeError, EOFError) for foreign files
        unreadable = unreadable_reason(path, err)
        reason = f", {unreadable}" if unreadable else f" ({(str(err).strip() or type(err).__name__).splitlines()[0]})"
        raise UserError(f"{path} is not a vit-rope training checkpoint: torch.load failed{reason}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path} is not a vit-rope training checkpoint (no format '{CHECKPOINT_FORMAT}'); "
                        "pass last.pth or best.pth written by train.py")
    for saved in (ckpt, ckpt.get("config") or {}):
        if saved.get("model_kwargs"):
            saved["model_kwargs"] = current_model_args(saved["model_kwargs"])
    return ckpt


def load_state(module: Any, state: dict[str, Any], what: str, path: str | Path,
               fix: str = "resume with the model and optimizer settings of the run that wrote it") -> None:
    """``module.load_state_dict(state)``, a mismatch a ``UserError`` naming the checkpoint, the keys and ``fix``."""
    if isinstance(module, nn.Module):  # a model or its EMA: ours saved before the encoding's rename too
        state = encoding_keys(state, module)
        if mismatch := weights_mismatch(module.state_dict(), state):
            raise UserError(f"the {what} in {path} does not fit this run ({mismatch}); {fix}")
    try:
        module.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0]
        raise UserError(f"the {what} in {path} does not fit this run ({first}); {fix}") from None


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
