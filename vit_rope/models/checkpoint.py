"""Loading the weights users have into vit_rope models, never silently: what a load took, initialised (and why),
skipped and converted is ``model.load_report``, and an incomplete load (scoring like a broken model) warns."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.layers import resample_patch_embed
from torch import Tensor, nn

from vit_rope.encodings.ape import fit_checkpoint_pos_embed
from vit_rope.models.eva_families import check_family
from vit_rope.models.formats import checkpoint_format, folder_format, weights_in
from vit_rope.models.pos_encoding import encoding_key
from vit_rope.weights import ROPE_BUFFERS, read_weights, unwrap_state_dict, weights_mismatch

CLASSIFIER = ("head.weight", "head.bias", "head.fc.weight", "head.fc.bias")  # ViT, Swin

# why a weight holds its initial value (keys of LoadReport.initialised; checkpoint._fit_classifier words the head's)
ROPE_FREQS = "learned RoPE frequencies kept at their random initialisation"
LAYERSCALE = "LayerScale set to the identity"
STRING = "Cayley-STRING bases set to the identity (the base RoPE kind)"


class WeightsNotLoadedWarning(UserWarning):
    """A checkpoint lacked weights, initialised instead, or held an APE that a RoPE-only model has no place for."""


@dataclass(frozen=True)
class LoadReport:
    """``model.load_report``: ``source`` (None: timm read it), ``skipped`` keys, a ``converted`` line per change."""

    source: str | None
    loaded: tuple[str, ...]
    initialised: Mapping[str, tuple[str, ...]]
    skipped: tuple[str, ...] = ()
    converted: tuple[str, ...] = ()

    @property
    def rope_freqs_loaded(self) -> bool:
        """False when the model has learned (mixed) RoPE frequencies and the checkpoint had none."""
        return ROPE_FREQS not in self.initialised

    @property
    def head_reason(self) -> str | None:
        """Why the model's classifier holds its initial values; None when it was loaded or the model has none."""
        return next((reason for reason, keys in self.initialised.items() if set(keys) & set(CLASSIFIER)), None)

    def summary(self) -> str:
        """The initialised weights in one line, by reason; empty when everything was loaded."""
        def keys(names: tuple[str, ...]) -> str:
            return ", ".join(names) if len(names) <= 3 else f"{names[0]}, ..., {names[-1]}: {len(names)} tensors"

        return "; ".join(f"{reason} ({keys(names)})" for reason, names in self.initialised.items())


def warn_initialised(load: LoadReport) -> None:
    """One ``WeightsNotLoadedWarning`` for a load that initialised weights or dropped the checkpoint's APE."""
    parts = []
    if load.initialised:
        parts.append(f"lacks weights of the model, which were initialised instead: {load.summary()}")
    if "pos_embed" in load.skipped:
        parts.append("has an absolute position embedding (pos_embed), which was not loaded: the model has none and "
                     "encodes positions with RoPE alone (its +APE variant, *_ape, keeps it)")
    if parts:
        advice = "load a checkpoint that has them" if load.initialised else "load it into the +APE variant"
        warnings.warn(f"{load.source or 'The checkpoint'} {'; it also '.join(parts)}. Fine for fine-tuning; for "
                      f"evaluation, {advice}.", WeightsNotLoadedWarning, stacklevel=3)


# the weights a checkpoint may lack, filled so that the model keeps its function: (key, fill, the report's reason)
_FILLS = ((r"pos_encoding\.\d+\.freqs|layers\.\d+\.blocks\.\d+\.attn\.rope\.freqs", lambda value: value, ROPE_FREQS),
          (r"blocks\.\d+\.ls[12]\.gamma", torch.ones_like, LAYERSCALE),
          (r"blocks\.\d+\.attn\.string\.skew", torch.zeros_like, STRING))


def _split_mixed_freqs(freqs: Tensor, model: nn.Module) -> dict[str, Tensor]:
    """``[2, depth, nh, D/2]`` (timm) or ``[2, depth, nh * D/2]`` (RoPE-ViT) -> one ``[2, nh, D/2]`` per block."""
    if not getattr(getattr(model, "pos_encoding", None), "per_block", False):
        raise ValueError(f"The checkpoint has learned mixed RoPE frequencies {tuple(freqs.shape)}, but the model is "
                         "not a mixed RoPE model: load it into a vit_rope_*_mixed* model.")
    target = model.pos_encoding[0].freqs.shape  # [2, nh, D/2]
    depth = freqs.shape[1]
    if depth != len(model.pos_encoding) or freqs[:, 0].numel() != target.numel():
        raise ValueError(f"Mixed RoPE frequencies of shape {tuple(freqs.shape)} do not fit a model with depth "
                         f"{len(model.pos_encoding)} and per-layer frequencies {tuple(target)}: pick the model of the "
                         "same size as the checkpoint.")
    freqs = freqs.reshape(2, depth, *target[1:])
    return {f"pos_encoding.{i}.freqs": freqs[:, i].clone() for i in range(depth)}


