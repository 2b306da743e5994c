"""Diagnostics of a RoPE ViT across sizes: frequency coverage, mixed directions, attention entropy, position reliance.

A channel pair that completes less than one turn across the training grid never saw the phases that a larger grid
produces (RoPE-ViT, Heo et al., ECCV 2024; YaRN, Peng et al. 2023); docs/evaluation.md says what each measure tells."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vit_rope.checks import check_multiple, check_output_dir, patch_size
from vit_rope.data.folders import ImageFolderDataset, Sample
from vit_rope.data.splits import find_split
from vit_rope.encodings.base import BlockInput, image_coords
from vit_rope.encodings.policies import POLICIES
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.errors import UserError
from vit_rope.eval import token_budget as naflex
from vit_rope.eval.harness import eval_transform, subset
from vit_rope.eval.loading import EvalModel, add_model_options, check_model_options, load_model_option, set_policy
from vit_rope.eval.report import figure
from vit_rope.layers.lattice import naflex_grid
from vit_rope.models.embedding import naflex_patch
from vit_rope.models.vit import RoPEVisionTransformer


def frequency_coverage(model: RoPEVisionTransformer, target_grid: tuple[int, int]) -> list[dict[str, Any]]:
    """Per layer: each pair's turns ``[heads][pairs]`` across the training grid and ``target_grid``, and ``unseen``:
    pairs under one turn in training whose range grows over one step (``interpolate`` stretches less: a resampling)."""
    coverage = [(layer, *_coverage(rope, target_grid)) for layer, rope in enumerate(_rotations(model))]
    return [dict(layer=layer, train_turns=train.tolist(), target_turns=target.tolist(), unseen=int(unseen.sum()),
                 pairs=train.numel()) for layer, train, target, unseen in coverage]


def budget_coverage(model: RoPEVisionTransformer, grids: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Per layer: the channel pairs ``[H, D/2]`` that meet unseen phases on any of ``grids`` (a budget's (h, w))."""
    unseen = [torch.stack([_coverage(rope, grid)[2] for grid in grids]).any(0) for rope in _rotations(model)]
    return [dict(layer=layer, unseen=int(pairs.sum()), pairs=pairs.numel()) for layer, pairs in enumerate(unseen)]


def _rotations(model: RoPEVisionTransformer) -> list[RoPE2D]:
    """The model's RoPE modules; none for the attention biases (LookHere, 2D-ALiBi): 0 of 0 channels covered."""
    return [module for module in model.pos_encoding.modules() if isinstance(module, RoPE2D)]


def _coverage(rope: RoPE2D, grid: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """Turns ``[H, D/2]`` across the training grid and ``grid`` under the policy, and which are unseen there."""
    freqs, _ = rope.frequencies(torch.tensor([grid]))
    freqs = freqs.reshape(rope.freqs.shape)  # one grid: [1, 2, H, D/2] -> [2, H, D/2]
    train = _turns(rope, rope.pair_frequencies().detach(), rope.train_grid)  # [H, D/2]
    step = train / max(max(rope.train_grid) - 1, 1)  # turns over one training step (the longer axis)
    target = _turns(rope, freqs.detach(), grid)
    return train, target, (train < 1) & (target > train + step + 1e-6)


def _turns(rope: RoPE2D, freqs: Tensor, grid: tuple[int, int]) -> Tensor:
    positions = rope.place(*image_coords(*grid, freqs.device))  # [N, 2] as the policy places them
    extent = positions.amax(0) - positions.amin(0)  # (x, y)
    return (freqs[0].abs() * extent[0] + freqs[1].abs() * extent[1]) / (2 * math.pi)  # [H, D/2]


@torch.no_grad()
def attention_entropy(model: RoPEVisionTransformer, images: Tensor | dict[str, Tensor]) -> list[float]:
    """Mean entropy (nats) of each block's attention over images, heads and (real) queries."""
    entropies: list[float] = []

    def hook(attn: nn.Module, args: tuple, kwargs: dict) -> None:
        encoding = kwargs.get("encoding")  # as the model: RoPE tables, or the kind's q / k transform and bias
        q, k, _ = attn.project(args[0], encoding)
        scores = (q * attn.scale) @ k.transpose(-2, -1)  # [B, nh, N, N]
        if isinstance(encoding, BlockInput) and encoding.bias is not None:  # LookHere, 2D-ALiBi: the block's penalty
            scores = scores + encoding.bias
        real = kwargs.get("attn_mask")  # a NaFlex batch's [B, 1, 1, N], False for padding; None for images
        p = torch.softmax(scores if real is None else scores.masked_fill(~real, float("-inf")), dim=-1)
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)  # [B, nh, N]
        queries = torch.ones_like(entropy[:, :1]) if real is None else real[:, :, 0].to(entropy.dtype)  # [B, 1, N]
        entropies.append(float((entropy * queries).sum() / (queries.sum() * entropy.shape[1])))

    handles = [blk.attn.register_forward_pre_hook(hook, with_kwargs=True) for blk in model.blocks]
    try:
        model.eval()(images)
    finally:
        for handle in handles:
            handle.remove()
    return entropies


