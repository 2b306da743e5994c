"""Resumable training state (vit_rope.train.state): RNG round trips, atomic writes, checkpoint recognition."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vit_rope.errors import UserError
from vit_rope.train.distributed import DistEnv
from vit_rope.train.state import (
    CHECKPOINT_FORMAT,
    atomic_save,
    gather_rng_states,
    load_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def draws() -> tuple[list[float], list[float], float, float]:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.standard_normal(), random.random()


def test_restored_rng_states_repeat_every_stream_through_a_weights_only_file(tmp_path: Path) -> None:
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    np.random.standard_normal()  # leaves numpy's cached gaussian set, a part of its state
    save_checkpoint({"rng": gather_rng_states(DistEnv(torch.device("cpu")))}, tmp_path / "last.pth")
    expected = draws()
    draws()  # move every stream on
    set_rng_state(load_checkpoint(tmp_path / "last.pth")["rng"][0])
    assert draws() == expected


def test_gather_on_one_process_is_this_process_state() -> None:
    torch.manual_seed(3)
    states = gather_rng_states(DistEnv(torch.device("cpu")))
    assert len(states) == 1 and torch.equal(states[0]["torch"], rng_state()["torch"])


def test_atomic_save_keeps_the_old_file_when_the_write_fails(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "last.pth"
    atomic_save({"epoch": 1}, path)

    def killed(obj, file) -> None:
        Path(file).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epoch": 1}


def test_checkpoint_is_tagged_and_loads_back(tmp_path: Path) -> None:
    save_checkpoint({"epoch": 4}, tmp_path / "c.pth")
    assert load_checkpoint(tmp_path / "c.pth") == {"format": CHECKPOINT_FORMAT, "epoch": 4}


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    (b"", "not a vit-rope training checkpoint"),
    ({"model": {}}, "no format"),
])
def test_anything_but_a_training_checkpoint_is_a_user_error(content, message: str, tmp_path: Path) -> None:
    path = tmp_path / "c.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(UserError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_a_state_that_does_not_fit_names_what_and_where(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"the model weights in run/last.pth does not fit this run \(.*\); resume"):
        load_state(nn.Linear(2, 2), nn.Linear(3, 2).state_dict(), "model weights", "run/last.pth")


@pytest.mark.parametrize("keep", [5000, 0.5])
def test_truncated_checkpoint_is_called_truncated(tmp_path: Path, keep) -> None:
    """Cut early, torch's zip reader fails with the operating system's EINVAL, which still means a broken file."""
    path = tmp_path / "last.pth"
    torch.save({"format": "x", "weights": torch.randn(64, 1024)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(UserError, match=r"last.pth is not a vit-rope training checkpoint: torch.load failed, the file "
                       r"is truncated or corrupt"):
        load_checkpoint(path)