def _convert(state_dict: dict[str, Any], model: nn.Module, source: str | Path | None = None,
             classifier: tuple[bool, int | None] | None = None) -> tuple[dict[str, Tensor], LoadReport]:
    """``convert_state_dict`` and its load report; ``classifier``: ``_fit_classifier``'s ``headless``, ``declared``."""
    state_dict = unwrap_state_dict(state_dict)
    fmt = checkpoint_format(state_dict)
    check_family(state_dict, model)
    state_dict, converted = fmt.convert(state_dict, model)  # the model's keys and q / k layout, and notes
    target = model.state_dict()
    out: dict[str, Tensor] = {}
    dropped: tuple[str, ...] = ()
    for key, value in state_dict.items():
        if ROPE_BUFFERS.match(key):
            continue
        if key in ("rope.freqs", "freqs"):
            out.update(_split_mixed_freqs(value, model))
            continue
        key = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", encoding_key(key))  # EVA / DeiT-III naming of LayerScale
        if key == "pos_embed":
            if getattr(model, "pos_embed", None) is None:
                dropped = (key,)  # a RoPE-only model: the report says so
                continue
            value = fit_checkpoint_pos_embed(value, model)
        elif key == "patch_embed.proj.weight" and value.shape[-2:] != target[key].shape[-2:]:
            value = resample_patch_embed(value, list(target[key].shape[-2:]), verbose=False)
        out[key] = value

    initialised: dict[str, list[str]] = {why: [] for _, _, why in _FILLS}
    for key, value in target.items():
        fill = None if key in out else next((fill for fill in _FILLS if re.fullmatch(fill[0], key)), None)
        if fill is not None:
            out[key] = fill[1](value)
            initialised[fill[2]].append(key)

    body = [{key: value for key, value in state.items() if key not in CLASSIFIER} for state in (target, out)]
    if mismatch := weights_mismatch(*body):
        raise ValueError(f"The checkpoint does not fit {type(model).__name__}: {mismatch}. Check that the model name "
                         "(size, axial/mixed, +APE) and its arguments (depth, patch size, ...) match the checkpoint.")
    skipped, head = _fit_classifier(out, model, *classifier) if classifier else ((), {})
    initialised.update(head)
    taken = {key for keys in initialised.values() for key in keys}
    load = LoadReport(None if source is None else str(source), tuple(key for key in out if key not in taken),
                      {why: tuple(keys) for why, keys in initialised.items() if keys}, dropped + skipped, converted)
    return out, load


def convert_state_dict(state_dict: dict[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """A state dict of any supported format mapped onto ``model``; the weights it lacks filled in, with a warning."""
    out, load = _convert(state_dict, model)
    warn_initialised(load)
    return out


def _fit_classifier(state_dict: dict[str, Tensor], model: nn.Module, headless: bool, declared: int | None
                    ) -> tuple[tuple[str, ...], dict[str, list[str]]]:
    """Take the checkpoint's classifier out unless the model loads it as it is: the keys taken out, ``{why: the
    model's head keys}`` if those stay initialised. ``declared``: the config's class count where timm drops the head."""
    target = model.state_dict()
    ours = [] if headless else [key for key in CLASSIFIER if key in target]
    theirs = [key for key in CLASSIFIER if key in state_dict]
    classes = target[ours[0]].shape[0] if ours else 0
    if not ours:
        reason = None  # nothing to fill: num_classes=0 or features_only
    elif not theirs:
        reason = "classifier absent from the checkpoint"
    elif [state_dict[key].shape for key in theirs] != [target[key].shape for key in ours]:
        reason = (f"classifier of another size: the checkpoint has {state_dict[theirs[0]].shape[0]} classes, the "
                  f"model {classes}")
    elif declared is not None:
        reason = (f"classifier dropped by timm, as num_classes ({classes}) differs from the pretrained config's "
                  f"({declared}): put num_classes={classes} in pretrained_cfg_overlay to load the checkpoint's")
    else:
        return (), {}
    for key in theirs:
        del state_dict[key]
    return tuple(theirs), {reason: ours} if reason else {}


def checkpoint_filter_fn(state_dict: dict[str, Any], model: nn.Module, features_only: bool = False
                         ) -> dict[str, Tensor]:
    """timm's ``pretrained_filter_fn`` with the load report and warning; an unfit head timm keeps is an error."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    declared = cfg.get("num_classes") if cfg.get("classifier") else None
    drops = features_only or (declared is not None and getattr(model, "num_classes", 0) != declared)
    out, model.load_report = _convert(state_dict, model, None, (features_only, declared if drops else None))
    if model.load_report.head_reason and not drops:  # timm loads it strictly: say why it cannot, not torch's error
        raise ValueError(f"The checkpoint does not fit {type(model).__name__}: {model.load_report.head_reason}.\n"
                         "timm loads the classifier as it is, since num_classes equals the pretrained config's "
                         f"({declared}); pass the checkpoint's class count as num_classes, or put it in "
                         "pretrained_cfg_overlay (as num_classes) to start a new classifier.")
    warn_initialised(model.load_report)
    return out


def load_weights(model: nn.Module, path: str | Path | Mapping[str, Any]) -> LoadReport:
    """Load a weights file, folder (``config.json`` checked first) or state dict; the head only if its shape fits."""
    if isinstance(path, Mapping):
        return load_state_dict(model, dict(path))
    weights = weights_in(path)
    fmt, config = folder_format(path) or (None, None)
    if fmt is not None:  # its config checked against the model, then against the weights
        fmt.folder.check_model(config, model)
    state_dict = read_weights(weights)
    if fmt is not None and fmt.folder.check_weights is not None:
        fmt.folder.check_weights(config, state_dict)
    try:
        return load_state_dict(model, state_dict, path)
    except ValueError as err:
        raise ValueError(f"{weights}: {err}") from None


def load_state_dict(model: nn.Module, state_dict: dict[str, Any], source: str | Path | None = None) -> LoadReport:
    """``load_weights`` for a state dict already in memory (``vit_rope.from_timm`` passes a timm model's)."""
    state_dict, load = _convert(state_dict, model, source, (False, None))
    model.load_state_dict(state_dict, strict=False)  # _convert already checked every key but the head
    model.load_report = load
    warn_initialised(load)
    return load
