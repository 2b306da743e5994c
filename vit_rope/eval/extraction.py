"""One evaluation pass over a split at one setting, each batch decoded once for every run (model x policy); the probes'
train split, checked first; and how many images fit, said before a batch that fits at 224 px kills the process at 2048
px without a message (the estimate errs high: ViT-S's peaks at 896-2048 px, ``benchmarks/scaling.py``, are 0.5-0.9x)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from timm.layers import to_2tuple
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from vit_rope.data.folders import ImageFolderDataset, Sample
from vit_rope.data.splits import find_split, split_label
from vit_rope.errors import UserError
from vit_rope.eval import probes, windows
from vit_rope.eval import token_budget as naflex
from vit_rope.eval.loading import EvalModel
from vit_rope.models.embedding import naflex_patch


def subset(count: int, limit: int | None) -> list[int]:
    """``limit`` evenly spaced indices of ``count`` samples; samples are sorted by class, so every class appears."""
    if limit is None or limit >= count:
        return list(range(count))
    return [i * count // limit for i in range(limit)]


FIXED_BYTES = 256 * 2**20  # held once: an attention chunk's mask (encodings.bias.offset_attention), allocator slack


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
    if windows.has_windows(model):
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
    for stage, grid in zip(model.layers, windows.stage_grids(model, size), strict=True):
        block = stage.blocks[0]
        window = block.window_size
        tokens = math.prod(-(-side // w) * w for side, w in zip(grid, window, strict=True))
        scores = 0 if getattr(block.attn, "fused_attn", True) else 2 * block.attn.num_heads * tokens * math.prod(
            window) * element
        peak = max(peak, _block_bytes(tokens, block.mlp.fc1.in_features, block.mlp.fc1.out_features, element) + scores)
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


@dataclass
class Runs:
    """What every pass needs; ``runs`` as (model index, policy or None: as built)."""

    models: Sequence[EvalModel]
    runs: list[tuple[int, str | None]]
    norms: list[tuple[Tensor, Tensor]]
    device: str
    workers: int
    window: str | int  # the Swins' window rule (windows.window_arg): keep, scale or tokens per side


class Pass(NamedTuple):
    """What a pass gave: per run, the classifier's totals and the pooled features of the images read."""

    totals: Tensor  # [runs, 4]: loss sum, top-1 hits, top-5 hits, seconds of forward (images/s are timed on it)
    features: dict[int, Tensor]  # run -> [images, C]
    targets: Tensor  # [images]: each image's class index in its split
    counted: int  # images read
    skipped: int  # unreadable files left out
    windows: dict[int, list[tuple[int, int]]]  # Swin model index -> the windows it ran with


def forward_split(runs: Runs, samples: list[Sample], indices: list[int], setting: naflex.Setting, batch: int,
                  fed: Sequence[int], heads: dict[int, Tensor], pooled: set[int]) -> Pass:
    """The runs ``fed`` over ``samples[indices]``; each run's first batch runs once untimed (warm-up)."""
    device = runs.device
    used = {i: windows.set_windows(entry.model, setting.fields["img_size"], runs.window) for i, entry
            in enumerate(runs.models) if windows.has_windows(entry.model) and setting.fields.get("img_size")}
    loader = DataLoader(Subset(ImageFolderDataset(samples, setting.transform), indices), batch,
                        num_workers=runs.workers, pin_memory=device == "cuda", collate_fn=setting.collate)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None  # CUDA runs asynchronously: time whole calls
    totals = torch.zeros(len(runs.runs), 4, dtype=torch.float64)
    features: dict[int, list[Tensor]] = {row: [] for row in fed if row in pooled}
    targets_read: list[Tensor] = []
    skipped = counted = 0
    for step, (images, targets, bad) in enumerate(tqdm(loader, setting.name, leave=False,
                                                       disable=not sys.stderr.isatty())):  # [B, C, H, W] or NaFlex
        images = ({key: value.to(device, non_blocking=True) if isinstance(value, Tensor) else value  # and seq_len
                   for key, value in images.items()} if isinstance(images, dict)
                  else images.to(device, non_blocking=True))
        skipped += int((bad > 0).sum())  # slots refilled
        keep = (bad == 0).to(device)  # [B]; an unreadable image's slot holds the next readable one: not twice
        counted += int(keep.sum())
        targets = targets.to(device)
        targets_read.append(targets[keep])
        for row in fed:
            i, policy = runs.runs[row]
            model = runs.models[i].model
            inputs = naflex.normalise(images, *runs.norms[i])
            if policy is not None:
                model.set_resolution_policy(policy)
            with amp:
                if step == 0:
                    probes.model_outputs(model, inputs, row in heads, row in pooled)
                sync()
                start = time.perf_counter()
                logits, pooled_features = probes.model_outputs(model, inputs, row in heads, row in pooled)
                sync()
            totals[row, 3] += time.perf_counter() - start
            if row in pooled:
                features[row].append(pooled_features.float()[keep])  # [B, C]
            if row in heads:
                logits, labels = logits.float()[keep], heads[row][targets][keep]
                hits = logits.topk(min(5, logits.shape[1])).indices == labels[:, None]  # [B, k], rank order
                loss = nn.functional.cross_entropy(logits, labels, reduction="sum")
                totals[row, :3] += torch.tensor([loss.item(), hits[:, 0].sum().item(), hits.any(1).sum().item()],
                                                dtype=torch.float64)
    return Pass(totals, {row: torch.cat(parts) for row, parts in features.items()}, torch.cat(targets_read),
                counted, skipped, used)


