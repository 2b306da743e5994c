"""timm's auto-augment strings under the installed Pillow (vit_rope.train.loaders): every form, every op, at the ends
of the magnitudes it can draw, built as training builds it (vit_rope.train.loaders.build_transforms), must run;
the 0-bit Posterize that Pillow 13 rejects must give the black image timm means."""

from __future__ import annotations

import copy
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform

from vit_rope.errors import UserError
from vit_rope.train import loaders
from vit_rope.train.command_line import build_config
from vit_rope.train.config import Config

DATA_CONFIG = {"input_size": (3, 32, 32), "interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN,
               "std": IMAGENET_DEFAULT_STD, "crop_pct": 0.875, "crop_mode": "center"}
# form -> the ops that raise in timm's own transform under Pillow 13 at some magnitude the form can draw
FORMS = {
    "rand-m9-mstd0.5-inc1": {"PosterizeIncreasing"},  # DeiT's: noise reaches magnitude 10 -> 0 bits
    "rand-m9-mstd0.5-inc1-mmax9": set(),  # the old workaround: magnitudes capped at 9 -> 1 bit at least
    "rand-m9": set(), "rand-m9-inc1": set(),  # no noise: 3 bits, 1 bit
    "rand-m10-inc1": {"PosterizeIncreasing"},  # 0 bits at every draw
    "rand-m15-mstd1-inc1-mmax15": {"PosterizeIncreasing"},  # down to -2 bits
    "rand-m30-mstd101-inc1-mmax30": {"PosterizeIncreasing"},  # uniform noise, down to -8 bits
    "rand-m30-mmax30": set(),  # non-increasing Posterize at 30: 12 bits (identity); Solarize, enhance past 10
    "rand-m9-mstd0.5": {"Posterize"},  # non-increasing: 0 bits below magnitude 2.5
    "rand-m2-n3-p1": {"Posterize"},
    "rand-m9-mstd0.5-inc1-tweights": {"PosterizeIncreasing"},
    "rand-m9-mstd0.5-inc1-t3a": set(), "rand-m10-mstd1-inc1-t3aw": {"PosterizeIncreasing"},
    "augmix-m5-w3-d2": set(),  # uniform magnitude in [0, 5]: 2 bits at least
    "augmix-m10-w4": {"PosterizeIncreasing"}, "augmix-m30-mstd3-b1": {"PosterizeIncreasing"},
    "original": set(), "original-mstd3": set(),  # PosterizeOriginal keeps 4 to 8 bits
    "originalr": set(), "v0r": set(), "v0r-mstd1": {"PosterizeIncreasing"},
    "v0": {"Posterize"},  # ('Posterize', 0.8, 2): 0 bits, "black image with Tpu posterize"
    "3a": set(), "3a-mstd2": set(),
}


def rgb_ramp() -> Image.Image:
    """16 x 16 RGB with every 8-bit value in each channel."""
    return Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16)[..., None].repeat(3, axis=2))


def forced(op: loaders.AugmentOp, magnitude: float) -> loaders.AugmentOp:
    """A copy of ``op`` that always applies, at exactly ``magnitude`` (before timm's clipping to [0, mmax or 10])."""
    op = copy.copy(op)
    op.prob, op.magnitude, op.magnitude_std = 1.0, magnitude, 0
    return op


def train_transforms(form: str) -> list:
    cfg = build_config(None, [f"auto_augment={form}", "img_size=32", "train_sizes=[32, 48]"])  # runs check_config
    return list(loaders.build_transforms(cfg, DATA_CONFIG)[0].values())


