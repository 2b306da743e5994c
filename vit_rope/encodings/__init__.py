"""The position encodings: one interface (``base``: ``PositionEncoding``, ``BlockInput``, ``Positions``, the registry of
kinds) and one module or small subpackage per family, each holding its encodings, their options and builders:

- ``rope``: RoPE tables (axial, mixed, golden, DINOv3's; RoFormer, RoPE-ViT) and Cayley-STRING over them;
- ``bias``: attention biases, LookHere and 2D-ALiBi;
- ``generators``: rotations from learned generators, ComRoPE and LieRE;
- ``pape``: PaPE and PaPE-RI, parabolic biases written into extra q / k channels;
- ``ape``: the learned absolute table of the +APE models, beside any of the above;
- ``policies``: how positions follow grids other than the training one, shared by every kind.

Importing the package registers every kind; ``build`` makes the encoding a model's arguments describe.
"""

from __future__ import annotations

import inspect

from vit_rope.encodings.base import REGISTRY, EncodingSpec, PositionEncoding
from vit_rope.encodings.bias import attn_bias  # noqa: F401  (each family's import registers its kinds)
from vit_rope.encodings.generators import comrope, liere  # noqa: F401
from vit_rope.encodings.pape import encoding as pape_encoding  # noqa: F401
from vit_rope.encodings.rope import encoding as rope_encoding  # noqa: F401
from vit_rope.encodings.rope.tables import RoPE2D

# RoPE kinds first, then the others in the order their families registered them
KINDS = (*(kind for kind, entry in REGISTRY.items() if entry.rope), *(kind for kind, entry in REGISTRY.items() if not
entry.rope))


def check_kind(kind: str) -> str:
    """Return ``kind`` if it is a registered position encoding, else raise a ``ValueError`` listing them."""
    if kind not in REGISTRY:
        raise ValueError(f"Unknown position encoding {kind!r}: choose one of {', '.join(KINDS)}.")
    return kind


def _refuse_rope_options(spec: EncodingSpec) -> None:
    """Refuse RoPE options given to a kind without RoPE; a value that is RoPE2D's own default changes nothing."""
    defaults = inspect.signature(RoPE2D).parameters
    given = [f"rope_{name}={value!r}" for name, value in spec.rope_options.items()
             if name not in defaults or value != defaults[name].default]
    given = ", ".join(given + ([] if spec.ref_grid is None else [f"rope_ref_grid={spec.ref_grid!r}"]))
    if given:
        raise ValueError(f"{given} configure RoPE; the {spec.kind} encoding has no RoPE and would ignore them: "
                         "leave them unset.")


def build(spec: EncodingSpec) -> PositionEncoding:
    """The encoding of ``spec.kind``, after refusing what it would ignore: ``encoding_options`` it does not take, and
    RoPE's options for a kind without RoPE."""
    entry = REGISTRY[check_kind(spec.kind)]
    unknown = sorted(set(spec.options) - set(entry.options))
    if unknown:
        takes = f"takes {', '.join(entry.options)}" if entry.options else "takes none"
        raise ValueError(f"encoding_options {unknown} do not apply to the {spec.kind} encoding, which {takes}.")
    if not entry.rope:
        _refuse_rope_options(spec)
    return entry.build(spec)
