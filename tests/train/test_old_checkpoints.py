"""Checkpoints written before the package moved into layers (tests/fixtures/resume_epoch1_of2.pth: epoch 1 of a
2-epoch run of a 1-block RoPE-Mixed ViT, written by the code of 2026-11-25 before the move, from tiny_args with
``model_kwargs={depth: 1, embed_dim: 16, num_heads: 2, patch_size: 8} model_ema=true`` on conftest's image folder)
still load for evaluation and still resume, to the weights of an uninterrupted run of today's code."""

from __future__ import annotations

import shutil
from pathlib import Path

import timm
import torch
from timm.utils import ModelEmaV3

import train
from helpers.training import REPO, tiny_args, write_image_folder
from vit_rope.eval.loading import load_trained
from vit_rope.models.pos_encoding import encoding_key
from vit_rope.train.resume import saved_settings
from vit_rope.train.state import current_model_args, load_checkpoint, load_state

FIXTURE = REPO / "tests" / "fixtures" / "resume_epoch1_of2.pth"
ARGS = ("model_kwargs={depth: 1, embed_dim: 16, num_heads: 2, patch_size: 8}", "model_ema=true")


def test_a_checkpoint_from_before_the_move_rebuilds_its_model_for_evaluation() -> None:
    ckpt = load_checkpoint(FIXTURE)
    assert ckpt["epoch"] == 1 and ckpt["model_name"] == "vit_rope_tiny_patch16_mixed_224"
    entry = load_trained(FIXTURE)
    assert entry.train_size == 32 and entry.classes == ["class_0", "class_1", "class_2"]
    saved = {encoding_key(name): tensor for name, tensor in ckpt["model_ema"].items()}  # rope.* -> pos_encoding.*
    for name, tensor in entry.model.state_dict().items():  # the EMA weights, loaded strictly
        torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0, msg=name)
    with torch.no_grad():
        logits = entry.model(torch.randn(2, 3, 48, 64))
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()


def test_a_checkpoint_from_before_the_move_resumes_to_an_uninterrupted_run(tmp_path: Path) -> None:
    data = write_image_folder(tmp_path / "data")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(FIXTURE, resumed / "last.pth")
    assert train.main(tiny_args(data, straight, *ARGS)) == 0
    assert train.main(tiny_args(data, resumed, *ARGS, "--resume", str(resumed / "last.pth"))) == 0
    a, b = (torch.load(path / "last.pth", weights_only=True) for path in (straight, resumed))
    assert a["epoch"] == b["epoch"] == 2
    for key in ("model", "model_ema"):
        for name, tensor in a[key].items():
            torch.testing.assert_close(b[key][name], tensor, rtol=0, atol=1e-5, msg=f"{key}.{name}")


def test_a_checkpoint_saved_with_earlier_argument_names_rebuilds_and_resumes_in_todays(tmp_path: Path) -> None:
    """An earlier version saved ``rope_kind`` and ``rope_policy`` (and LookHere's ``lh_config``) in a checkpoint's
    ``model_kwargs`` and config: evaluation and ``--resume`` without a config take them in today's names, while a model
    called with those names refuses them (tests/models/test_models.py)."""
    ckpt = load_checkpoint(FIXTURE)
    old = {"rope_kind": "mixed", "rope_policy": "interpolate"}
    ckpt["model_kwargs"] = {**ckpt["model_kwargs"], **old}
    ckpt["config"] = {**ckpt["config"], "model_kwargs": {**ckpt["config"]["model_kwargs"], **old}}
    torch.save(ckpt, tmp_path / "old_names.pth")
    entry = load_trained(tmp_path / "old_names.pth")
    assert entry.model.encoding_kind == "mixed" and entry.model.resolution_policy.name == "interpolate"
    settings = saved_settings(tmp_path / "old_names.pth")
    assert settings["model_kwargs"]["encoding"] == "mixed" and "rope_kind" not in settings["model_kwargs"]
    assert current_model_args({"lh_config": "lh90", "encoding_options": {}}) == {"encoding_options": {"config": "lh90"}}


def test_a_timm_rope_port_checkpoint_keeps_its_rope_keys(tmp_path: Path) -> None:
    """timm's RoPE-ViT ports keep their frequencies at ``rope.freqs``: only our models' keys are mapped."""
    port = timm.create_model("vit_small_patch16_rope_mixed_224", depth=1)
    load_state(port, port.state_dict(), "model weights", tmp_path / "last.pth")
    ema = ModelEmaV3(port)
    load_state(ema, ema.state_dict(), "EMA weights", tmp_path / "last.pth")
