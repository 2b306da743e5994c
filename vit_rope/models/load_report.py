"""What loading a checkpoint did, and the warning that keeps an incomplete load (scoring like a broken model) loud."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

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
