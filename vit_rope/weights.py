"""Weights files and state dicts: reads that tell corrupt files from wrong ones, key mismatches, atomic saves."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from timm.models import load_state_dict
from torch import nn

# every source's RoPE buffers (timm's, DINOv3's, RoPE-ViT's), rebuilt per input, never loaded; learned ``freqs`` load
ROPE_BUFFERS = re.compile(r"^(rope\.(?!(\d+\.)?freqs$)|rope_embed\.|freqs_t_[xy]$|freqs_cis$)")
Converted = tuple[dict[str, Any], tuple[str, ...]]  # a state dict in our keys (but for generic renames), and notes
Description = tuple[str | None, dict[str, Any]]  # the model a checkpoint describes: a name (None: not said), arguments


@dataclass(frozen=True)
class Folder:
    """A format saved as a folder: a config file that it ``claims`` and that decides the ``model`` (name, arguments)
    beside the weights; ``check_model`` / ``check_weights`` raise unless a model / state dict is what it describes."""

    config_name: str
    weights_name: str
    claims: Callable[[dict[str, Any]], bool]
    model: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]
    check_model: Callable[[dict[str, Any], nn.Module], None]
    check_weights: Callable[[dict[str, Any], dict[str, Any]], None] | None = None

    def config(self, path: str | Path) -> dict[str, Any] | None:
        """The config of the folder ``path`` (or beside its weights file), or ``None`` for none of this format's."""
        path = Path(path)
        file = (path if path.is_dir() else path.parent) / self.config_name
        ours = path.is_dir() or path.name in (self.weights_name, f"{self.weights_name}.index.json")  # or its weights
        if not ours or not file.is_file():
            return None
        config = json.loads(file.read_text())
        return config if isinstance(config, dict) and self.claims(config) else None


@dataclass(frozen=True)
class Format:
    """A checkpoint format: the ``marker`` its state dicts carry, its conversion, what it says of the model."""

    name: str
    marker: str
    carries: Callable[[Mapping[str, Any]], bool]
    convert: Callable[[dict[str, Any], nn.Module], Converted]
    describe: Callable[[Mapping[str, Any]], Description] = lambda state_dict: (None, {})
    model_args: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    folder: Folder | None = None


class UnreadableCheckpointError(ValueError):
    """A weights file whose bytes the library could not parse: truncated, corrupt, or not a checkpoint at all."""