def plot_mixed_directions(model: RoPEVisionTransformer, path: Path) -> bool:
    """Scatter of the (wx, wy) of every pair, a panel per layer; False (no plot) without frequencies."""
    ropes = _rotations(model)
    if not ropes:
        return False
    cols = min(6, len(ropes))
    rows = math.ceil(len(ropes) / cols)
    fig = figure((2.6 * cols, 2.6 * rows), "tight")
    if fig is None:
        return False
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(ropes):]:
        ax.axis("off")
    for layer, (rope, ax) in enumerate(zip(ropes, axes.flat, strict=False)):
        wx, wy = rope.pair_frequencies().detach().float()
        for head in range(wx.shape[0]):
            ax.scatter(wx[head], wy[head], s=6, label=f"head {head}")
        ax.set_title(f"layer {layer}" if len(ropes) > 1 else f"{model.encoding_kind} (all layers)", fontsize=9)
        ax.set_aspect("equal")
        ax.axhline(0, lw=0.3, c="k")
        ax.axvline(0, lw=0.3, c="k")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"RoPE frequencies (wx, wy) per pair ({model.encoding_kind})")
    fig.savefig(path, dpi=120)
    return True


@contextmanager
def without_positions(model: RoPEVisionTransformer) -> Iterator[RoPEVisionTransformer]:
    """Run ``model`` without its position encoding: a pre-hook on each block drops it, the APE's patch rows become their
    mean (what they share says nothing of where a patch is); other models are refused. A ViT without one still learns
    to classify (CPVT, Chu et al., ICLR 2023), so a model that barely uses its encoding gives the same logits under any
    policy: policies that agree need not both hold (docs/evaluation.md)."""
    if not isinstance(model, RoPEVisionTransformer):
        raise TypeError(f"without_positions takes a vit_rope model (RoPEVisionTransformer); got "
                        f"{type(model).__name__}, whose position encoding it cannot find: pass the vit_rope model "
                        "itself (a compiled or DDP-wrapped one as ._orig_mod or .module)")
    handles = [blk.register_forward_pre_hook(lambda _, args, kwargs: (args[:1], {**kwargs, "encoding": None}),
                                             with_kwargs=True) for blk in model.blocks]  # the tokens only
    pos_embed = getattr(model, "pos_embed", None)
    saved = None if pos_embed is None else pos_embed.detach().clone()
    try:
        if pos_embed is not None:
            with torch.no_grad():
                patches = pos_embed[:, 0 if model.no_embed_class else model.num_prefix_tokens:]  # [1, N, C]
                patches.copy_(patches.mean(1, keepdim=True).expand_as(patches))
        yield model
    finally:
        for handle in handles:
            handle.remove()
        if saved is not None:
            with torch.no_grad():
                pos_embed.copy_(saved)


