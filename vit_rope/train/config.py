"""Training config: one flat dataclass, YAML files that inherit (``base: other.yaml``) and ``key=value`` overrides."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from vit_rope.errors import UserError


@dataclasses.dataclass
class Config:
    """Every training setting; see ``configs/base.yaml`` for what each key does."""

    # run
    output: str = "output/run"
    data_dir: str | None = None
    dataset: str | None = None
    train_split: str = "train"
    val_split: str = "val"
    input_key: str | None = None
    target_key: str | None = None
    train_fraction: float = 1.0
    train_subset_seed: int = 0
    download_size: Literal["full", "320px", "160px"] = "320px"
    resume: str | None = None
    finetune: str | None = None
    seed: int = 0
    device: Literal["auto", "cuda", "cpu"] = "auto"
    log_interval: int = 50
    checkpoint_interval: int = 0
    keep_every: int = 0
    val_interval: int = 1
    threads: int = 0
    # model
    model: str = "vit_rope_small_patch16_mixed_224"
    model_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    img_size: int = 224
    drop_path: float = 0.1
    model_ema: bool = False
    model_ema_decay: float = 0.9998
    grad_checkpointing: bool | int = False
    # data
    batch_size: int = 128
    train_sizes: list[int] = dataclasses.field(default_factory=list)
    token_budget: bool = True
    naflex: bool = False
    naflex_seq_lens: list[int] = dataclasses.field(default_factory=lambda: [128, 256, 576, 784, 1024])
    naflex_val_seq_len: int = 0
    workers: int = 4
    decoded_cache: bool = False
    pipeline: Literal["auto", "tensor", "timm"] = "auto"
    cache_dir: str | None = None
    cache_size: int = 0
    crop_pct: float | None = None
    interpolation: str | None = None
    train_crop_mode: Literal["rrc", "rkrc", "rkrr"] = "rrc"
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.08, 1.0])
    hflip: float = 0.5
    color_jitter: float = 0.4
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    reprob: float = 0.25
    repeated_aug: bool = False
    mixup: float = 0.8
    cutmix: float = 1.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    # loss and optimisation
    loss: Literal["ce", "bce"] = "ce"
    smoothing: float = 0.1
    opt: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    momentum: float = 0.9
    clip_grad: float | None = None
    clip_mode: Literal["norm", "value", "agc"] = "norm"
    sched: str = "cosine"
    epochs: int = 300
    warmup_epochs: int = 5
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_epochs: float = 30.0
    decay_rate: float = 0.1
    # performance (CUDA only; ignored on CPU)
    amp: bool = True
    amp_dtype: Literal["bfloat16", "float16"] = "bfloat16"
    channels_last: bool = True
    compile: bool = False
    tf32: bool = True


CLI_FLAGS = {"data_dir": "DIR", "dataset": "KIND/NAME", "train_split": "NAME", "val_split": "NAME", "output": "DIR",
             "model": "NAME", "img_size": "N", "epochs": "N", "batch_size": "N", "device": "auto|cuda|cpu",
             "resume": "PATH", "log_interval": "N"}  # shorthands for key=value; timm's train.py has the same flags
_HINTS = typing.get_type_hints(Config)


# other trainers' names of keys (timm, Hugging Face, DeiT): the closest spelling misleads (learning_rate ~ decay_rate)
_OTHER_NAMES = {"learning_rate": "lr", "optimizer": "opt", "scheduler": "sched", "num_epochs": "epochs",
                "drop_path_rate": "drop_path", "label_smoothing": "smoothing", "num_workers": "workers",
                "input_size": "img_size", "image_size": "img_size", "model_name": "model", "aa": "auto_augment",
                "bce_loss": "loss", "warmup": "warmup_epochs", "data": "data_dir", "ema": "model_ema"}


def _unknown_key(key: str, source: str) -> UserError:
    closest = _OTHER_NAMES.get(key) or difflib.get_close_matches(key, list(_HINTS), n=1, cutoff=0)[0]
    return UserError(f"unknown config key '{key}' {source}; did you mean '{closest}'? (all keys: configs/base.yaml)")


def _type_name(hint: Any) -> str:
    """How the expected type of a key reads in an error: ``int``, ``a list of float``, ``'cpu' or 'cuda'``, ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) if arg is not type(None) else "null" for arg in args)
    if origin is Literal:
        return " or ".join(repr(arg) for arg in args)
    if origin is list:
        return f"a list of {args[0].__name__}"
    if origin is dict:
        return "a mapping such as {depth: 6}"
    return "true or false" if hint is bool else "a finite number" if hint is float else hint.__name__


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """``value`` converted to the type ``hint``, else a ``UserError`` naming the key, the value and the type. Numeric
    strings are floats (YAML 1.1 reads ``4e-3`` as text); NaN and infinity are no setting's value."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:  # the first type that takes the value
            with contextlib.suppress(UserError):
                return _coerce(key, value, arg, source)
    elif ((origin is Literal and value in args) or (hint in (bool, str, type(None)) and isinstance(value, hint))
          or (hint is int and isinstance(value, int) and not isinstance(value, bool))):
        return value
    elif hint is float and isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            if math.isfinite(number := float(value)):
                return number
    elif origin is dict and isinstance(value, dict):
        return dict(value)
    elif origin is list and isinstance(value, list | tuple):
        try:
            return [_coerce(key, v, args[0], source) for v in value]
        except UserError as err:
            raise UserError(f"{err} (an entry of {value!r})") from None
    raise UserError(f"config key '{key}' {source} must be {_type_name(hint)}, got {value!r}")


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The keys of a config file and its chain of ``base:`` parents, typed; a child's value replaces its parent's."""
    path = Path(path).resolve()
    if path in _seen:
        raise UserError(f"config inheritance loops back to {path}; remove one of the 'base:' entries")
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        where = f"named by 'base:' in {_seen[-1]}; fix that line" if _seen else "pass an existing YAML file with -c"
        raise UserError(f"config file {path} {what}; {where}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(raw, dict):
        raise UserError(f"config file {path} must hold 'key: value' lines, got {type(raw).__name__}")
    parent = raw.pop("base", None)
    if unknown := [key for key in raw if key not in _HINTS]:
        raise _unknown_key(unknown[0], f"in {path}")
    values = typed(raw, f"in {path}")
    return values if parent is None else {**load_yaml(path.parent / parent, (*_seen, path)), **values}


def typed(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The keys of ``values`` that a config has (not those an older version saved), typed as ``load_yaml`` types."""
    return {key: _coerce(key, value, _HINTS[key], source) for key, value in values.items() if key in _HINTS}


def parse_override(item: str) -> tuple[str, str | None, Any]:
    """``key=value`` or ``key.entry=value`` as a checked key, the dict entry (or None) and a typed value: YAML, but for
    text keys, kept verbatim (YAML would mangle 'a: b' or '#')."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"command-line override '{item}' is not of the form key=value (e.g. lr=1e-3)")
    key, _, subkey = key.replace("-", "_").partition(".")
    if key not in _HINTS:
        raise _unknown_key(key, "on the command line")
    hint = _HINTS[key]
    if subkey:
        if typing.get_origin(hint) is not dict:
            raise UserError(f"'{key}.{subkey}' on the command line: only dict keys such as model_kwargs take a '.'")
        return key, subkey, _read_yaml(item, text)
    plain = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    if all(arg is str or typing.get_origin(arg) is Literal for arg in plain):  # text (str, Literal) stays verbatim
        value = None if text in ("", "null", "~") else text
    else:
        value = _read_yaml(item, text)
    return key, None, _coerce(key, value, hint, "on the command line")


def _read_yaml(item: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        raise UserError(f"command-line override '{item}' is not valid YAML ({problem}); write lists as [1, 2], "
                        "mappings as {depth: 6}, and quote text with ':' or '#' in it") from None


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML that ``-c`` can read back to repeat the run."""
    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
