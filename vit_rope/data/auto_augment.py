"""timm's auto-augment transforms made safe under the installed Pillow and probed before the loader starts, so that no
auto-augment string can stop a run mid-epoch inside a loader worker (docs/training.md). timm's Posterize ops ask for 0
bits at some magnitudes: a black image before Pillow 13, a ``ValueError`` since. ``make_safe`` restores the black
image; ``safe_transform`` refuses what still raises."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any, TypeVar

import PIL
from PIL import Image
from timm.data import auto_augment as timm_aa
from timm.data.auto_augment import AugmentOp

from vit_rope.data.steps import global_rng_kept
from vit_rope.errors import UserError

T = TypeVar("T")
WORKING = "rand-m9-mstd0.5-inc1"  # DeiT's RandAugment, as timm documents it
_LEVEL_DENOM = 10.0  # timm's upper bound of the magnitude unless ``mmax`` is set (``AugmentOp.__call__``)


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's ``posterize``, with ``bits_to_keep <= 0`` the black image of Pillow < 13 (not Pillow 13's error)."""
    if bits_to_keep < 1:
        return img.point([0] * 256 * len(img.getbands()))
    return timm_aa.posterize(img, bits_to_keep, **kwargs)


def augment_ops(transform: Any) -> list[AugmentOp]:
    """Every ``AugmentOp`` inside ``transform`` (a ``Compose``, ``RandAugment``, ``AugMixAugment``, ``AutoAugment``)."""
    if isinstance(transform, AugmentOp):
        return [transform]
    if isinstance(transform, (list, tuple)):
        return [op for item in transform for op in augment_ops(item)]
    return [op for name in ("transforms", "ops", "policy") for op in augment_ops(getattr(transform, name, ()))]


def make_safe(transform: T) -> T:
    """``transform`` with timm's ``posterize`` replaced by ours in each op: per instance, so timm's module is
    untouched; module-level, so the transform still pickles into spawned workers."""
    for op in augment_ops(transform):
        if op.aug_fn is timm_aa.posterize:
            op.aug_fn = posterize
    return transform


def failures(transform: Any) -> list[str]:
    """Each op of ``transform`` that raises at an end of its magnitude range (timm's level functions are monotonic,
    so the ends bound every argument), with both signs and every interpolation the op picks from."""
    # every 8-bit value in each channel, for the lookup-table ops
    image = Image.frombytes("RGB", (16, 16), bytes(value for value in range(256) for _ in range(3)))
    found: list[str] = []
    with global_rng_kept():
        for op in augment_ops(transform):
            resample = op.kwargs.get("resample")
            modes = resample if isinstance(resample, (list, tuple)) else (resample,)
            upper = op.magnitude_max or _LEVEL_DENOM  # the magnitudes AugmentOp.__call__ can pass to the level_fn
            own = max(0.0, min(float(op.magnitude), upper))
            ends = (0.0, own) if op.magnitude_std == float("inf") else (0.0, upper) if op.magnitude_std > 0 else (own,)
            for magnitude, seed, mode in itertools.product(ends, (0, 1), modes):
                random.seed(seed)  # the sign of the level functions' _randomly_negate
                args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()
                try:
                    op.aug_fn(image, *args, **{**op.kwargs, "resample": mode})
                except Exception as err:  # whatever it is, it would kill a loader worker
                    found.append(f"{op.name} at magnitude {magnitude:g}: {type(err).__name__}: {err}")
    return list(dict.fromkeys(found))


def safe_transform(build: Callable[[str | None], T], auto_augment: str | None) -> T:
    """``make_safe(build(auto_augment))``, or a ``UserError`` if an op still raises under the installed Pillow."""
    found = failures(transform := make_safe(build(auto_augment)))
    if not found:
        return transform
    fix = "null for none" if failures(make_safe(build(WORKING))) else f"{WORKING} (DeiT's RandAugment)"
    raise UserError(f"auto_augment={auto_augment} would stop the run in a data loader worker under Pillow "
                    f"{PIL.__version__}: timm's {found[0]}; use auto_augment={fix}, or change the setting the error "
                    "names")
