"""Resumable training state (vit_rope.train.state): RNG round trips, atomic writes, checkpoint recognition; and
resuming a run: ``--resume`` alone goes on with the run's own settings, in the checkpoint's folder; the optimizer and
schedule keep the checkpoint's values whatever the command line says (and config.yaml records them); every other
setting that differs is named in one warning line. Interrupted-and-resumed runs matching uninterrupted ones, mid-epoch
and with every source of randomness, are tested in test_train.py."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import train
from helpers.training import tiny_args, write_image_folder
from vit_rope.errors import UserError
from vit_rope.train.command_line import build_config, parse_args
from vit_rope.train.distributed import DistEnv
from vit_rope.train.resume import restore, saved_settings
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
    states = gather_rng_states(DistEnv(torch.device("cpu")))  # one process: its own state alone
    assert len(states) == 1 and torch.equal(states[0]["torch"], rng_state()["torch"])
    save_checkpoint({"rng": states}, tmp_path / "last.pth")
    expected = draws()
    draws()  # move every stream on
    set_rng_state(load_checkpoint(tmp_path / "last.pth")["rng"][0])
    assert draws() == expected


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


@pytest.mark.parametrize("content, message", [  # an empty or a broken file: test_checkpoint.py's unreadable files
    (None, "does not exist"),
    ({"model": {}}, "no format"),
])
def test_anything_but_a_training_checkpoint_is_a_user_error(content, message: str, tmp_path: Path) -> None:
    path = tmp_path / "c.pth"
    if content is not None:
        torch.save(content, path)
    with pytest.raises(UserError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_a_state_that_does_not_fit_names_what_and_where(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"the model weights in run/last.pth does not fit this run \(.*\); resume"):
        load_state(nn.Linear(2, 2), nn.Linear(3, 2).state_dict(), "model weights", "run/last.pth")


def test_truncated_checkpoint_is_called_truncated(tmp_path: Path) -> None:
    """Cut early, torch's zip reader fails with the operating system's EINVAL, which still means a broken file (cut
    in half: test_checkpoint.py's truncated.pth)."""
    path = tmp_path / "last.pth"
    torch.save({"format": "x", "weights": torch.randn(64, 1024)}, path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"last.pth is not a vit-rope training checkpoint: torch.load failed, the file "
                       r"is truncated or corrupt"):
        load_checkpoint(path)


SETTINGS = ("keep_every=1", "warmup_epochs=1", "model_kwargs.embed_dim=48")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-epoch run on a tiny image folder, once for the module: the tests only read it."""
    root = tmp_path_factory.mktemp("resume")
    assert train.main(tiny_args(write_image_folder(root / "data"), root / "straight", *SETTINGS)) == 0
    return root / "straight"


@pytest.fixture
def image_root(straight_run: Path) -> Path:
    return straight_run.parent / "data"  # the folder the run trained on, which no test changes


@pytest.fixture
def first_epoch(straight_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The 2-epoch run (``straight``) and a copy of its epoch-1 checkpoint as the last.pth of another folder."""
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    shutil.copy(straight_run / "epoch_1.pth", stopped / "last.pth")
    return straight_run, stopped


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_resume_alone_goes_on_with_the_runs_own_settings_in_the_checkpoints_folder(first_epoch, capsys) -> None:
    straight, stopped = first_epoch  # a copy of the run's folder: it goes on there, not in the folder it was saved in
    before = (straight / "last.pth").stat().st_mtime_ns
    assert train.main(["--resume", str(stopped / "last.pth")]) == 0
    assert "resume:" not in capsys.readouterr().err  # nothing differs but the output folder
    assert (straight / "last.pth").stat().st_mtime_ns == before
    for name, tensor in weights(straight / "last.pth").items():
        torch.testing.assert_close(weights(stopped / "last.pth")[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert yaml.safe_load((stopped / "config.yaml").read_text())["model_kwargs"] == {"depth": 2, "embed_dim": 48}


def test_optimizer_and_schedule_overrides_keep_the_checkpoints_values_and_say_so(first_epoch, image_root: Path,
                                                                                   capsys) -> None:
    straight, stopped = first_epoch
    args = tiny_args(image_root, stopped, *SETTINGS, "lr=5e-3", "weight_decay=0.1", "--resume",
                     str(stopped / "last.pth"))
    assert train.main(args) == 0
    message = capsys.readouterr().err
    assert message.startswith("warning: resume: ") and message.count("\n") == 1  # one line, no source line
    assert "Kept from its optimizer and schedule state: lr 0.002 (not 0.005), weight_decay 0.05 (not 0.1)" in message
    assert "Taken from this run" not in message
    saved = yaml.safe_load((stopped / "config.yaml").read_text())
    assert (saved["lr"], saved["weight_decay"]) == (2e-3, 0.05)  # what the run went on with
    for name, tensor in weights(straight / "last.pth").items():  # the same run as the uninterrupted one
        torch.testing.assert_close(weights(stopped / "last.pth")[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_other_differences_are_named_as_changing_the_run(first_epoch, image_root: Path, capsys) -> None:
    _, stopped = first_epoch
    assert train.main(tiny_args(image_root, stopped, *SETTINGS, "--batch-size", "4", "hflip=0",
                                "--resume", str(stopped / "last.pth"))) == 0
    message = capsys.readouterr().err
    assert "so it goes on differently from the run that stopped: batch_size 4 (the run's 8), hflip 0.0 (the run's " \
           "0.5)" in message and "resume with --resume alone" in message
    assert "The learning-rate schedule keeps the run's length in optimizer updates" in message  # batch_size
    assert "Kept from" not in message


def test_a_setting_added_since_the_checkpoint_is_compared_with_its_default(first_epoch, image_root: Path,
                                                                            tmp_path: Path, capsys) -> None:
    _, stopped = first_epoch
    ckpt = torch.load(stopped / "last.pth", weights_only=True)
    del ckpt["config"]["train_fraction"]  # as in a checkpoint written before the key existed
    torch.save(ckpt, stopped / "last.pth")
    assert train.main(tiny_args(image_root, stopped, *SETTINGS, "train_fraction=0.5", "--resume",
                                str(stopped / "last.pth"))) == 0
    assert "train_fraction 0.5 (the run's 1.0)" in capsys.readouterr().err


def test_a_fine_tuning_run_resumed_alone_keeps_its_starting_point_on_record(first_epoch, tmp_path: Path) -> None:
    straight, stopped = first_epoch
    ckpt = torch.load(stopped / "last.pth", weights_only=True)
    ckpt["config"]["finetune"] = str(straight / "epoch_1.pth")  # what a fine-tuning run saves
    torch.save(ckpt, stopped / "last.pth")
    assert parse_args(["--resume", str(stopped / "last.pth")]).finetune == str(straight / "epoch_1.pth")


def test_resume_without_a_config_reads_the_checkpoint_and_command_line_overrides_still_win(first_epoch) -> None:
    _, stopped = first_epoch
    cfg = parse_args(["--resume", str(stopped / "last.pth"), "--epochs", "5", "keep_every=0"])
    assert (cfg.epochs, cfg.keep_every, cfg.img_size, cfg.model_kwargs) == (5, 0, 32, {"depth": 2, "embed_dim": 48})
    assert (cfg.resume, cfg.output) == (str(stopped / "last.pth"), str(stopped))
    assert parse_args(["--resume", str(stopped / "last.pth"), "--output", "elsewhere"]).output == "elsewhere"
    assert parse_args(["--resume", str(stopped / "last.pth"), "-c", "configs/base.yaml"]).img_size == 224  # -c wins


def test_saved_settings_drop_keys_this_version_no_longer_knows(first_epoch, tmp_path: Path) -> None:
    _, stopped = first_epoch
    ckpt = torch.load(stopped / "last.pth", weights_only=True)
    ckpt["config"]["a_key_of_an_older_version"] = 1
    torch.save(ckpt, tmp_path / "older.pth")
    settings = saved_settings(tmp_path / "older.pth")
    assert "a_key_of_an_older_version" not in settings and "resume" not in settings
    assert build_config(overrides=[], base=settings).model_kwargs == {"depth": 2, "embed_dim": 48}
    ckpt["config"]["lr"] = "fast"
    torch.save(ckpt, tmp_path / "older.pth")
    with pytest.raises(UserError, match=f"lr.*in the config saved in {tmp_path / 'older.pth'}"):
        saved_settings(tmp_path / "older.pth")


def test_a_run_resumed_past_its_epochs_steps_is_refused_with_the_settings_to_use() -> None:
    """A mid-epoch checkpoint whose step lies beyond this run's epoch (another batch size or data set)."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    resume = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": {},
              "model": model.state_dict(), "rng": [rng_state()], "epoch": 2, "best_top1": 0.0, "step": 9,
              "epoch_totals": {}}
    cfg = dataclasses.replace(build_config(), resume="run/last.pth")
    with pytest.raises(UserError, match=r"run/last.pth stopped at step 9 of epoch 3, but this run's epochs have 8 "
                                        r"steps; resume with the batch_size and data"):
        restore(resume, cfg, DistEnv(torch.device("cpu")), 8, optimizer, scheduler,
                      torch.amp.GradScaler("cpu", enabled=False), None)