def test_pillow_rejects_zero_bits_and_timm_asks_for_them() -> None:
    """The crash the fix is for: without it, timm's own transform dies at its extreme magnitude."""
    with pytest.raises(ValueError, match="bits must be"):
        ImageOps.posterize(rgb_ramp(), 0)
    raw = create_transform(32, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")
    posterize = next(op for op in loaders.augment_ops(raw) if op.name == "PosterizeIncreasing")
    with pytest.raises(ValueError, match="bits must be"):
        forced(posterize, 10)(rgb_ramp())
    assert loaders.make_safe(raw) is raw and posterize.aug_fn is loaders.posterize
    assert not np.asarray(forced(posterize, 10)(rgb_ramp())).any()


@pytest.mark.parametrize("bits", [-8, -2, 0, 1, 4, 7, 8, 12])
def test_posterize_is_pillow_before_13(bits: int) -> None:
    """Pillow < 13 computed ``i & ~(2 ** (8 - bits) - 1)`` for any bits (timm skips bits >= 8): black at bits <= 0."""
    image = rgb_ramp()
    mask = ~(2 ** (8 - bits) - 1) if bits < 8 else -1
    expected = np.arange(256).reshape(16, 16)[..., None].repeat(3, axis=2) & mask
    out = loaders.posterize(image, bits)
    assert out.mode == "RGB" and out.size == image.size
    np.testing.assert_array_equal(np.asarray(out), expected)
    gray = loaders.posterize(image.convert("L"), bits)
    np.testing.assert_array_equal(np.asarray(gray), np.asarray(image.convert("L")).astype(np.int64) & mask)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_op_runs_at_its_extremes(form: str) -> None:
    raw = create_transform(32, is_training=True, auto_augment=form, interpolation="bicubic")
    assert {line.split(" at ")[0] for line in loaders.failures(raw)} == FORMS[form]  # the probe sees the crashes
    for transform in train_transforms(form):
        ops = loaders.augment_ops(transform)
        # timm's ops, probabilities, magnitudes, noise and level functions: only Posterize's function is ours
        assert [repr(op) for op in ops] == [repr(op) for op in loaders.augment_ops(raw)]
        assert all(op.level_fn is timm_op.level_fn for op, timm_op in zip(ops, loaders.augment_ops(raw), strict=True))
        posterizes = {op.name for op in ops if "Posterize" in op.name}
        assert {op.name for op in ops if op.aug_fn is loaders.posterize} == posterizes
        assert loaders.failures(transform) == []
        for op in ops:
            upper = op.magnitude_max or 10
            for magnitude in {0, 2.4, 2.5, 9.99, 10, upper, upper + 5, op.magnitude}:  # past upper: clipped
                for seed in (0, 1):  # both signs of timm's _randomly_negate
                    random.seed(seed)
                    out = forced(op, magnitude)(rgb_ramp())
                    assert out.mode == "RGB" and out.size == (16, 16)
                    if "Posterize" in op.name and op.level_fn(min(magnitude, upper), op.hparams)[0] <= 0:
                        assert not np.asarray(out).any()  # 0 bits kept: black, as timm intends


@pytest.mark.parametrize("form", ["rand-m10-inc1", "v0", "augmix-m12"])
def test_whole_transform_survives_many_images(form: str) -> None:
    """Forms where 0-bit Posterize is frequent (v0: 3% of images; augmix-m12: 8%) run end to end, also after pickling
    into a spawned worker."""
    transform = pickle.loads(pickle.dumps(train_transforms(form)[0]))
    random.seed(0)
    np.random.seed(0)
    image = rgb_ramp().resize((40, 40))
    for _ in range(150):
        assert transform(image).shape == (3, 32, 32)


def test_default_is_deits_string() -> None:
    assert Config().auto_augment == "rand-m9-mstd0.5-inc1"
    assert build_config(Path(__file__).resolve().parents[2] / "configs" / "base.yaml").auto_augment == loaders.WORKING


def test_refused_before_the_loader_with_a_working_string() -> None:
    """What still raises after the fix is a UserError (an ``error:`` line) at config time, naming the op."""
    with pytest.raises(UserError, match=r"auto_augment=rand-m9-mstd0.5-inc1 would stop the run .* timm's Rotate at "
                                        r"magnitude .*LANCZOS.*use auto_augment=null for none"):
        build_config(None, ["auto_augment=rand-m9-mstd0.5-inc1", "interpolation=lanczos"])
    broken = create_transform(32, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")
    for op in loaders.augment_ops(broken):
        op.aug_fn = ImageOps.posterize  # stands for any op the installed Pillow rejects
    with pytest.raises(UserError, match=r"auto_augment=rand-m5 .* Pillow .* use auto_augment=rand-m9-mstd0.5-inc1 "):
        loaders.safe_transform(lambda name: broken if name == "rand-m5" else create_transform(
            32, is_training=True, auto_augment=name), "rand-m5")
