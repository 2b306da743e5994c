"""Speed and activation memory of our RoPE ViT-S on timm's NaFlex batches against timm's NaFlexVit, in one run.

    python benchmarks/naflex.py --json results/performance/naflex_cpu_vit_s.json   # L = 256 and 576, batch 8, CPU
    python benchmarks/naflex.py --device cuda --seq-lens 256 576 1024 --json out.json

The contenders (``CONTENDERS``) are ViT-S/16 (384 wide, 12 blocks, 6 heads, class token, LayerScale, 1000 classes): ours
with mixed and with axial RoPE, timm's NaFlexVit with the same two RoPE kinds (timm's RoPE-ViT ports built with
``use_naflex=True``) and, like ours, padding hidden from the keys only, timm's RoPE-Mixed NaFlexVit as timm ships it
(its default padding mask, ``[B, 1, N, N]``), and timm's NaFlexVit with its learned position embedding instead of RoPE,
the limit any RoPE approaches. What still differs between them is printed and saved (``DIFFERENCES``). For each sequence
length L the input is one batch that timm's own ``Patchify`` and ``NaFlexCollator`` make from random images of mixed
aspect ratios (``ASPECTS``, each image the largest grid of its ratio that fits L), so every contender gets the very dict
timm's NaFlex loader yields, padding included. Our models also run a square image batch ``[B, 3, H, W]`` of about the
same number of valid tokens (``SQUARE``): what packing and padding cost against the plain ViT path.

Timed per contender: inference (eval, ``torch.inference_mode``) of one batch and one training step (forward,
cross-entropy, backward, AdamW step). Each round runs every (contender, mode) cell once in a new random order, so all
share the machine's drifts; a time is the median over rounds, and a ratio is the median of per-round ratios of valid
tokens per second (paired within a round; for two contenders on the same batch it is the inverse ratio of their times).
Memory is the activation memory of a training forward: the bytes of the distinct tensors autograd saves for backward
(``benchmarks.throughput.activation_bytes``, saved-tensor hooks), the memory a training step holds beyond weights,
gradients and optimizer state. It is exact and the same in every run, where a CPU process's peak (RSS) also counts
freed memory the allocator keeps (see docs/performance.md, dense features) and the profiler's memory events count
every short-lived temporary; on CUDA the allocator's peak over a step is saved too. Targets (printed PASS/MISS, never
an error): ``SPEED_TARGETS`` and ``MEMORY_TARGETS``. Two ratios without a target put each timm RoPE model against its
twin without RoPE: what a RoPE of no cost would read against it, the bound of ours / timm's RoPE where the rest of the
two models costs the same.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import Patchify
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# after the path set-up, as the script runs from anywhere:
from benchmarks.machine import describe_machine  # noqa: E402
from benchmarks.throughput import against, interleaved_seconds, memory, verdict  # noqa: E402
from vit_rope.eval import report  # noqa: E402

PATCH, NUM_CLASSES, MODES = 16, 1000, ("infer", "train")
# timm's masking as ours: padding hidden from the keys only, [B, 1, 1, N] (timm's default masks a [B, 1, N, N] square)
TIMM_NAFLEX = {"use_naflex": True, "use_key_only_attn_mask": True}
CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {  # run name -> (timm model name, keyword arguments)
    "ours_mixed": ("vit_rope_small_patch16_mixed_224", {}),
    "ours_axial": ("vit_rope_small_patch16_axial_224", {}),
    "timm_mixed": ("vit_small_patch16_rope_mixed_224", TIMM_NAFLEX),
    # timm's RoPE-Mixed NaFlexViT as timm ships it: its default [B, 1, N, N] padding mask
    "timm_mixed_default": ("vit_small_patch16_rope_mixed_224", {"use_naflex": True}),
    "timm_axial": ("vit_small_patch16_rope_224", TIMM_NAFLEX),
    "timm_learned": ("vit_small_patch16_rope_224", {**TIMM_NAFLEX, "use_rot_pos_emb": False, "use_abs_pos_emb": True}),
}
SQUARE = {"ours_mixed_square": "ours_mixed", "ours_axial_square": "ours_axial"}  # square-batch run -> its model
# (ratio, run, reference run, target): run's valid tokens/s over the reference's, at least the target; target None:
# printed for reference only
SPEED_TARGETS = [
    ("ours_mixed / timm_mixed", "ours_mixed", "timm_mixed", 1.10),
    ("ours_mixed / timm_mixed, timm's default mask", "ours_mixed", "timm_mixed_default", 1.10),
    ("ours_axial / timm_axial", "ours_axial", "timm_axial", 1.00),
    ("ours_mixed / timm_learned", "ours_mixed", "timm_learned", 0.95),
    ("ours_axial / timm_learned", "ours_axial", "timm_learned", 0.95),
    ("ours_mixed padded / square", "ours_mixed", "ours_mixed_square", 0.90),
    ("ours_axial padded / square", "ours_axial", "ours_axial_square", 0.90),
    # what a RoPE of no cost would read against timm's (timm's model without its RoPE): ours / timm's exceeds it only
    # where ours is faster than timm's in what is not RoPE
    ("timm_learned / timm_mixed (no RoPE cost)", "timm_learned", "timm_mixed", None),
    ("timm_learned / timm_axial (no RoPE cost)", "timm_learned", "timm_axial", None),
]
MEMORY_TARGETS = [  # activation memory of run over the reference's, at most the target
    ("ours_mixed / timm_mixed", "ours_mixed", "timm_mixed", 1.0),
    ("ours_axial / timm_axial", "ours_axial", "timm_axial", 1.0),
]
ASPECTS = (1, 1 / 4, 4 / 7, 5 / 3, 3 / 4, 2, 1 / 2, 4 / 3)  # height / width of the batch's images, in turn
DIFFERENCES = [
    "same: depth, width, heads, MLP ratio 4, qkv bias, LayerScale 1e-5, class token, token pooling, final LayerNorm "
    "without fc_norm, 1000 classes; RoPE on interleaved channel pairs over (x, y), theta 10 (mixed) and 100 (axial)",
    "rotation: ours rotate q and k in place inside the qkv projection's autograd node, with per-sample tables; timm's "
    "AttentionRope rotates them out of place (apply_rot_embed_cat) and concatenates the class token back",
    "mixed tables: ours are built block by block as each block runs, once for the batch's bounding grid (from one "
    "table per axis) and gathered per token; timm's NaFlexRopeIterator builds every block's table per grid size up "
    "front and copies them into a padded [B, heads, N, head_dim] buffer per block",
    "padding mask: both hide padding from the keys only, [B, 1, 1, N]: ours boolean, timm's additive float "
    "(use_key_only_attn_mask=True; timm's default is a [B, 1, N, N] mask)",
    "patch embedding: ours is the Conv2d's weight read as a linear layer over the flat patches, timm's a Linear: the "
    "same product",
    "timm_learned: no RoPE, a learned 14x14 position table resampled (bicubic, antialiased) to each grid and added",
    "weights: each model's own random initialisation (speed and memory do not depend on the values)",
]


def fit_grid(seq_len: int, aspect: float) -> tuple[int, int]:
    """The largest (rows, columns) grid near ``aspect`` (rows / columns) with at most ``seq_len`` patches, as timm's
    NaFlex loader fits each image to the sequence length."""
    rows = max(1, math.isqrt(int(seq_len * aspect)))
    return rows, max(1, seq_len // rows)


def naflex_batch(seq_len: int, batch_size: int) -> tuple[dict[str, Any], Tensor, list[tuple[int, int]]]:
    """A batch of random images of mixed aspect ratios, patchified and padded to ``seq_len`` by timm's own transform
    and collator (not a copy of them), with random targets, and the images' grids."""
    grids = [fit_grid(seq_len, ASPECTS[index % len(ASPECTS)]) for index in range(batch_size)]
    patchify = Patchify(PATCH)
    samples = [(patchify(torch.randn(3, rows * PATCH, cols * PATCH)), random.randrange(NUM_CLASSES))
               for rows, cols in grids]
    batch, targets = NaFlexCollator(max_seq_len=seq_len)(samples)
    return batch, targets, grids


