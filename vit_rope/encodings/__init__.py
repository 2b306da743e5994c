"""The position encodings, one module or subpackage per family over ``base``'s interface; importing registers them."""

from __future__ import annotations

import inspect

from vit_rope.checks import check_choice
from vit_rope.encodings.base import REGISTRY, EncodingSpec, PositionEncoding
from vit_rope.encodings.bias import attn_bias, fire, lookhere_weights  # noqa: F401  (imports register the kinds)
from vit_rope.encodings.generators import comrope, liere, liere_weights  # noqa: F401
from vit_rope.encodings.pape import pape_weights, parabolas  # noqa: F401
from vit_rope.encodings.rope import rotary_encoding  # noqa: F401
from vit_rope.encodings.rope.tables import RoPE2D

# the kinds' official checkpoint formats (vit_rope.models.formats holds them with the others)
FORMATS = (lookhere_weights.FORMAT, pape_weights.FORMAT, liere_weights.FORMAT)
KINDS = tuple(sorted(REGISTRY, key=lambda kind: not REGISTRY[kind].rope))  # RoPE kinds first, else registration order


def check_kind(kind: str) -> str:
    return check_choice(kind, KINDS, "position encoding")


def build(spec: EncodingSpec) -> PositionEncoding:
    """The encoding of ``spec.kind``, refusing ``encoding_options`` it lacks and RoPE options it would ignore."""
    entry = REGISTRY[check_kind(spec.kind)]
    unknown = sorted(set(spec.options) - set(entry.options))
    if unknown:
        takes = f"takes {', '.join(entry.options)}" if entry.options else "takes none"
        raise ValueError(f"encoding_options {unknown} do not apply to the {spec.kind} encoding, which {takes}.")
    if not entry.rope:  # RoPE options it would ignore; a value that is RoPE2D's own default changes nothing
        defaults = inspect.signature(RoPE2D).parameters
        given = [f"rope_{name}={value!r}" for name, value in spec.rope_options.items()
                 if name not in defaults or value != defaults[name].default]
        given = ", ".join(given + ([] if spec.ref_grid is None else [f"rope_ref_grid={spec.ref_grid!r}"]))
        if given:
            raise ValueError(f"{given} configure RoPE; the {spec.kind} encoding has no RoPE and would ignore them: "
                             "leave them unset.")
    return entry.build(spec)
