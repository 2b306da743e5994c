"""The models that evaluate, export and diagnose take: a ``train.py`` checkpoint rebuilt from what it stores, or a timm
model with a local file's weights or timm's published ones (``dynamic_img_size=True``); one whose weights lack its
learned frequencies or classifier is refused, not evaluated at random. ``create_from_checkpoint`` reads any format."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
import yaml
from timm.data import ImageNetInfo
from timm.models import get_pretrained_cfg_value
from torch import nn

from vit_rope.checks import check_model_name
from vit_rope.errors import UserError
from vit_rope.models.checkpoint import WeightsNotLoadedWarning, load_weights
from vit_rope.models.formats import describe, folder_format, model_args, weights_in
from vit_rope.models.pos_encoding import encoding_keys
from vit_rope.models.registry import ENCODINGS, PretrainedLoadError, create_model  # registers the vit_rope_* models
from vit_rope.train.state import CHECKPOINT_FORMAT, load_checkpoint
from vit_rope.weights import UnreadableCheckpointError, mapped_file, read_weights, tensor_rows, weights_mismatch

# create_model arguments the label leaves out, as *_rate dropouts: not the architecture, or reported on their own
_NOT_ARCHITECTURE = frozenset({"num_classes", "img_size", "dynamic_img_size", "pretrained", "pretrained_cfg",
                               "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path", "cache_dir"})


@dataclass
class EvalModel:
    """A model to evaluate: ``label`` ends in (a checkpoint's path), which ``studies.results.is_run`` reads."""

    label: str
    model: nn.Module
    train_size: int  # marked in the reports, and the reference of the RoPE policies
    classes: list[str] | None = None  # each output's class name; None: outputs in val folder order
    val_split: str | None = None  # this and the fields below: its training run's settings
    data_dir: str | None = None  # named when the evaluated folder's classes do not fit
    dataset: str | None = None  # None an image folder, wds/..., hfds/...
    input_key: str | None = None
    target_key: str | None = None
    train_split: str | None = None  # the probes' bank (``vit_rope.eval.probes``)


def model_label(name: str, model_kwargs: dict[str, Any], *notes: str) -> str:
    """``name (patch_size=4, depth=6, ...)``: the model name with the ``model_kwargs`` that change its architecture."""
    changes = [f"{key}={value}" for key, value in model_kwargs.items()
               if key not in _NOT_ARCHITECTURE and not key.endswith("_rate")]
    return f"{name} ({', '.join([*changes, *notes])})" if changes or notes else name


def _build(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``create_model`` with ``dynamic_img_size=True``, so that timm's ViTs and RoPE ports run at every size."""
    return create_model(name, {"dynamic_img_size": True, **kwargs}, "--model-kwargs")[0]


def load_trained(path: str | Path, use_ema: bool = True) -> EvalModel:
    """Rebuild the model of a ``train.py`` checkpoint and load its weights strictly (EMA weights when saved)."""
    ckpt = load_checkpoint(path)
    missing = [key for key in ("model_name", "model_kwargs", "config", "model") if key not in ckpt]
    if missing or "img_size" not in ckpt["config"]:
        raise UserError(f"{path} has no {', '.join(missing) or 'config img_size'}, so its model cannot be rebuilt; "
                        "pass a last.pth or best.pth written by train.py")
    name, kwargs, train_size = ckpt["model_name"], ckpt["model_kwargs"], int(ckpt["config"]["img_size"])
    model = _build(name, {**kwargs, "img_size": train_size, "pretrained": False})
    ema = use_ema and ckpt.get("model_ema") is not None
    weights = encoding_keys(ckpt["model_ema"] if ema else ckpt["model"], model)
    mismatch = weights_mismatch(model.state_dict(), weights)
    if mismatch:
        raise UserError(f"the weights in {path} do not fit {name} rebuilt with {kwargs} ({mismatch}); the "
                        "checkpoint was written by another version of the model's code")
    model.load_state_dict(weights)
    label = f"{model_label(name, kwargs)} ({path}{', EMA' if ema else ''})"
    data = ("val_split", "data_dir", "dataset", "input_key", "target_key", "train_split")
    return EvalModel(label, model, train_size, ckpt.get("classes"), *(ckpt["config"].get(key) for key in data))


def parse_kwarg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. depth=2)")
    return key, yaml.safe_load(value)


def add_model_options(parser: argparse.ArgumentParser, use: str, model_help: str) -> None:
    """A one-model command's options (diagnose, export): a ``--checkpoint``, or a ``--model`` and its weights."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="PATH", help="a train.py checkpoint (last.pth, best.pth)")
    source.add_argument("--model", metavar="NAME", help=model_help)
    parser.add_argument("--pretrained-file", metavar="FILE", help="weights for --model")
    parser.add_argument("--random-init", action="store_true",
                        help=f"{use} a --model without weights, at its random initialisation (labelled so)")
    parser.add_argument("--model-kwargs", nargs="*", type=parse_kwarg, default=[], metavar="KEY=VALUE",
                        help="extra timm.create_model arguments for --model (values read as YAML)")


def check_model_options(parser: argparse.ArgumentParser, args: argparse.Namespace, *flags: str) -> None:
    """A usage error for ``--model``'s options (and ``flags``) with a ``--checkpoint``, or a file with random init."""
    flags = ("--pretrained-file", *flags, "--model-kwargs", "--random-init")
    dests = [flag[2:].replace("-", "_") for flag in flags]
    if args.checkpoint and any(getattr(args, dest) != parser.get_default(dest) for dest in dests):
        parser.error(f"{', '.join(flags[:-1])} and {flags[-1]} go with --model: a checkpoint rebuilds its own model, "
                     "with its weights")
    if args.random_init and args.pretrained_file:
        parser.error("--random-init asks for random weights, --pretrained-file for a file's: pass one of them")


def load_model_option(args: argparse.Namespace, use: str, num_classes: int, kwargs: dict[str, Any]) -> EvalModel:
    """The model of ``--checkpoint`` (EMA unless ``--no-ema``) or of ``--model`` (name and weights checked first)."""
    if args.checkpoint:
        return load_trained(args.checkpoint, not getattr(args, "no_ema", False))
    check_model_name(args.model)
    check_weights(args.model, args.pretrained_file, kwargs, args.random_init, use)
    return load_pretrained(args.model, args.pretrained_file, num_classes, model_kwargs=kwargs)


def set_policy(entry: EvalModel, policy: str | None) -> None:
    """Give the model ``--policy`` (None: its own), or a ``UserError`` when it has none or its encoding refuses it."""
    if policy is None:
        return
    if not hasattr(entry.model, "set_resolution_policy"):
        raise UserError(f"--policy applies to vit_rope models; {entry.label} has no RoPE policy")
    try:
        entry.model.set_resolution_policy(policy)
    except ValueError as err:  # a policy the model's encoding cannot take (DINOv3's)
        raise UserError(f"--policy {policy}: {err}") from None


def check_weights(name: str, weights: str | None, model_kwargs: dict[str, Any], random_init: bool, use: str) -> None:
    """A ``UserError`` when ``--model name`` would ``use`` random weights without ``--random-init``."""
    if weights is None and not model_kwargs.get("pretrained") and not random_init:
        raise UserError(f"--model {name} has no weights, so the command would {use} its random initialisation: pass "
                        "--pretrained-file PATH or --model-kwargs pretrained=true for timm's published weights, or "
                        f"--random-init to {use} random weights on purpose")


def is_training_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint written by train.py (its format tag), read memory-mapped."""
    return (mapped_file(path, unwrap=False) or {}).get("format") == CHECKPOINT_FORMAT  # a safetensors file: None


def load_pretrained(name: str, weights: str | None, num_classes: int, train_size: int | None = None,
                    model_kwargs: dict[str, Any] | None = None) -> EvalModel:
    """A timm model with a local file's weights, timm's published ones or random ones (labelled ``random init``)."""
    kwargs = dict(model_kwargs or {})
    if weights is not None and not Path(weights).is_file():
        raise UserError(f"--pretrained-file {weights} is not a file: pass the path of a weights file (.pth, .pt, "
                        ".bin or .safetensors)")
    if weights is not None and is_training_checkpoint(weights):
        raise UserError(f"--pretrained-file {weights} is a train.py checkpoint: pass it as --checkpoint {weights}, "
                        "which rebuilds its model as it was trained (training size, model_kwargs, classes)")
    given = dict(kwargs)  # the label names these, not what the file brings
    needs = model_args(weights) if weights is not None else {}  # what a model of the file's kind needs to take it
    if needs and ENCODINGS.get(name) == needs.pop("encoding"):  # (LookHere's config and official ViT), unless given
        kwargs = {**needs, **kwargs}
    published = weights is None and bool(kwargs.get("pretrained"))
    if train_size is not None:
        kwargs["img_size"] = train_size
    if weights is None and not published:
        kwargs.setdefault("num_classes", num_classes)
    if weights is not None and "num_classes" not in kwargs:  # the file's classifier, whatever the registry's default
        classifier = get_pretrained_cfg_value(name, "classifier") or "head"
        classes = tensor_rows(weights, f"{classifier if isinstance(classifier, str) else classifier[0]}.weight")
        if classes is not None:  # None: a backbone
            kwargs["num_classes"] = classes
    # custom_load=False: the file is a state dict even where the registry's weights are JAX .npz (timm < 1.0.31 used its
    # npz loader for a local file); num_classes in the overlay keeps the file's head, which timm would drop
    if weights is not None:  # unless --model-kwargs gives an overlay of its own
        kwargs.setdefault("pretrained_cfg_overlay", {"file": weights, "custom_load": False,
                                                     **{k: v for k, v in kwargs.items() if k == "num_classes"}})
    kwargs["pretrained"] = weights is not None or published
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # seeded: random weights (no file) repeat
            torch.manual_seed(0)
            warnings.simplefilter("ignore", WeightsNotLoadedWarning)  # model.load_report is checked below instead
            model = _build(name, kwargs)
    except PretrainedLoadError as failed:
        if weights is None:
            raise
        try:  # timm's read error (SafetensorError: header too large, ...) names neither the file nor the fix
            read_weights(weights)
        except UnreadableCheckpointError as unreadable:
            raise UserError(str(unreadable)) from None
        except Exception:  # a well-formed file that weights_only refuses: reported below as before
            pass
        err = failed.__cause__
        if not isinstance(err, RuntimeError | ValueError):
            raise
        lines = str(err).strip().splitlines()  # torch's load_state_dict lists the keys on lines of their own
        detail = " ".join(line.strip() for line in lines) if isinstance(err, RuntimeError) else lines[0]
        detail = detail if len(detail) <= 600 else detail[:597] + "..."
        raise UserError(f"--pretrained-file {weights} does not fit {name} ({detail}); "
                        + ("it has no classifier: probe its features with --probe knn or --probe linear, or "
                           if "num_classes" not in kwargs else "")  # the file's rows gave no class count
                        + "pick the model it was trained as, or --model-kwargs to match it") from None
    check_loaded(model, name, weights)
    report = getattr(model, "load_report", None)
    if report is not None and report.initialised:
        print(f"warning: {weights or 'the published checkpoint'} lacks weights of {name}, which were initialised "
              f"instead: {report.summary()}")
    size = kwargs.get("img_size", model.pretrained_cfg["input_size"][-1])
    classes = ImageNetInfo().label_names() if kwargs["pretrained"] and model.num_classes == 1000 else None
    label = model_label(name, {k: v for k, v in kwargs.items() if k in given or k not in needs},
                        *([] if kwargs["pretrained"] else ["random init"]))
    label += f" ({weights})" if weights is not None else ""  # the file, as for checkpoints: two files, two rows
    return EvalModel(label, model, int(size), classes)


def check_loaded(model: nn.Module, name: str, weights: str | Path | None = None) -> None:
    """Refuse a model whose learned RoPE frequencies or classifier kept their random initialisation."""
    report = getattr(model, "load_report", None)
    if report is None:
        return
    source = report.source or weights or "its weights file"
    if report.head_reason is not None:
        raise UserError(f"{source} does not give {name} its classifier ({report.head_reason}), so it would be "
                        "evaluated with a random one; build the model with the checkpoint's class count "
                        "(--model-kwargs num_classes=N) and evaluate on a folder of its classes")
    if report.rope_freqs_loaded:
        return
    axial = name.replace("_mixed", "_axial") if "_mixed" in name else "an axial RoPE model"
    raise UserError(f"{source} has no learned RoPE frequencies for {name}, a mixed RoPE model, so they would be "
                    "evaluated at their random initialisation; evaluate a checkpoint of a mixed model trained or "
                    f"fine-tuned with them, or for an axial RoPE checkpoint pick {axial}")


def create_from_checkpoint(path: str | Path, model: str | None = None, **overrides: Any) -> nn.Module:
    """The model ``path`` (any weights file, a ``train.py`` checkpoint or a folder) describes, built and loaded; weights
    the file lacks are initialised with a warning and listed in ``model.load_report``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint at {path}: give a weights file, a train.py checkpoint or a folder "
                                "with its config.json (transformers' DINOv3, PaPE's official classifiers).")
    fmt, config = (folder_format(path) if model is None else None) or (None, None)
    weights = weights_in(path)  # a folder's weights file
    if fmt is not None:  # its config describes the model, and the weights are checked against the config
        if fmt.folder.check_weights is not None:  # read here only where the config says what the weights must be
            fmt.folder.check_weights(config, read_weights(weights))
        name, args = fmt.folder.model(config)
    elif is_training_checkpoint(weights):
        if model is not None or overrides:
            raise ValueError(f"{path} is a train.py checkpoint, which rebuilds its model as it was trained; "
                             f"model= and {sorted(overrides)} do not apply: set a policy after loading "
                             "(model.set_resolution_policy) or fine-tune from it with train.py finetune=PATH.")
        return load_trained(path).model
    else:
        name, args = describe(weights)
    if model is None and name is None:
        raise ValueError(f"The keys of {path} do not say which model it is (timm's ViT or DeiT-III, an axial RoPE-ViT "
                         "port, a vit_rope state dict, timm's Eva families, which share their keys, a width of no "
                         "registered size, a folder's weights without its config.json): pass model= and the arguments "
                         "that differ, e.g. model='vit_rope_small_patch16_axial_224'.")
    if weights.name.endswith(".index.json"):  # shards, which timm's loader does not read: ours after building
        built = timm.create_model(model or name, **{**args, **overrides})
        load_weights(built, weights)
        return built
    overlay = dict(file=str(weights), custom_load=False, **{k: v for k, v in args.items() if k == "num_classes"})
    return timm.create_model(model or name, pretrained=True, pretrained_cfg_overlay=overlay, **{**args, **overrides})