def steps(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any,
          targets: Tensor) -> tuple[Callable[[], Tensor], dict[str, Callable[[], None]]]:
    """The training loss (for the memory measure) and the two timed calls: inference and one training step."""
    def loss() -> Tensor:
        model.train()
        return F.cross_entropy(model(inputs), targets)

    def infer() -> None:
        model.eval()
        with torch.inference_mode():
            model(inputs)

    def train() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return loss, {"infer": infer, "train": train}


def measure(args: argparse.Namespace, models: dict[str, tuple[nn.Module, torch.optim.Optimizer]],
            seq_len: int) -> tuple[list[dict], list[dict]]:
    """All runs at one sequence length, interleaved over ``args.rounds`` rounds: the rows and the ratios."""
    device = torch.device(args.device)
    batch, targets, grids = naflex_batch(seq_len, args.batch_size)
    valid = int(batch["patch_valid"].sum())
    side = round(math.sqrt(valid / args.batch_size))  # square grid nearest the mean valid tokens per image
    batch = {key: value.to(device) if isinstance(value, Tensor) else value for key, value in batch.items()}
    targets, square = targets.to(device), torch.randn(args.batch_size, 3, side * PATCH, side * PATCH, device=device)
    inputs = {run: batch for run in CONTENDERS} | {run: square for run in SQUARE}
    tokens = {run: valid for run in CONTENDERS} | {run: args.batch_size * side * side for run in SQUARE}
    owner = {run: run for run in CONTENDERS} | SQUARE
    print(f"# L={seq_len}: grids {grids}, {valid} valid tokens of {args.batch_size * seq_len}; square batch "
          f"{args.batch_size}x{side}x{side} patches, {tokens['ours_mixed_square']} tokens", flush=True)

    with torch.inference_mode():  # equal work: one batch object, accepted by every model, logits of one shape
        shapes = {run: tuple(models[owner[run]][0].eval()(inputs[run]).shape) for run in owner}
    assert set(shapes.values()) == {(args.batch_size, NUM_CLASSES)}, shapes

    losses, calls = {}, {}
    for run in owner:
        losses[run], modes = steps(*models[owner[run]], inputs[run], targets)
        calls |= {(run, mode): call for mode, call in modes.items()}
    for call in calls.values():
        for _ in range(args.warmup):
            call()
    seconds = interleaved_seconds(calls, args.rounds, device)

    rows = []
    for (run, mode), times in seconds.items():
        row = {"seq_len": seq_len, "run": run, "model": CONTENDERS[owner[run]][0], "mode": mode,
               "input": "square" if run in SQUARE else "naflex", "valid_tokens": tokens[run],
               "seconds": statistics.median(times), "tokens_per_s": statistics.median(tokens[run] / t for t in times),
               "rounds": times}
        if mode == "train":
            row |= memory(models[owner[run]][0], losses[run], device)
        rows.append(row)
    ratios = []
    for mode in MODES:
        for name, run, ref, target in SPEED_TARGETS:
            per_round = [(tokens[run] / a) / (tokens[ref] / b)
                         for a, b in zip(seconds[run, mode], seconds[ref, mode], strict=True)]
            value = statistics.median(per_round)
            judged = {"target": None, "sense": None, "pass": None} if target is None else against(value, target)
            ratios.append({"seq_len": seq_len, "mode": mode, "ratio": name, "value": value, **judged})
    activation = {row["run"]: row["activation_mib"] for row in rows if row["mode"] == "train"}
    for name, run, ref, target in MEMORY_TARGETS:
        value = activation[run] / activation[ref]
        ratios.append({"seq_len": seq_len, "mode": "memory", "ratio": name, "value": value,
                       **against(value, target, at_most=True)})
    return rows, ratios


