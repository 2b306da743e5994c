"""Every model family on the device in bf16 against the same weights on the CPU in fp32: the logits must agree.

    python -m gpucheck.parity --device cuda --json parity.json     # from scripts/, or with it on PYTHONPATH
    python -m gpucheck.parity --device cpu --tiny                  # 1 block at small sizes, bf16 autocast on CPU

What a GPU run can get wrong that a CPU test does not see: a table built on the wrong device, a dtype rule of bf16
autocast (angles must stay fp32), the Triton kernels, and SDPA's fused kernels with masks and biases. The measure is
the relative error of the logits, ``||bf16 - fp32|| / ||fp32||`` over the batch, and the bound ``TOLERANCE`` (3%)
follows from bf16's 8-bit mantissa: each rounding is at most 2^-9 (0.2%) of its value, the errors of ~12 blocks'
sums add roughly as a random walk, and the CPU measure of the same quantity (bf16 autocast on the CPU, which rounds
the same way) stays under 1.5% for every family here (docs/gpu.md). A table in fp16, a lost class token or an
unrotated head moves the logits by 10-100%.

Weights are timm's random initialisation (no download, ``pretrained=False``) with every LayerScale set to 1: at its
init value (1e-5) the blocks, and so their position encoding, would barely reach the logits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

import vit_rope  # noqa: F401  (registers the vit_rope_* models)

TOLERANCE = 0.03
# name -> keyword arguments at full size (GPU) and at tiny size (CPU smoke run): one model per family
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{f"vit_rope_small_patch16_{kind}_224": ({}, {"depth": 1, "img_size": 64})
       for kind in ("axial", "mixed", "golden", "string", "lookhere", "alibi", "fire", "comrope_ap", "comrope_ld",
                    "liere", "pape", "pape_ri")},
    "vit_rope_small_patch16_dinov3": ({}, {"depth": 1, "img_size": 64}),
    "vit_rope_eva02_tiny_patch14_224": ({}, {"depth": 1, "img_size": 56}),  # EVA-02
    "vit_rope_pe_core_tiny_patch16_384": ({}, {"depth": 1, "img_size": 64}),  # Perception Encoder
    "vit_rope_medium_patch16_reg1_gap_256": ({}, {"depth": 1, "img_size": 64}),  # timm's SBB RoPE ViTs
    # Sapiens2: key / value heads per block, so one block takes one count (all 12, as the base's outer blocks have)
    "vit_rope_base_patch16_sapiens2": ({"img_size": (512, 384)},
                                       {"depth": 1, "num_kv_heads": 12, "img_size": (64, 48)}),
    "vit_rope_small_patch16_lingbot": ({}, {"depth": 1, "img_size": 64}),  # LingBot-Vision
    "vit_rope_qwen3_vit_88m_merge": ({}, {"depth": 1, "img_size": 64}),  # Qwen3-VL's ViT with its patch merger
    "swin_rope_mixed_tiny_patch4_window7_224": ({}, {"depths": (1, 1), "num_heads": (3, 6), "img_size": 112}),
}


def layer_scale_to_one(model: nn.Module) -> nn.Module:
    """Every LayerScale factor (timm's ``gamma``, Eva's ``gamma_1``/``gamma_2``) set to 1, so that each block's
    attention, and the position encoding inside it, shapes the logits."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("gamma", "gamma_1", "gamma_2"):
                param.fill_(1.0)
    return model


def compare(name: str, kwargs: dict[str, Any], device: torch.device, batch: int) -> dict[str, Any]:
    """One model's logits: bf16 autocast on ``device`` against fp32 on the CPU, same weights and images."""
    torch.manual_seed(0)
    model = layer_scale_to_one(timm.create_model(name, pretrained=False, **kwargs)).eval()
    height, width = model.patch_embed.img_size
    images = torch.randn(batch, 3, height, width)
    with torch.inference_mode():
        reference = model(images).float()
        model.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(images.to(device)).float().cpu()
    error = float((logits - reference).norm() / reference.norm())
    return {"model": name, "img_size": [height, width], "batch": batch, "rel_error": error, "target": TOLERANCE,
            "sense": "<=", "pass": error <= TOLERANCE, "logits_norm": float(reference.norm())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="1 block at small sizes (the CPU smoke run)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for name, (full, tiny) in MODELS.items():
        rows.append(compare(name, tiny if args.tiny else full, torch.device(args.device), args.batch_size))
        row = rows[-1]
        print(f"{'PASS' if row['pass'] else 'MISS'} {name}: relative error {row['rel_error']:.4f} "
              f"(bound {TOLERANCE})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"tolerance": TOLERANCE, "rows": rows}, indent=2) + "\n")
    return 0 if all(row["pass"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
