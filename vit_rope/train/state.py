"""Resumable training state: checkpoints written atomically and tagged with their format, and every rank's RNG states
as tensors and scalars, which ``weights_only=True`` loads."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from vit_rope.errors import UserError
from vit_rope.models.pos_encoding import encoding_keys
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
