"""LookHere's directed attention masks and distance penalties (Fuller et al., NeurIPS 2024, arXiv:2405.13985).

The configuration is the official code's dict (github.com/GreenCUBIC/lookhere, MIT; ``CONFIG_KEYS``), written here as
pure functions of positions so that NaFlex samples and fractional coordinates work too (docs/models.md)."""

from __future__ import annotations

import math
import numbers
from itertools import groupby
from typing import Any

import torch
from torch import Tensor

from vit_rope.encodings.bias.offset_attention import scaled_offsets
from vit_rope.encodings.policies import per_sample

# Each group gives 4 heads their fields of view; a head's view is the intersection of its tokens' views. "up" is
# towards smaller y (the top row), as images are stored. "tri_*" are 90-degree cones, "diag_a_b" the union of two.
DIRECTION_GROUPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "none": ((),) * 4,
    "zero": (("zero",),) * 4,
    "none1zero3": ((),) + (("zero",),) * 3,
    "none2zero2": ((),) * 2 + (("zero",),) * 2,
    "none3zero1": ((),) * 3 + (("zero",),),
    "center": (("center",),) * 4,
    "halves": (("up",), ("down",), ("left",), ("right",)),
    "corners": (("up", "left"), ("up", "right"), ("down", "left"), ("down", "right")),
    "triangles": (("tri_up",), ("tri_down",), ("tri_left",), ("tri_right",)),
    "diagonals": (("diag_up_right",), ("diag_up_left",), ("diag_down_right",), ("diag_down_left",)),
    "eighths1": (("tri_up", "left"), ("tri_down", "left"), ("tri_left", "up"), ("tri_right", "up")),
    "eighths2": (("tri_up", "right"), ("tri_down", "right"), ("tri_left", "down"), ("tri_right", "down")),
    "zerohalves": (("zero", "up"), ("zero", "down"), ("zero", "left"), ("zero", "right")),
    "zerocorners": (("zero", "up", "left"), ("zero", "up", "right"), ("zero", "down", "left"),
                    ("zero", "down", "right")),
    "zerotriangles": (("zero", "tri_up"), ("zero", "tri_down"), ("zero", "tri_left"), ("zero", "tri_right")),
}
_UNDIRECTED = ("zero", "center", "none")  # groups whose heads take the "none" slopes
_NONE_SLOPES = (0.25, 0.0625, 0.015625, 0.00390625)
DISTANCES = ("linear", "sqrt", "square")
FILLS = ("inf", "zero", "max")
CONFIG_KEYS = ("global_slope", "layer_slopes", "head_directions", "distance", "fill_with")

# The paper's models by each head's field of view; our reading of the names (published checkpoints carry their config)
PRESETS: dict[str, dict[str, Any]] = {
    name: dict(global_slope=1.0, layer_slopes=[1.5, 0.5], head_directions=dirs, distance="linear", fill_with="inf")
    for name, dirs in (("lh180", "halves"), ("lh90", "triangles"), ("lh45", "eighths1-eighths2"))}
# (number of groups, heads) -> heads per group, as the official code assigns them
_SPLITS = {(2, 6): (4, 2), (2, 12): (8, 4), (2, 16): (8, 8), (3, 12): (4, 4, 4), (3, 16): (8, 4, 4),
           (4, 16): (4, 4, 4, 4)}


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def check_config(config: str | dict[str, Any] | None, num_heads: int, depth: int) -> dict[str, Any]:
    """The LookHere configuration as a complete dict, from a preset name, ``None`` (``lh180``) or the official dict."""
    if config is None or isinstance(config, str):
        name = config or "lh180"
        if name not in PRESETS:
            raise ValueError(f"Unknown LookHere preset {name!r}: choose one of {', '.join(PRESETS)}, or pass the "
                             f"official configuration dict with keys {', '.join(CONFIG_KEYS)}.")
        config = PRESETS[name]
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    missing = [key for key in CONFIG_KEYS[:3] if key not in config]
    if unknown or missing:
        raise ValueError(f"LookHere config {config} has unknown keys {unknown} and lacks {missing}: the keys are "
                         f"{', '.join(CONFIG_KEYS)} (the last two optional).")
    out = {"distance": "linear", "fill_with": "inf", **config}
    if out["distance"] not in DISTANCES or out["fill_with"] not in FILLS:
        raise ValueError(f"LookHere distance={out['distance']!r} and fill_with={out['fill_with']!r}: distance is one "
                         f"of {', '.join(DISTANCES)}, fill_with one of {', '.join(FILLS)}.")
    slopes = out["layer_slopes"]
    if not _numbers(out["global_slope"]):
        raise ValueError(f"LookHere global_slope must be a number (the penalty's overall scale), got "
                         f"{out['global_slope']!r}.")
    if not isinstance(slopes, (list, tuple)) or len(slopes) != 2 or not _numbers(*slopes):
        raise ValueError(f"LookHere layer_slopes must be two numbers [first, last] (linear in between), got "
                         f"{slopes!r}.")
    directions = out["head_directions"]
    if not isinstance(directions, str) and len(directions) != depth:
        raise ValueError(f"LookHere head_directions is one string, or one per layer: got {len(directions)} for "
                         f"depth {depth}.")
    for spec in [directions] if isinstance(directions, str) else directions:
        head_plan(spec, num_heads)
    out["layer_slopes"] = [float(s) for s in slopes]
    out["head_directions"] = directions if isinstance(directions, str) else list(directions)
    return out