@torch.no_grad()
def position_reliance(model: RoPEVisionTransformer, images: Tensor | dict[str, Tensor]) -> dict[str, float]:
    """The mean relative change of ``model``'s outputs without its position encoding, and the top-1 kept."""
    training = model.training
    try:
        outputs = model.eval()(images)  # [B, num_classes] or [B, C]
        with without_positions(model):
            blind = model(images)
    finally:
        model.train(training)
    change = (blind - outputs).norm(dim=-1) / outputs.norm(dim=-1).clamp_min(1e-12)  # [B]
    report = {"output_change": float(change.mean())}
    if model.num_classes > 0:
        report["predictions_kept"] = float((blind.argmax(-1) == outputs.argmax(-1)).float().mean())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vit-rope-diagnose", description=__doc__.splitlines()[0])
    add_model_options(parser, "diagnose", "a vit_rope timm model name (with --pretrained-file for weights)")
    parser.add_argument("--sizes", "--img-sizes", nargs="+", type=int,
                        help="square image sizes to inspect (default: 1, 1.43, 1.71 and 2.29 times the training size, "
                        "RoPE-ViT's 224-512 px of a 224 px model, in whole patches; none with --seq-lens)")
    parser.add_argument("--seq-lens", nargs="+", type=naflex.seq_len_arg, default=[], metavar="L",
                        help="token budgets to inspect: the --data-dir images (noise has no aspect ratio) resized "
                        "keeping their aspect ratio to at most L patches; unseen phases counted over their grids")
    parser.add_argument("--data-dir", help="ImageFolder root (or shards, a dataset: --dataset) whose val split feeds "
                        "the entropy (else noise)")
    parser.add_argument("--dataset", metavar="KIND/NAME", help="what --data-dir holds, as train.py's dataset "
                        "(default: the checkpoint's, else an image folder)")
    parser.add_argument("--split", "--val-split", dest="val_split", metavar="NAME",
                        help="split of --data-dir to take images from (default: the checkpoint's val_split, else val)")
    parser.add_argument("--policy", choices=POLICIES, help="resolution policy to diagnose under (default: the model's)")
    parser.add_argument("--num-images", "--limit", type=int, default=8,
                        help="val images to inspect (default 8; --limit as in vit_rope.evaluate)")
    parser.add_argument("--output", default="output/diagnose")
    args = parser.parse_args(argv)
    check_model_options(parser, args)
    args.sizes = args.sizes or ([] if args.seq_lens else None)  # None: from the training size, once it is known
    try:
        entry, samples = _load(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model, patch = entry.model, patch_size(entry.model)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    kind, policy = model.encoding_kind, model.resolution_policy.name
    report: dict[str, Any] = {"model": entry.label, "kind": kind, "policy": policy, "sizes": {}, "seq_lens": {}}
    encoding = f"RoPE {kind}" if _rotations(model) else kind
    print(f"{entry.label}: {encoding}, policy {policy}, training grid {model.pos_encoding.train_grid}")
    print(f"{'size':>10s} {'unseen-phase channels':>22s} {'without positions':>36s} "
          f"{'attention entropy per layer (nats)'}")
    for size in args.sizes:
        images = (torch.randn(args.num_images, 3, size, size, generator=torch.Generator().manual_seed(0))
                  if samples is None  # noise without data, else the val images under the evaluation protocol
                  else torch.stack([item[0] for item in _items(samples, args.num_images, eval_transform(size, 1.0))]))
        _record(report["sizes"], size, f"{size} px", frequency_coverage(model, (size // patch, size // patch)),
                attention_entropy(model, images), position_reliance(model, images))
    for seq_len in args.seq_lens:  # one NaFlex batch, each image at its own aspect ratio
        items = _items(samples, args.num_images, naflex.budget_transform(seq_len, naflex_patch(model)))
        batch = naflex.BudgetCollator(seq_len)(items)[0]
        grids = sorted({(h, w) for h, w in naflex_grid(batch["patch_coord"], batch["patch_valid"]).tolist()})
        _record(report["seq_lens"], seq_len, f"{seq_len} tokens", budget_coverage(model, grids),
                attention_entropy(model, batch), position_reliance(model, batch), grids=grids)
    (out / "diagnostics.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'diagnostics.json'}")
    if plot_mixed_directions(model, out / "rope_directions.png"):
        print(f"wrote {out / 'rope_directions.png'}")
    return 0


def _record(table: dict[int, Any], key: int, label: str, coverage: list[dict[str, Any]], entropy: list[float],
            reliance: dict[str, float], **extra: Any) -> None:
    unseen, pairs = sum(r["unseen"] for r in coverage), sum(r["pairs"] for r in coverage)
    table[key] = dict(coverage=coverage, entropy=entropy, unseen=unseen, pairs=pairs, without_positions=reliance,
                      **extra)
    blind = f"outputs move {reliance['output_change']:.1%}"
    if "predictions_kept" in reliance:
        blind += f", top-1 {reliance['predictions_kept']:.0%} kept"
    print(f"{label:>10s} {f'{unseen}/{pairs}':>22s} {blind:>36s} {' '.join(f'{e:.2f}' for e in entropy)}")


def _load(args: argparse.Namespace) -> tuple[EvalModel, list[Sample] | None]:
    """The model and the images that feed the entropy (None: noise), every argument checked first."""
    if args.num_images <= 0:  # a size is checked against the model's patch (check_multiple)
        raise UserError(f"--num-images {args.num_images} must be > 0 (e.g. --num-images 8)")
    naflex.check_seq_lens(args.seq_lens)
    if args.seq_lens and args.data_dir is None:
        raise UserError("--seq-lens resizes images keeping their aspect ratio, and the noise fed without --data-dir "
                        "has none: pass --data-dir DIR (an ImageFolder root), or inspect square --sizes")
    check_output_dir(args.output, "--output")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UserError(f"--data-dir {args.data_dir} does not exist; pass an ImageFolder root (its val split holds "
                        "one folder per class), or leave it out to feed noise")
    entry = load_model_option(args, "diagnose", 0, {**dict(args.model_kwargs), "num_classes": 0})  # no classifier
    if not isinstance(entry.model, RoPEVisionTransformer):
        raise UserError(f"{entry.label} is a {type(entry.model).__name__}, not a vit_rope model: nothing to "
                        "diagnose; pass a vit_rope_* model or a checkpoint of one")
    if args.sizes is None:  # RoPE-ViT's 224, 320, 384 and 512 px of a 224 px model, in whole patches
        patch = patch_size(entry.model)
        args.sizes = list(dict.fromkeys(patch * max(1, round(entry.train_size * ratio / 224 / patch))
                                        for ratio in (224, 320, 384, 512)))
    check_multiple("--sizes entry", args.sizes, entry.model, entry.label)
    set_policy(entry, args.policy)
    if args.data_dir is None:
        return entry, None
    split = args.val_split or entry.val_split or "val"
    return entry, find_split(Path(args.data_dir), args.dataset or entry.dataset, split, split_key="--split",
                             input_key=entry.input_key, target_key=entry.target_key)[0]


def _items(samples: list[Sample], count: int, transform: Any) -> list[tuple[Any, int, int]]:
    dataset = ImageFolderDataset([samples[i] for i in subset(len(samples), count)], transform)
    return [dataset[i] for i in range(len(dataset))]