def build(args: argparse.Namespace) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
    """Every contender with its AdamW; ``--depth`` shrinks all of them alike (smoke runs).

    lr 1e-5 keeps the weights near their initialisation over the run, so no model drifts into overflowing or
    denormal values that would change its speed."""
    models = {}
    for run, (name, kwargs) in CONTENDERS.items():
        torch.manual_seed(0)
        depth = {"depth": args.depth} if args.depth else {}
        model = timm.create_model(name, num_classes=NUM_CLASSES, **kwargs, **depth).to(args.device)
        models[run] = model, torch.optim.AdamW(model.parameters(), lr=1e-5)
    return models


def print_tables(rows: list[dict], ratios: list[dict]) -> None:
    """Times, tokens/s and memory per run, then each ratio against its target."""
    cells = {(row["run"], row["mode"]): row for row in rows}
    runs = list(dict.fromkeys(row["run"] for row in rows))
    print(report.table(
        ["run", "input", "valid tokens", "infer ms", "train ms", "train valid tokens/s", "activation MiB", "peak MiB"],
        [(run, cells[run, "train"]["input"], cells[run, "train"]["valid_tokens"],
          f"{cells[run, 'infer']['seconds'] * 1e3:.1f}", f"{cells[run, 'train']['seconds'] * 1e3:.1f}",
          f"{cells[run, 'train']['tokens_per_s']:.0f}", f"{cells[run, 'train']['activation_mib']:.0f}",
          f"{cells[run, 'train']['peak_mib']:.0f}" if "peak_mib" in cells[run, "train"] else "") for run in runs]))
    print(report.table(["ratio", "L", "mode", "value", "target", "result"],
                       [(r["ratio"], r["seq_len"], r["mode"], f"{r['value']:.3f}",
                         *(cell or "-" for cell in verdict(r))) for r in ratios]), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 576], help="NaFlex sequence lengths L")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians over them)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per cell before the rounds")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--depth", type=int, help="blocks of every model (default: ViT-S's 12; fewer for smoke runs)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the rows, ratios, configurations and machine to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = {**describe_machine(), "threads": torch.get_num_threads(), "command": " ".join(sys.argv)}
    print(f"# {machine}\n# what differs between the contenders:\n" + "\n".join(f"#   {d}" for d in DIFFERENCES))
    models = build(args)
    print("# parameters: " + ", ".join(f"{run} {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M"
                                       for run, (model, _) in models.items()), flush=True)
    rows, ratios = [], []
    for seq_len in args.seq_lens:
        new_rows, new_ratios = measure(args, models, seq_len)
        print_tables(new_rows, new_ratios)
        rows, ratios = rows + new_rows, ratios + new_ratios
        if args.json:  # after every length, so a run stopped part-way keeps the lengths it finished
            Path(args.json).write_text(json.dumps(
                {"machine": machine, "args": vars(args), "complete": seq_len == args.seq_lens[-1],
                 "contenders": CONTENDERS, "differences": DIFFERENCES, "rows": rows, "ratios": ratios}, indent=2)
                + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