def head_plan(spec: str, num_heads: int) -> tuple[tuple[tuple[str, ...], ...], tuple[float, ...]]:
    """Each head's direction tokens and slope, as the official code splits heads and halves slopes."""
    names = spec.split("-")
    bad = [name for name in names if name not in DIRECTION_GROUPS]
    if bad:
        raise ValueError(f"Unknown LookHere direction {bad[0]!r} in head_directions={spec!r}: choose groups of "
                         f"{', '.join(DIRECTION_GROUPS)}, joined by '-'.")
    if len(names) > num_heads:
        raise ValueError(f"LookHere head_directions={spec!r} has {len(names)} groups, more than num_heads={num_heads}: "
                         f"use at most {num_heads} groups (each group needs a head).")
    # the official split where it has one, else as even as possible, earlier groups taking the extra heads
    even = tuple(num_heads // len(names) + (i < num_heads % len(names)) for i in range(len(names)))
    counts = (num_heads,) if len(names) == 1 else _SPLITS.get((len(names), num_heads), even)
    heads = [(name, DIRECTION_GROUPS[name][i % 4]) for name, count in zip(names, counts, strict=True)
             for i in range(count)]
    slopes: list[float] = []
    for name, run in groupby(name for name, _ in heads):
        n = len(list(run))
        if any(word in name for word in _UNDIRECTED):
            slopes += [_NONE_SLOPES[i if n <= 4 else i * 4 // n] for i in range(n)]
        else:
            slopes += [2.0 ** -(1 + i // 4) for i in range(n)]
    return tuple(dirs for _, dirs in heads), tuple(slopes)


def _hidden(token: str, dx: Tensor, dy: Tensor) -> Tensor:
    if token.startswith("diag_"):
        _, first, second = token.split("_")
        return _hidden(f"tri_{first}", dx, dy) & _hidden(f"tri_{second}", dx, dy)
    if token.startswith("tri_"):  # the 90-degree cone around the axis, its edges included
        ax, ay = dx.abs(), dy.abs()
        seen = {"tri_up": -dy >= ax, "tri_down": dy >= ax, "tri_left": -dx >= ay, "tri_right": dx >= ay}[token]
        return ~seen
    return {"up": dy > 0, "down": dy < 0, "left": dx > 0, "right": dx < 0}[token]


def lookhere_penalty(positions: Tensor, directions: tuple[tuple[str, ...], ...], slopes: tuple[float, ...],
                     distance: str = "linear", fill_with: str = "inf", valid: Tensor | None = None,
                     scale: Tensor | None = None) -> Tensor:
    """Penalties ``[..., H, N, N]`` (>= 0, ``inf`` where a head does not look) of patches at ``positions``, before the
    layer and global slopes; ``valid`` ``[..., N]``: the real patches, the only ones ``center`` and ``max`` see."""
    pos = positions.float()
    if valid is None:
        valid = torch.ones(pos.shape[:-1], dtype=torch.bool, device=pos.device)
    center = None
    if any("center" in dirs for dirs in directions):  # the middle of the image's patches (their bounding box)
        lo = pos.masked_fill(~valid[..., None], float("inf")).amin(-2, keepdim=True)
        hi = pos.masked_fill(~valid[..., None], float("-inf")).amax(-2, keepdim=True)
        middle = pos - (lo + hi) / 2
        center = (middle if scale is None else middle * per_sample(scale, pos)).norm(dim=-1)[..., None, :]  # [.., 1, N]
    offsets = scaled_offsets(pos, scale)  # [..., N(query), N(key), 2], key minus query
    return offset_penalty(offsets, directions, slopes, distance, fill_with, center,
                          valid[..., :, None] & valid[..., None, :])


def offset_penalty(offsets: Tensor, directions: tuple[tuple[str, ...], ...], slopes: tuple[float, ...],
                   distance: str = "linear", fill_with: str = "inf", center: Tensor | None = None,
                   pairs: Tensor | None = None) -> Tensor:
    """Penalties ``[..., H, Q, K]`` of key-minus-query offsets ``[..., Q, K, 2]``; ``center`` ``[..., 1, K]``: each
    key's distance to the image's middle, ``pairs``: the real pairs that ``max`` takes its largest over."""
    dx, dy = offsets.unbind(-1)
    dist = offsets.square().sum(-1)  # squared, so that "square" needs no sqrt
    dist = {"linear": dist.sqrt(), "sqrt": dist.sqrt().sqrt(), "square": dist}[distance]
    heads = []
    for dirs, slope in zip(directions, slopes, strict=True):
        if "zero" in dirs:
            value = torch.zeros_like(dist)
        elif "center" in dirs:  # only from positions (lookhere_penalty): tables per offset have no center heads
            value = center.expand_as(dist)
        else:
            value = dist
        hidden = torch.zeros_like(dist, dtype=torch.bool)
        for token in dirs:
            if token not in ("zero", "center"):
                hidden = hidden | _hidden(token, dx, dy)
        if fill_with == "inf":
            value = value.masked_fill(hidden, float("inf"))
        elif fill_with == "max":
            top = (value if pairs is None else value.masked_fill(~pairs, 0)).amax((-2, -1), keepdim=True)
            value = torch.where(hidden, top, value)
        else:
            value = value.masked_fill(hidden, 0.0)
        heads.append(value * slope)
    return torch.stack(heads, dim=-3)  # [..., H, Q, K]


def layer_scales(config: dict[str, Any], depth: int) -> list[float]:
    first, last = config["layer_slopes"]
    ramp = torch.linspace(first, last, depth, dtype=torch.float64, device="cpu").tolist()  # under any device context
    return [-config["global_slope"] * slope for slope in ramp]
