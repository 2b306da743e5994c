"""The windows of a Swin Transformer at each evaluation size: kept as trained (``keep``: the policies change nothing),
scaled with the image (``scale``, timm's ``set_input_size`` rule) or given (docs/evaluation.md)."""

from __future__ import annotations

import argparse

from timm.models.swin_transformer import SwinTransformer, calc_stage_window_sizes
from torch import nn

from vit_rope.errors import UserError


def window_arg(text: str) -> str | int:
    if text in ("keep", "scale"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a window size: keep (as trained), scale (with the image, as "
                                     "timm's set_input_size) or a whole number of tokens, e.g. 12")


def has_windows(model: nn.Module) -> bool:
    return isinstance(model, SwinTransformer)


def stage_grids(model: SwinTransformer, size: int) -> list[tuple[int, int]]:
    """Each stage's token grid at ``size`` px: the patch grid, halved (rounding up) from the second stage on."""
    return [tuple(-(-size // (side * 2**stage)) for side in model.patch_embed.patch_size)
            for stage in range(len(model.layers))]


def check_windows(model: nn.Module, sizes: list[int], rule: str | int, pad: bool, label: str) -> None:
    """Refuse, before anything runs, a size whose stages a Swin's windows of ``rule`` do not tile (unless ``pad``)."""
    if pad or not has_windows(model):
        return
    step = model.patch_embed.patch_size[0]
    for size in sizes:
        untiled = _untiled(model, size, rule)
        if untiled:
            stage, grid, window = untiled
            nearby = sorted(range(step, 2 * size + step, step), key=lambda s: (abs(s - size), s))  # whole patches
            near = [s for s in nearby if not _untiled(model, s, rule)]
            raise UserError(f"{label} at {size} px: stage {stage + 1}'s {grid[0]}x{grid[1]} tokens are not a whole "
                            f"number of {window[0]}x{window[1]} windows; evaluate at "
                            f"{' or '.join(map(str, near[:2])) or 'another size'}, choose another --window-size, or "
                            "pass --pad-windows to pad the windows as timm's dynamic_img_size does")


def set_windows(model: SwinTransformer, size: int, rule: str | int) -> list[tuple[int, int]]:
    """Give ``model`` the windows of ``rule`` for images of ``size`` px; returns each stage's window in use."""
    model.set_input_size(img_size=(size, size), window_size=_explicit(model, rule))
    return [tuple(stage.blocks[0].window_size) for stage in model.layers]


def _explicit(model: SwinTransformer, rule: str | int) -> tuple[tuple[int, int], ...] | int | None:
    """The ``window_size`` that timm's ``set_input_size`` takes for ``rule``: None scales the trained windows, timm's
    private ``_ref_window_sizes`` (no public attribute has them: ``get_model_args`` only the windows given to
    ``create_model``, a block's ``window_size`` is capped at its grid), which ``keep`` and ``scale`` leave as built."""
    return None if rule == "scale" else model._ref_window_sizes if rule == "keep" else rule


def _untiled(model: SwinTransformer, size: int, rule: str | int) -> tuple[int, tuple[int, int], tuple[int, int]] | None:
    """First (stage, grid, window) at ``size`` px whose ``rule`` windows (capped at the grid, as timm) do not tile."""
    grids = stage_grids(model, size)
    wanted = calc_stage_window_sizes(grids[0], model._ref_window_sizes, model._ref_grid_size,  # private: _explicit
                                     window_size=_explicit(model, rule))
    for stage, (grid, window) in enumerate(zip(grids, wanted, strict=True)):
        window = tuple(min(g, w) for g, w in zip(grid, window, strict=True))
        if any(g > w and g % w for g, w in zip(grid, window, strict=True)):
            return stage, grid, window
    return None