def _well_formed(path: Path) -> bool:
    """True when ``path`` parses as safetensors, or as a torch pickle that needs classes ``weights_only`` refuses."""
    with suppress(Exception), safe_open(str(path), framework="pt"):  # not safetensors: SafetensorError
        return True
    with suppress(Exception):  # not a torch checkpoint either (or torch < 2.5, which cannot tell)
        return bool(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    return False


def unreadable_reason(path: str | Path, err: Exception) -> str | None:
    """Why a file whose reading raised ``err`` is corrupt, with the fix; None where ``err`` has another cause."""
    # the operating system's errors are its own, but for EINVAL: a seek past the end of a truncated zip archive
    system = isinstance(err, OSError) and err.errno != errno.EINVAL or isinstance(err, MemoryError)
    if system or _well_formed(Path(path)):
        return None
    while err.__cause__ is not None:  # timm re-raises torch's errors with advice for valid files
        err = err.__cause__
    text = str(err).split("WeightsUnpickler error:")[-1]  # torch's weights_only failure: the advice before is too
    detail = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
    detail = detail if len(detail) <= 200 else detail[:197] + "..."
    return (f"the file is truncated or corrupt (or not a weights file); download it again or save it again "
            f"[{type(err).__name__}: {detail}]")


def unwrap_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The state dict inside a training script's container (EMA first), without DDP's ``module.`` prefixes."""
    for key in ("model_ema", "state_dict_ema", "model", "state_dict", "module"):  # EMA first, as timm's loader
        if isinstance(state_dict.get(key), dict):
            return unwrap_state_dict(state_dict[key])
    return {k.removeprefix("module."): v for k, v in state_dict.items()}


def renamed_keys(state_dict: Mapping[str, Any], renames: Mapping[str, str], layers: str,
                 layer_renames: Mapping[str, str]) -> dict[str, Any]:
    """An official format's state dict in our keys: ``{layers}{i}.rest`` becomes ``blocks.{i}.`` and ``rest`` renamed
    by ``layer_renames``, others by ``renames``. An entry renames a key equal to it or (ending in .) one it starts."""
    def renamed(key: str, table: Mapping[str, str]) -> str:
        prefix = next((p for p in table if key == p or key.startswith(p) and p.endswith(".")), None)
        return key if prefix is None else table[prefix] + key[len(prefix):]

    def ours(key: str) -> str:
        index, _, rest = key.removeprefix(layers).partition(".")
        if key.startswith(layers) and index.isdigit():
            return f"blocks.{index}.{renamed(rest, layer_renames)}"
        return renamed(key, renames)
    return {ours(key): value for key, value in state_dict.items()}


def mapped_file(path: str | Path, unwrap: bool = True) -> dict[str, Any] | None:
    """A torch file's (``unwrap``: state) dict memory-mapped ({} for another type), or None where it cannot be."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    if not isinstance(obj, dict):
        return {}
    return unwrap_state_dict(obj) if unwrap else obj


def tensor_rows(path: str | Path, key: str) -> int | None:
    """The first dimension of tensor ``key`` in a weights file, read without loading the rest; None where it cannot."""
    if Path(path).suffix == ".safetensors":
        with suppress(Exception), safe_open(str(path), framework="pt") as f:  # but a corrupt header
            return f.get_slice(key).get_shape()[0] if key in f.keys() else None
        return None
    value = (mapped_file(path) or {}).get(key)
    return int(value.shape[0]) if isinstance(value, torch.Tensor) and value.dim() else None


# a VLM's language model (transformers', Llava's and Qwen-VL's layouts), which no twin loads: never read from shards
LANGUAGE_MODEL = re.compile(r"(model\.)?language_model\.|lm_head\.|model\.(layers|embed_tokens|norm)\.")


def read_sharded(index: Path) -> dict[str, Any]:
    """A sharded safetensors index's tensors but a language model's: a VLM's tower without the billions beside it."""
    by_shard: dict[str, list[str]] = {}
    for key, shard in json.loads(index.read_text())["weight_map"].items():
        if not LANGUAGE_MODEL.match(key):
            by_shard.setdefault(shard, []).append(key)
    out = {}
    for shard, keys in by_shard.items():
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(f"{index} lists the shard {shard}, which is not in {index.parent}: download every "
                                    "shard the index names (or the vision tower's).")
        with safe_open(str(index.parent / shard), framework="pt") as file:
            out.update({key: file.get_tensor(key) for key in keys})
    return out


def read_weights(path: str | Path) -> dict[str, Any]:
    """A weights file's state dict, read as timm does (EMA weights first) and unwrapped, or a shard index's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    try:
        if path.name.endswith(".safetensors.index.json"):
            return read_sharded(path)
        return unwrap_state_dict(load_state_dict(str(path), use_ema=True, weights_only=True))
    except Exception as err:
        if (reason := unreadable_reason(path, err)) is None:
            raise
        raise UnreadableCheckpointError(f"{path} is not a readable checkpoint: {reason}") from err


def depth_of(state_dict: dict[str, Any], layer: str = "blocks") -> int | None:
    """The number of blocks (keys ``<layer>.<i>.``, ``layer`` a regex), ``None`` for none."""
    blocks = {int(m["block"]) for key in state_dict if (m := re.match(rf"{layer}\.(?P<block>\d+)\.", key))}
    return max(blocks) + 1 if blocks else None


def check_twin(model: nn.Module, is_twin: bool, source: str, twins: str, layout: str, layout_name: str = "") -> None:
    """Raise unless a checkpoint of ``source`` fits ``model``: one of its family's ``twins`` with its q/k ``layout``."""
    if not is_twin:
        raise ValueError(f"The checkpoint is {source}, which loads into {twins}; the model is a "
                         f"{type(model).__name__}.")
    if model.qk_layout != layout:
        raise ValueError(f"The checkpoint is {source}, whose q/k rows are in {layout_name or f'the {layout} layout'}, "
                         f"but the model has qk_layout={model.qk_layout!r}: leave qk_layout at the twin's {layout!r}.")


def check_config_fields(fields: Mapping[str, tuple[Any, Any]], build: str) -> None:
    """Raise at the first ``field: (the file's value, the model's)`` of a config.json that differs, naming both and
    what to ``build`` (``{field}`` and ``{theirs}`` in it: that field and the file's value)."""
    for field, (theirs, ours) in fields.items():
        if theirs != ours:
            raise ValueError(f"config.json does not fit the model: {field} is {theirs} in the file, {ours} in the "
                             f"model. Build {build.replace('{field}', field).replace('{theirs}', str(theirs))} "
                             "(vit_rope.create_from_checkpoint(folder) builds and loads it).")


def _listed(keys: Sequence[str], limit: int = 10) -> str:
    return ", ".join(keys) if len(keys) <= limit else f"{', '.join(keys[:limit])}, ... ({len(keys) - limit} more)"


def weights_mismatch(expected: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """What keeps ``given`` from loading strictly where ``expected`` does (first 10 keys of each kind), or ""."""
    missing = [key for key in expected if key not in given]
    unexpected = [key for key in given if key not in expected]
    shapes = {key: tuple(getattr(given[key], "shape", ())) for key in expected if key in given}
    reshaped = [f"{key} {shape} in the file, {tuple(expected[key].shape)} in the model" for key, shape in shapes.items()
                if shape != tuple(expected[key].shape)]
    return "; ".join(f"{len(keys)} {one if len(keys) == 1 else many}: {_listed(keys)}" for one, many, keys in (
        ("missing key", "missing keys", missing), ("unexpected key", "unexpected keys", unexpected),
        ("key of another shape", "keys of another shape", reshaped)) if keys)


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file in the same folder, then rename: a kill mid-save leaves the old file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)
