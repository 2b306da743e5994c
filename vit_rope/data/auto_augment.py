"""timm's auto-augment transforms (``timm.data.auto_augment``: RandAugment ``rand-*``, AugMix ``augmix-*``, AutoAugment
``original``/``originalr``/``v0``/``v0r``, ThreeAugment ``3a``) made safe under the installed Pillow, and probed before
the loader starts, so that no auto-augment string can stop a run mid-epoch inside a loader worker.

Why: timm maps a magnitude to "keep ``bits`` most significant bits" and passes 0 bits on. ``PosterizeIncreasing``
(``rand-*-inc1``, ``augmix``, ``originalr``, ``v0r``) asks for ``4 - int(m / 10 * 4)`` bits: 0 at magnitude 10, which
``mstd`` noise reaches (``rand-m9-mstd0.5-inc1``: 2.3% of its Posterize draws), and below 0 past it (``mmax`` > 10).
``Posterize`` (``rand-*`` without ``inc1``, ``v0``) asks for ``int(m / 10 * 4)`` bits: 0 below magnitude 2.5 (``v0``
has ``('Posterize', 0.8, 2)``, which timm comments "results in black image with Tpu posterize"). Pillow before 13.0
computed ``i & ~(2 ** (8 - bits) - 1)``, 0 for every 8-bit ``i`` when ``bits <= 0``: a black image, as TensorFlow's
TPU posterize (shift right, then left, by 8 bits). Pillow 13's ``ImageOps.posterize`` raises ``ValueError`` instead.
``make_safe`` gives each Posterize op a ``posterize`` that returns that black image at ``bits <= 0`` and calls timm's
otherwise: timm's distribution of ops and magnitudes is unchanged. ``safe_transform`` also runs every op at both ends
of the magnitudes it can draw and refuses, with a ``UserError``, a string that would still raise (e.g. with
``interpolation=lanczos``, which Pillow's affine transforms reject).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import PIL
from PIL import Image
from timm.data import auto_augment as timm_aa
from timm.data.auto_augment import AugmentOp

from vit_rope.errors import UserError

T = TypeVar("T")
WORKING = "rand-m9-mstd0.5-inc1"  # DeiT's RandAugment, as timm documents it
_LEVEL_DENOM = 10.0  # timm's upper bound of the magnitude unless ``mmax`` is set (``AugmentOp.__call__``)


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's ``posterize``, with ``bits_to_keep <= 0`` the black image that Pillow < 13 and TF's TPU posterize gave
    (every bit cleared) rather than Pillow 13's ``ValueError``."""
    if bits_to_keep < 1:
        return img.point([0] * 256 * len(img.getbands()))
    return timm_aa.posterize(img, bits_to_keep, **kwargs)


def augment_ops(transform: Any) -> list[AugmentOp]:
    """Every ``AugmentOp`` inside ``transform``: a timm ``Compose`` (``.transforms``), ``RandAugment`` and
    ``AugMixAugment`` (``.ops``), ``AutoAugment`` (``.policy``, a list of sub-policies)."""
    if isinstance(transform, AugmentOp):
        return [transform]
    if isinstance(transform, (list, tuple)):
        return [op for item in transform for op in augment_ops(item)]
    return [op for name in ("transforms", "ops", "policy") for op in augment_ops(getattr(transform, name, ()))]


def make_safe(transform: T) -> T:
    """``transform`` with timm's ``posterize`` replaced by ``posterize`` in each of its ops (in place; idempotent).

    ``AugmentOp`` keeps its function per instance (``self.aug_fn``), so timm's module is left as it is; the function
    is module-level, so the transform still pickles into spawned loader workers.
    """
    for op in augment_ops(transform):
        if op.aug_fn is timm_aa.posterize:
            op.aug_fn = posterize
    return transform


def magnitude_ends(op: AugmentOp) -> tuple[float, ...]:
    """The smallest and largest magnitude ``op`` can pass to its level function (``AugmentOp.__call__``): its own
    magnitude without noise, ``[0, m]`` under uniform noise (``mstd`` inf, AugMix's default), ``[0, mmax or 10]``
    under Gaussian noise, always clipped to ``[0, mmax or 10]``."""
    upper = op.magnitude_max or _LEVEL_DENOM
    own = max(0.0, min(float(op.magnitude), upper))
    if op.magnitude_std == float("inf"):
        return 0.0, own
    return (0.0, upper) if op.magnitude_std > 0 else (own,)


def _probe_image() -> Image.Image:
    """16 x 16 RGB holding every 8-bit value in each channel (the lookup-table ops see their whole table)."""
    return Image.frombytes("RGB", (16, 16), bytes(value for value in range(256) for _ in range(3)))


def failures(transform: Any) -> list[str]:
    """Each op of ``transform`` that raises at an end of its magnitude range, as ``"<op> at magnitude <m>: <error>"``.

    Every level function of timm is monotonic in the magnitude (its sign aside), so the ends bound every argument an
    op can draw. Each end runs with both signs (seeds 0 and 1 make ``_randomly_negate`` flip, then keep, the sign)
    and every interpolation the op picks from; the global ``random`` state is restored afterwards.
    """
    image = _probe_image()
    found: list[str] = []
    state = random.getstate()
    try:
        for op in augment_ops(transform):
            resample = op.kwargs.get("resample")
            for magnitude in magnitude_ends(op):
                for seed in (0, 1):
                    for mode in resample if isinstance(resample, (list, tuple)) else (resample,):
                        random.seed(seed)
                        args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()
                        try:
                            op.aug_fn(image, *args, **{**op.kwargs, "resample": mode})
                        except Exception as err:  # whatever it is, it would kill a loader worker
                            found.append(f"{op.name} at magnitude {magnitude:g}: {type(err).__name__}: {err}")
    finally:
        random.setstate(state)
    return list(dict.fromkeys(found))


def safe_transform(build: Callable[[str | None], T], auto_augment: str | None) -> T:
    """``make_safe(build(auto_augment))``, or a ``UserError`` if one of its ops still raises under the installed Pillow.

    Args:
        build: makes the transform from an auto-augment string; ``WORKING`` goes through it too, to be suggested in
            the message only if it runs with the same settings (interpolation, size).
        auto_augment: timm's auto-augment string, or None for none.
    """
    found = failures(transform := make_safe(build(auto_augment)))
    if not found:
        return transform
    fix = "null for none" if failures(make_safe(build(WORKING))) else f"{WORKING} (DeiT's RandAugment)"
    raise UserError(f"auto_augment={auto_augment} would stop the run in a data loader worker under Pillow "
                    f"{PIL.__version__}: timm's {found[0]}; use auto_augment={fix}, or change the setting the error "
                    "names")