class TrainSplit(NamedTuple):
    samples: list[Sample]
    indices: list[int]
    classes: list[str]
    val_classes: Tensor  # [val classes]: each val class's index among ``classes``


def train_split(data_dir: str | Path, dataset: str | None, options: probes.ProbeOptions, val_classes: list[str],
                input_key: str | None = None, target_key: str | None = None) -> TrainSplit:
    """The probes' train split, checked: it holds the val classes, each class has images, ``k`` fits the bank."""
    split = options.train_split
    samples, classes = find_split(Path(data_dir), dataset, split, split_key="train_split", input_key=input_key,
                                  target_key=target_key)  # a missing train folder gets no hint: the others are val
    where = split_label(data_dir, dataset, split)
    unknown = [name for name in val_classes if name not in classes]
    if unknown:
        raise UserError(f"the val classes {unknown[:5]} are not classes of the train split {where}, so no probe "
                        "could predict them; pass the --train-split of the same classes")
    indices = subset(len(samples), options.train_limit)
    given = {samples[i][1] for i in indices}
    limit = f" (--train-limit {options.train_limit})" if options.train_limit else ""
    empty = [name for index, name in enumerate(classes) if index not in given]
    if empty:  # no neighbour and no fitted weight could ever predict it
        raise UserError(f"class {empty[0]} has no train images in {where}{limit}: the probes could never predict it; "
                        "raise --train-limit, add its images, or drop the class from the val split too")
    if "knn" in options.probes and options.k > len(indices):
        raise UserError(f"--knn-k {options.k} is larger than the bank: {where} gives {len(indices)} images{limit}; "
                        f"use --knn-k {len(indices)} or fewer, or more train images")
    return TrainSplit(samples, indices, classes, torch.tensor([classes.index(name) for name in val_classes]))


def check_feature_memory(widths: dict[int, int], train: int, val: int, held: dict[int, int], per_setting: bool,
                         free: int) -> int:
    """Bytes the probes' features take at most (fp32); a ``UserError`` before anything runs if too many."""
    need = 4 * sum(width * (train * (held.get(row, 0) + per_setting) + val) for row, width in widths.items())
    need += 2 * 4 * probes.SIMILARITIES  # a chunk of kNN similarities, and what topk and the votes take beside it
    if need + FIXED_BYTES > free:
        raise UserError(f"the probes' features need about {need / 2**30:.1f} GiB ({train} train and {val} val images "
                        f"x {len(widths)} runs of model and policy, 4 bytes per feature) but {free / 2**30:.1f} GiB "
                        "are free: take fewer train images (--train-limit N), fewer models or policies, or free memory")
    return need


class TrainFeatures:
    """The probes' train features, each (setting, run) extracted once; a linear probe's are the kNN bank at its size."""

    def __init__(self, runs: Runs, train: TrainSplit, options: probes.ProbeOptions, fits: list[int]) -> None:
        self.runs, self.train, self.options, self.fits = runs, train, options, fits
        self.features: dict[tuple[str, int], Tensor] = {}  # (setting name, run) -> [train images, C]
        self.targets: dict[str, Tensor] = {}  # setting name -> [train images], class indices
        self.linear: dict[int, tuple[probes.LinearProbe, int]] = {}  # run -> its fitted probe, its images

    def extract(self, setting: naflex.Setting, batch: int, rows: Sequence[int]) -> None:
        missing = [row for row in rows if (setting.name, row) not in self.features]
        if not missing:
            return
        done = forward_split(self.runs, self.train.samples, self.train.indices, setting, batch, missing, {},
                             set(missing))
        if done.skipped:
            print(f"warning: {done.skipped} unreadable train image(s) left out of the probes at {setting.name}")
        self.targets[setting.name] = done.targets
        self.features.update({(setting.name, row): done.features[row] for row in missing})

    def fit(self, setting: naflex.Setting, batch: int, rows: Sequence[int], kept: Sequence[str]) -> None:
        """Extract and fit the runs ``rows``' linear probes at ``setting``; drop its features unless a bank ``kept``."""
        self.extract(setting, batch, rows)
        for row in rows:
            if "linear" in self.options.probes and setting.fields["img_size"] == self.fits[self.runs.runs[row][0]]:
                targets = self.targets[setting.name]
                fitted = probes.fit_linear(self.features[setting.name, row], targets, len(self.train.classes))
                self.linear[row] = fitted, len(targets)
        if setting.name not in kept:
            self.release(setting.name)

    def release(self, name: str) -> None:
        self.features = {key: value for key, value in self.features.items() if key[0] != name}

    def score(self, probe: str, row: int, bank: str, done: Pass) -> dict[str, Any]:
        """A result row's probe fields and metrics of run ``row`` on the val pass ``done``."""
        features, labels = done.features[row], self.train.val_classes.to(done.targets.device)[done.targets]
        classes, options = len(self.train.classes), self.options
        if probe == "knn":
            scores = probes.knn_votes(self.features[bank, row], self.targets[bank], features, classes, options.k,
                               options.temperature)
            loss, count = None, len(self.targets[bank])  # votes are no probabilities
            built = {"knn_k": options.k, "knn_temperature": options.temperature, "bank_size": options.bank_size}
        else:
            (linear, count), built = self.linear[row], {"linear_size": self.fits[self.runs.runs[row][0]]}
            scores = linear(features)
            loss = nn.functional.cross_entropy(scores, labels).item()
        hits = scores.topk(min(5, classes)).indices == labels[:, None]  # [B, k], rank order
        return {"probe": probe, **built, "top1": 100 * hits[:, 0].float().mean().item(),
                "top5": 100 * hits.any(1).float().mean().item(), "loss": loss, "train_images": count}
