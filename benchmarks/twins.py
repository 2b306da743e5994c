"""Images/s and activation memory of our twins of timm's Eva backbones against timm's own models, in one run.

    python benchmarks/twins.py --json results/performance/twins_cpu.json   # every family at its native input, CPU
    python benchmarks/twins.py --families eva02 dinov3 --rounds 3           # a subset

For the smallest size of each family (``FAMILIES``) at its native input, timm's model (``timm.create_model(name,
pretrained=False)``: random weights, which speed and memory do not depend on) and our twin made from it by
``vit_rope.from_timm`` (the same weights) run inference (eval, ``torch.inference_mode``) and a training step (forward,
cross-entropy, backward; the optimizer step is the same for both and left out), both eager and fp32. Rounds, medians
and per-round paired ratios are ``benchmarks/throughput.py``'s (its functions, reused): per family and mode, each
round runs the two models in a new random order. Memory is a training step's activation memory (the distinct tensors
autograd saves, ``throughput.activation_bytes``). Targets (printed PASS / MISS and saved, never an error): twin / timm
images/s at least ``SPEED_TARGET`` in both modes, activation memory at most ``MEMORY_TARGET``.

Attention is like for like: timm's ``Eva`` attention and ours both call ``F.scaled_dot_product_attention`` on CPU
(timm's ``use_fused_attn()``); ours rotates q and k in place inside the qkv projection (the fused rotation) in every
block without q/k norm or grouped kv heads; Sapiens2's q/k norms come first, so there ours rotates their outputs in
place in inference and takes the reference rotation in training. Each model's attention path is counted per block,
printed and saved (``attention_paths``). One more difference, Sapiens2's only: in inference the twin's RMSNorm
(``vit_rope.layers.rms_norm``) takes three passes where timm's takes four or five, so its inference ratio holds both.

Default batches are small (``FAMILIES``): these are 257- to 3,081-token inputs on a CPU. Batch 2 gives each timed step
two images (one would let a single image's cache effects decide a ratio) at 0.2-4 s per training step on 2 cores
(estimated from their FLOPs); Sapiens2 (ViT-B at 1024x768, 3,081 tokens, about 1 TFLOP per image forward) takes
batch 1, some 35 s per training step there, and is most of the run's 15 minutes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import timm
import torch
from timm.models import get_pretrained_cfg
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import vit_rope  # noqa: E402
from benchmarks import throughput  # noqa: E402
from vit_rope.eval import report  # noqa: E402

MODES = ("infer", "train")
FAMILIES = {  # family -> (timm name of its smallest size, default batch size)
    "eva02": ("eva02_tiny_patch14_224", 2),
    "pe_core": ("vit_pe_core_tiny_patch16_384", 2),
    "pe_spatial": ("vit_pe_spatial_tiny_patch16_512", 2),
    "sbb": ("vit_medium_patch16_rope_reg1_gap_256", 2),
    "sapiens2": ("vit_base_patch16_sapiens2", 1),
    "lingbot": ("vit_small_patch16_lingbot", 2),
    "dinov3": ("vit_small_patch16_dinov3", 2),
    "qwen3": ("qwen3_vit_88m_merge", 2),  # Qwen3-VL's smallest tower with its merger: what the VLM runs
    "pixtral": ("vit_rope_pixtral_vit_12b", 1),  # against transformers' PixtralVisionModel (Pixtral-12B's config)
    "qwen2_5_vl": ("Qwen2_5_VisionTransformerPretrainedModel", 2),  # transformers' (HF_FAMILIES)
    "deepseek": ("deepseek_vit_412m_align", 2),  # DeepSeek-V4's tower with its aligner (what the VLM reads), a head
    "gemma4": ("gemma4_vit_167m", 1),  # E2B/E4B's tower (clamped linears); the pooler is cheap, the loss needs [B, C]
}
# families whose source is transformers' model, built here from its config: (config, input side); Qwen2.5-VL's tower
# (3B / 7B / 72B share it; the 7B's merger) at 224 px: 16x16 patches, 2x2 windows of 8x8, blocks 7, 15, 23, 31 full
HF_FAMILIES = {"qwen2_5_vl": (dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                   out_hidden_size=3584, window_size=112, fullatt_block_indexes=[7, 15, 23, 31]), 224)}
# Sapiens2 gives timm one kv-head count per block; a cut depth needs a shorter list: full attention, which all 12
# blocks of its ViT-B have (grouped kv heads skip the first and last 8 blocks)
CUT_DEPTH_ARGS = {"sapiens2": {"num_kv_heads": 12}}
SPEED_TARGET, MEMORY_TARGET = 1.0, 1.0
# the patch size of the models whose name does not say it
UNNAMED_PATCH = {"qwen3_vit_88m_merge": 16, "deepseek_vit_412m_align": 14, "vit_rope_pixtral_vit_12b": 16,
                 "gemma4_vit_167m": 16}


class PooledPixtral(nn.Module):
    """transformers' ``PixtralVisionModel`` (the "timm" run of family pixtral) with the twin's head: the mean of its
    tokens ``[B, C]``. One image per step: Pixtral packs a batch into one sequence with a block-diagonal mask."""

    def __init__(self, depth: int | None) -> None:
        super().__init__()
        import transformers  # the test extra: only this family needs it

        config = transformers.PixtralVisionConfig(hidden_act="silu", **({"num_hidden_layers": depth} if depth else {}))
        self.model = transformers.PixtralVisionModel(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).last_hidden_state.mean(1)


def input_size(name: str, scale: float) -> tuple[int, int]:
    """The native (height, width) of timm's pretrained cfg, times ``scale`` rounded to whole patches (smoke runs)."""
    match = re.search(r"patch(\d+)", name)
    patch = int(match[1]) if match else UNNAMED_PATCH[name]
    return tuple(max(1, round(side * scale / patch)) * patch for side in get_pretrained_cfg(name).input_size[1:])


