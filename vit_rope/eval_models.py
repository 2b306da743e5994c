"""The models that evaluation, export and diagnosis take: a ``train.py`` checkpoint rebuilt from what it stores, or
a timm model (ours, timm's ViTs and RoPE ports, CNNs) with the weights of a local file.

Both are built with ``dynamic_img_size=True`` where the model takes it, because they are run at sizes other than the
one they were trained at (RoPE-ViT, Heo et al. 2024, evaluates from 0.6x to 2.3x). A mixed RoPE model whose learned
frequencies were not in its weights is refused rather than evaluated at random frequencies.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data import ImageNetInfo
from torch import nn

import vit_rope  # noqa: F401  (registers the vit_rope_* models)
from vit_rope.checkpoint import UnreadableCheckpointError, WeightsNotLoadedWarning, read_weights
from vit_rope.config import UserError, check_model_name
from vit_rope.train_state import load_checkpoint


@dataclass
class EvalModel:
    """A model ready to evaluate, with what the report needs to know about it.

    Attributes:
        label: row name in the reports (model name, plus the checkpoint path for checkpoints).
        model: the network; evaluated in eval mode.
        train_size: the resolution it was trained at, marked in the reports and the reference of RoPE policies.
        classes: class name of each output; None when unknown (outputs are then taken in val folder order).
    """

    label: str
    model: nn.Module
    train_size: int
    classes: list[str] | None = None


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with ``dynamic_img_size=True``, so that ViTs run at every size.

    timm ViTs then interpolate their position embeddings and timm's RoPE ports rebuild their grids; models that do
    not take the argument (CNNs) accept any size as they are and are built without it.
    """
    check_model_name(name)
    try:
        return timm.create_model(name, **{"dynamic_img_size": True, **kwargs})
    except TypeError as err:
        if "dynamic_img_size" not in str(err):
            raise UserError(f"model '{name}' does not accept {kwargs} ({err})") from None
    return timm.create_model(name, **kwargs)


def load_trained(path: str | Path, use_ema: bool = True) -> EvalModel:
    """Rebuild the model of a ``train.py`` checkpoint and load its weights strictly (EMA weights when saved).

    Reads the keys ``model_name``, ``model_kwargs``, ``config["img_size"]``, ``model``, ``model_ema`` (optional)
    and ``classes`` (optional). The model is built without the pretrained weights its ``model_kwargs`` may name
    (the run's starting point): the strict load replaces every weight, learned RoPE frequencies included.
    """
    ckpt = load_checkpoint(path)
    missing = [key for key in ("model_name", "model_kwargs", "config", "model") if key not in ckpt]
    if missing or "img_size" not in ckpt["config"]:
        raise UserError(f"{path} has no {', '.join(missing) or 'config img_size'}, so its model cannot be rebuilt; "
                        "pass a last.pth or best.pth written by train.py")
    train_size = int(ckpt["config"]["img_size"])
    model = create_model(ckpt["model_name"], **{**ckpt["model_kwargs"], "img_size": train_size, "pretrained": False})
    ema = use_ema and ckpt.get("model_ema") is not None
    try:
        model.load_state_dict(ckpt["model_ema"] if ema else ckpt["model"])
    except RuntimeError as err:
        raise UserError(f"the weights in {path} do not fit {ckpt['model_name']} rebuilt with "
                        f"{ckpt['model_kwargs']} ({str(err).strip().splitlines()[0]})") from None
    return EvalModel(f"{ckpt['model_name']} ({path}{', EMA' if ema else ''})", model, train_size, ckpt.get("classes"))


def load_pretrained(name: str, weights: str | None, num_classes: int, train_size: int | None = None,
                    model_kwargs: dict[str, Any] | None = None) -> EvalModel:
    """A timm model with the weights of a local file (random weights without one: for timing only).

    A vit_rope mixed model whose file has no learned RoPE frequencies (an axial or plain ViT checkpoint) is refused:
    its frequencies would be random. Other weights initialised rather than loaded are printed as a warning.

    Args:
        weights: a file timm's ``pretrained_cfg_overlay`` loads; the model then keeps its own class count unless
            ``num_classes`` is in ``model_kwargs``.
        num_classes: outputs of a model without weights (the val folder's class count).
        train_size: built at this size; None takes ``img_size`` from ``model_kwargs`` or the pretrained config.
        model_kwargs: more ``timm.create_model`` arguments (``depth``, ``num_classes``, ...).
    """
    kwargs = dict(model_kwargs or {})
    if weights is not None and not Path(weights).is_file():
        raise UserError(f"--pretrained-file {weights} does not exist")
    if train_size is not None:
        kwargs["img_size"] = train_size
    if weights is None:
        kwargs.setdefault("num_classes", num_classes)
    # custom_load=False: the file is a state dict, also for models whose registry weights are JAX .npz files (timm
    # before 1.0.31 kept their npz loader for a local file); num_classes keeps a head of that size, which timm drops
    overlay = {"file": weights, "custom_load": False,
               **({"num_classes": kwargs["num_classes"]} if "num_classes" in kwargs else {})}
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # seeded: random weights (no file) repeat
            torch.manual_seed(0)
            warnings.simplefilter("ignore", WeightsNotLoadedWarning)  # model.load_report is checked below instead
            model = create_model(name, pretrained=weights is not None, pretrained_cfg_overlay=overlay, **kwargs)
    except UserError:  # the model name or its arguments
        raise
    except Exception as err:
        if weights is not None:
            try:  # timm's read error (SafetensorError: header too large, ...) names neither the file nor the fix
                read_weights(weights)
            except UnreadableCheckpointError as unreadable:
                raise UserError(str(unreadable)) from None
            except Exception:  # a well-formed file that weights_only refuses: reported below as before
                pass
        if not isinstance(err, RuntimeError | ValueError):
            raise
        raise UserError(f"--pretrained-file {weights} does not fit {name} ({str(err).strip().splitlines()[0]}); "
                        "pick the model it was trained as, or --model-kwargs to match it") from None
    check_loaded(model, name, weights)
    report = getattr(model, "load_report", None)
    if report is not None and report.initialised:
        print(f"warning: {weights} lacks weights of {name}, which were initialised instead: {report.summary()}")
    size = kwargs.get("img_size", model.pretrained_cfg["input_size"][-1])
    classes = ImageNetInfo().label_names() if weights is not None and model.num_classes == 1000 else None
    return EvalModel(name, model, int(size), classes)


def check_loaded(model: nn.Module, name: str, weights: str | Path | None = None) -> None:
    """Refuse a model whose learned RoPE frequencies kept their random initialisation because its weights file had
    none (``model.load_report``, left by vit_rope's checkpoint loading: ``load_weights`` or ``pretrained=True``)."""
    report = getattr(model, "load_report", None)
    if report is None or report.rope_freqs_loaded:
        return
    axial = name.replace("_mixed", "_axial") if "_mixed" in name else "an axial RoPE model"
    raise UserError(f"{report.source or weights or 'its weights file'} has no learned RoPE frequencies for {name}, a "
                    "mixed RoPE model, so they would be evaluated at their random initialisation; evaluate a "
                    "checkpoint of a mixed model trained or fine-tuned with them, or for an axial RoPE checkpoint "
                    f"pick {axial}")
