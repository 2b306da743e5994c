"""How many images of a size fit in memory, said before the first forward: a batch that evaluates at 224 px can need
more than the machine has at 2048 px, which ends the process without a message. The estimate errs high: measured peaks
of ViT-S at 896-2048 px (``benchmarks/scaling.py``) are 0.5-0.9x of it."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from timm.layers import to_2tuple
from torch import nn

from vit_rope.errors import UserError
from vit_rope.eval.windows import has_windows, stage_grids
from vit_rope.models.naflex_batch import naflex_patch

# one attention chunk's mask (vit_rope.encodings.bias.offset_attention) and the allocator's slack, held once
FIXED_BYTES = 256 * 2**20


def free_bytes(device: str) -> int:
    """Bytes a new allocation can take now: the GPU's free memory, or Linux's ``MemAvailable``, else the free pages."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def image_bytes(model: nn.Module, fields: dict, element: int, prefetch: int = 0) -> int | None:
    """One image's peak bytes in a forward at a setting, about: a block's widest live tensors, the input and the
    attention scores where they are materialised; a Swin's costliest stage. None for a CNN."""
    if has_windows(model):
        return _swin_bytes(model, fields["img_size"], element) + _input_bytes(fields["img_size"] ** 2, prefetch)
    blocks, width = getattr(model, "blocks", None), getattr(model, "embed_dim", None)
    patch = naflex_patch(model) or to_2tuple(getattr(getattr(model, "patch_embed", None), "patch_size", None))
    if not blocks or width is None or patch[0] is None or not hasattr(blocks[0], "mlp"):
        return None
    if fields.get("seq_len"):
        tokens, pixels = fields["seq_len"], fields["seq_len"] * patch[0] * patch[1]
    else:
        tokens, pixels = (fields["img_size"] // patch[0]) * (fields["img_size"] // patch[1]), fields["img_size"] ** 2
    tokens += getattr(model, "num_prefix_tokens", 0)
    hidden = max(m.out_features for m in blocks[0].mlp.modules() if isinstance(m, nn.Linear))
    attention = blocks[0].attn
    dense = bool(fields.get("seq_len")) or not getattr(attention, "fused_attn", True)
    scores = 2 * getattr(attention, "num_heads", 1) * tokens**2 * element if dense else 0
    return _block_bytes(tokens, width, hidden, element) + _input_bytes(pixels, prefetch) + scores


def _input_bytes(pixels: int, prefetch: int) -> int:
    """One image decoded in fp32 and as the model's input, and ``prefetch`` more (the loader's batches in waiting)."""
    return (2 + prefetch) * 3 * pixels * 4


def _block_bytes(tokens: int, width: int, hidden: int, element: int) -> int:
    """Residual, norm, q/k/v and their rotated copies, the MLP's hidden layer and its activation, twice over."""
    return tokens * 2 * (2 * hidden + 8 * width) * element


def _swin_bytes(model: nn.Module, size: int, element: int) -> int:
    """A Swin's costliest stage: its tokens padded to whole windows, and the scores where ``fused_attn`` is off."""
    peak = 0
    for stage, grid in zip(model.layers, stage_grids(model, size), strict=True):
        block = stage.blocks[0]
        window = block.window_size
        tokens = math.prod(-(-side // w) * w for side, w in zip(grid, window, strict=True))
        scores = 0 if getattr(block.attn, "fused_attn", True) else 2 * block.attn.num_heads * tokens * math.prod(
            window) * element
        peak = max(peak, _block_bytes(tokens, block.mlp.fc1.in_features, block.mlp.fc1.out_features, element)
                   + scores)
    return peak


def fit_batch(models: list[tuple[str, nn.Module]], name: str, fields: dict, batch_size: int, free: int,
              element: int = 4, prefetch: int = 0) -> int:
    """The largest batch (at most ``batch_size``) whose estimated peak fits in ``free`` bytes for every model."""
    batch = batch_size
    for label, model in models:
        need = image_bytes(model, fields, element, prefetch)
        if need is None:
            continue
        fits = (free - FIXED_BYTES) // need
        if fits < 1:
            raise UserError(f"{label} at {name} needs about {(need + FIXED_BYTES) / 2**30:.1f} GiB for one image but "
                            f"{free / 2**30:.1f} GiB are free: evaluate at smaller sizes, free memory, or use a "
                            "device with more")
        batch = min(batch, fits)
    return batch