def attention_paths(model: nn.Module) -> dict[str, int]:
    """Blocks, blocks whose attention runs SDPA, and (twins) blocks that rotate q and k with the fused in-place
    rotation, the condition ``RoPEAttention.project`` takes it under in eager mode, and blocks with q/k norms, which
    rotate the norms' outputs in place in inference and take the reference rotation in training."""
    if isinstance(model, PooledPixtral):
        layers = len(model.model.transformer.layers)
        return {"blocks": layers, "sdpa_blocks": layers * (model.model.config._attn_implementation == "sdpa")}
    model = getattr(model, "encoder", model)  # timm's Qwen3-VL, MergedTokens: under .encoder
    attns = [block.attn for block in model.blocks]
    paths = {"blocks": len(attns), "sdpa_blocks": sum(bool(attn.fused_attn) if hasattr(attn, "fused_attn") else
                                                      attn.config._attn_implementation == "sdpa" for attn in attns)}
    if isinstance(model, vit_rope.RoPEVisionTransformer):
        paths["fused_rotation_blocks"] = sum(attn.plain_qk and attn.num_kv_heads == attn.num_heads for attn in attns)
        paths["qk_norm_blocks"] = sum(not attn.plain_qk for attn in attns)
    return paths


class MergedTokens(nn.Module):
    """A VLM tower on an image batch, its merged tokens averaged per image ``[B, C]`` (what the training step's
    cross-entropy reads): transformers' after its processor's packing (each frame twice, patches in 2x2 block order,
    ``grid_thw``), the twin as it is."""

    def __init__(self, model: nn.Module, packed: bool) -> None:
        super().__init__()
        self.encoder, self.packed, self.default_cfg = model, packed, getattr(model, "default_cfg", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            return self.encoder(x).mean(1)
        (B, C, H, W), p, m, t = x.shape, self.encoder.patch_size, self.encoder.spatial_merge_size, 2
        h, w = H // p, W // p
        rows = x[:, None].expand(B, t, C, H, W).reshape(B, t, C, h // m, m, p, w // m, m, p)
        rows = rows.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(B * h * w, C * t * p * p)
        grid_thw = torch.tensor([[1, h, w]] * B, device=x.device)
        return self.encoder(rows, grid_thw=grid_thw).pooler_output.unflatten(0, (B, -1)).mean(1)


def hf_models(family: str, depth: int | None, scale: float, device: torch.device
              ) -> tuple[dict[str, nn.Module], tuple[int, int]]:
    """transformers' model of an ``HF_FAMILIES`` family (random weights, SDPA) and its twin, both on image batches;
    the input side times ``scale`` in whole 2x2 blocks of 14 px patches."""
    from transformers import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config, side = HF_FAMILIES[family]
    side = max(1, round(side * scale / 28)) * 28
    if depth:
        config = dict(config, depth=depth, fullatt_block_indexes=[i for i in config["fullatt_block_indexes"]
                                                                  if i < depth] or [depth - 1])
    source = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**config, attn_implementation="sdpa"))
    source = source.to(device)
    return {"timm": MergedTokens(source, True), "twin": MergedTokens(vit_rope.from_timm(source), False)}, (side, side)


def measure(args: argparse.Namespace, family: str) -> tuple[list[dict], list[dict]]:
    """One family: timm's model and its twin, interleaved per mode; the rows and the ratios against the targets."""
    name, default_batch = FAMILIES[family]
    batch_size = args.batch_size or default_batch
    device = torch.device(args.device)
    torch.manual_seed(0)
    depth = {"depth": args.depth, **CUT_DEPTH_ARGS.get(family, {})} if args.depth else {}
    if family == "pixtral":  # the source is transformers' model, any size
        size = input_size(name, args.scale)
        source = PooledPixtral(args.depth).to(device)
        models = {"timm": source, "twin": vit_rope.from_timm(source.model)}
    elif family in HF_FAMILIES:  # "timm" is the source's run: here transformers' model
        models, size = hf_models(family, args.depth, args.scale, device)
    else:
        size = input_size(name, args.scale)
        timm_model = timm.create_model(name, pretrained=False, img_size=size, **depth).to(device)
        models = {"timm": timm_model, "twin": vit_rope.from_timm(timm_model)}
    # like for like: both fp32 (from_timm keeps the timm model's dtype), both eager (neither is compiled)
    assert {param.dtype for model in models.values() for param in model.parameters()} == {torch.float32}
    paths = {run: attention_paths(model) for run, model in models.items()}
    print(f"# {family}: {name} -> {models['twin'].default_cfg['architecture']}, {size[0]}x{size[1]}, batch "
          f"{batch_size}, attention paths {paths}", flush=True)
    images = torch.randn(batch_size, 3, *size, device=device)
    rows, ratios = [], []
    for mode in MODES:
        steps = throughput.prepare(models, images, mode, amp=False, warmup=args.warmup)
        speeds = throughput.interleaved_speeds(steps, models, mode, batch_size, args.rounds, args.steps, device)
        for run, model in models.items():
            source = "transformers PixtralVisionModel" if family == "pixtral" else name
            row = {"family": family, "run": run,
                   "model": source if run == "timm" else model.default_cfg["architecture"],
                   "img_size": list(size), "batch_size": batch_size, "mode": mode,
                   "images_per_s": statistics.median(speeds[run]), "rounds": speeds[run], **paths[run]}
            rows.append(row | (throughput.memory(model, steps[run], device) if mode == "train" else {}))
        value = throughput.paired_ratio(speeds["twin"], speeds["timm"])
        ratios.append({"family": family, "mode": mode, "ratio": "images/s twin / timm", "value": value,
                       **throughput.against(value, SPEED_TARGET)})
    train = {row["run"]: row["activation_mib"] for row in rows if row["mode"] == "train"}
    value = train["twin"] / train["timm"]
    ratios.append({"family": family, "mode": "train", "ratio": "activation MiB twin / timm", "value": value,
                   **throughput.against(value, MEMORY_TARGET, at_most=True)})
    return rows, ratios


def print_tables(rows: list[dict], ratios: list[dict]) -> None:
    """Images/s and memory per model, then each ratio against its target."""
    print(report.table(
        ["family", "run", "model", "input", "batch", "mode", "images/s", "activation MiB",
         "SDPA / fused rotation / q/k norm"],
        [(r["family"], r["run"], r["model"], "x".join(map(str, r["img_size"])), r["batch_size"], r["mode"],
          f"{r['images_per_s']:.2f}", f"{r['activation_mib']:.0f}" if "activation_mib" in r else "",
          f"{r['sdpa_blocks']}/{r['blocks']}, {r.get('fused_rotation_blocks', '-')}/{r['blocks']}, "
          f"{r.get('qk_norm_blocks', '-')}/{r['blocks']}") for r in rows]))
    print(report.table(["family", "mode", "ratio", "value", "target", "result"],
                       [(r["family"], r["mode"], r["ratio"], f"{r['value']:.3f}", *throughput.verdict(r))
                        for r in ratios]), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--batch-size", type=int, help="every family's batch (default: FAMILIES', 2; Sapiens2 1)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per model and mode before the rounds")
    parser.add_argument("--depth", type=int, help="blocks of every model (default: each model's; fewer for smoke runs)")
    parser.add_argument("--scale", type=float, default=1.0, help="input sides times this, in whole patches (smoke)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the rows, ratios and machine to this file")
    args = parser.parse_args(argv)
    machine = throughput.setup_machine(args.threads)
    print(f"# {machine}", flush=True)
    rows, ratios = [], []
    for family in args.families:
        new_rows, new_ratios = measure(args, family)
        print_tables(new_rows, new_ratios)
        rows, ratios = rows + new_rows, ratios + new_ratios
        if args.json:  # after every family, so a run stopped part-way keeps the families it finished
            result = {"machine": machine, "args": vars(args), "complete": family == args.families[-1],
                      "targets": {"speed": SPEED_TARGET, "memory": MEMORY_TARGET}, "rows": rows, "ratios": ratios}
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if len(args.families) > 1:
        print("\n# all families")
        print_tables(rows, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
