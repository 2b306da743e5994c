"""An epoch's training, validation and the run's log, on one process or under ``torchrun`` (metrics reduced)."""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.layers import to_2tuple
from timm.utils import accuracy, dispatch_clip_grad, unwrap_model
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from vit_rope.data.steps import global_rng_kept
from vit_rope.train.config import Config
from vit_rope.train.distributed import DistEnv, reduce_sum


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; raised on every rank before the bad step changes the weights."""


def autocast(cfg: Config, device: torch.device) -> torch.autocast:
    """Mixed precision on CUDA when ``cfg.amp``; full fp32 on CPU, where bf16 autocast is slow on most machines."""
    return torch.autocast(device.type, dtype=getattr(torch, cfg.amp_dtype), enabled=cfg.amp and device.type == "cuda")


class Progress:
    """A tqdm bar on a terminal, else a line every ``log_interval`` steps; quiet for 0 and on ranks other than 0."""

    def __init__(self, total: int, desc: str, log_interval: int, enabled: bool) -> None:
        self.total, self.desc, self.start = total, desc, time.perf_counter()
        self.log_interval = log_interval if enabled else 0
        self.bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True,
                        disable=not (self.log_interval and sys.stderr.isatty()))

    def update(self, step: int, **stats: str) -> None:
        if not self.bar.disable:
            self.bar.set_postfix(stats, refresh=False)
            self.bar.update()
        elif self.log_interval and (step + 1) % self.log_interval == 0:
            eta = (time.perf_counter() - self.start) / (step + 1) * (self.total - step - 1)
            fields = " ".join(f"{key} {value}" for key, value in stats.items())
            print(f"{self.desc} step {step + 1}/{self.total} {fields} eta {eta:.0f}s", flush=True)


Batch = torch.Tensor | dict[str, Any]  # images [B, C, H, W], or timm's NaFlex dict (patches [B, N, P*P*C], ...)


def _to_device(images: Batch, targets: torch.Tensor, cfg: Config, device: torch.device) -> tuple[Batch, torch.Tensor]:
    if isinstance(images, dict):  # NaFlex: timm's prefetcher already put the batch on the device
        return images, targets.to(device, non_blocking=True)
    memory_format = torch.channels_last if cfg.channels_last and device.type == "cuda" else torch.contiguous_format
    return images.to(device, non_blocking=True, memory_format=memory_format), targets.to(device, non_blocking=True)


def _batch_tokens(images: Batch, patch: tuple[int, int]) -> tuple[tuple[int, int], float, float]:
    """``(size, tokens, slots)`` of a batch: ``(H, W)`` and ``(H / p) x (W / p)`` per image, or NaFlex's ``(L, 0)``."""
    if isinstance(images, dict):
        valid = images["patch_valid"]  # [B, N]
        return (valid.shape[1], 0), float(valid.sum()), float(valid.numel())
    height, width = images.shape[-2:]
    tokens = len(images) * (height / patch[0]) * (width / patch[1])
    return (height, width), tokens, tokens


@dataclass
class EpochTotals:
    """What an epoch's summary adds up, saved in a mid-epoch checkpoint so that a resumed epoch reports it whole."""

    steps: int = 0
    loss_sum: float = 0.0  # of the per-step losses, each averaged over ranks
    skipped: int = 0  # unreadable images replaced, all ranks
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # steps per (height, width), NaFlex (length, 0)
    tokens: float = 0.0  # patch tokens of this rank, padding excluded
    slots: float = 0.0  # sequence positions of this rank, padding included


def train_one_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, scheduler: Any,
                    loss_fn: nn.Module, cfg: Config, env: DistEnv, epoch: int, *, scaler: torch.amp.GradScaler,
                    mixup: Any = None, ema: Any = None, start_step: int = 0, totals: EpochTotals | None = None,
                    checkpoint: Callable[[int, int, EpochTotals], None] | None = None) -> dict[str, Any]:
    """Train for one epoch (0-based); a NaN/inf loss, averaged over ranks first, stops every rank at once."""
    model.train()
    steps, start = len(loader), time.perf_counter()
    totals = totals or EpochTotals()
    seen, tokens = 0, 0.0  # images and patch tokens of this rank, in this process
    # models without patch_embed (CNNs) count tokens as if p were 16, so that tokens/s still compares between sizes
    patch = to_2tuple(getattr(getattr(unwrap_model(model), "patch_embed", None), "patch_size", 16))
    progress = Progress(steps, f"epoch {epoch + 1}/{cfg.epochs}", cfg.log_interval, env.is_main)
    for step, (images, targets, bad) in enumerate(loader, start_step):
        images, targets = _to_device(images, targets, cfg, env.device)
        if mixup is not None:
            images, targets = mixup(images, targets)
        with autocast(cfg, env.device):
            loss = loss_fn(model(images), targets)
        # one collective for the loss (every rank stops at the same step) and the unreadable images
        mean_loss, skipped = reduce_sum(torch.stack([loss.detach().float(), bad.sum().to(env.device, torch.float32)]),
                                        env).tolist()
        mean_loss /= env.world_size
        if not np.isfinite(mean_loss):
            progress.bar.close()
            raise NonFiniteLossError(f"training loss became {mean_loss} at epoch {epoch + 1}, step {step + 1} of "
                                     f"{steps}; lower lr or set clip_grad")
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if cfg.clip_grad is not None:
            scaler.unscale_(optimizer)
            dispatch_clip_grad(model.parameters(), cfg.clip_grad, mode=cfg.clip_mode)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step_update(num_updates=epoch * steps + step + 1)
        if ema is not None:
            ema.update(unwrap_model(model), step=epoch * steps + step + 1)
        size, step_tokens, slots = _batch_tokens(images, patch)
        totals.steps += 1
        totals.loss_sum += mean_loss
        totals.skipped += round(skipped)
        totals.sizes[size] = totals.sizes.get(size, 0) + 1
        totals.tokens, totals.slots = totals.tokens + step_tokens, totals.slots + slots
        seen, tokens = seen + len(targets), tokens + step_tokens
        rate = seen * env.world_size / (time.perf_counter() - start)
        progress.update(step, loss=f"{mean_loss:.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}", img_s=f"{rate:.0f}")
        interval = cfg.checkpoint_interval
        if checkpoint is not None and interval and (step + 1) % interval == 0 and step + 1 < steps:
            checkpoint(epoch, step + 1, totals)
    progress.bar.close()
    seconds = time.perf_counter() - start
    valid, slots = reduce_sum(torch.tensor([totals.tokens, totals.slots], dtype=torch.float64, device=env.device),
                              env).tolist()
    # every rank draws the same batch lengths and sizes (vit_rope.data.steps): one count x world_size is the total
    return {"train_loss": totals.loss_sum / totals.steps, "lr": optimizer.param_groups[0]["lr"],
            "images_per_s": seen * env.world_size / seconds, "tokens_per_s": tokens * env.world_size / seconds,
            # 64:12 (square), 64x96:12, or 256t:12 (NaFlex steps of sequence length 256)
            "sizes": " ".join(f"{h}t:{n}" if w == 0 else f"{h}:{n}" if h == w else f"{h}x{w}:{n}"
                              for (h, w), n in sorted(totals.sizes.items())),
            "padding": 1 - valid / slots, "skipped": totals.skipped}


@torch.inference_mode()
def validate(model: nn.Module, loader: DataLoader, cfg: Config, env: DistEnv) -> dict[str, float]:
    """Loss, top-1, top-5 (%) on the val split; the global RNG is kept, so validating does not change the training."""
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=env.device)  # loss sum, top-1 hits, top-5 hits, images
    with global_rng_kept():
        for images, targets, _ in loader:
            images, targets = _to_device(images, targets, cfg, env.device)
            with autocast(cfg, env.device):
                logits = model(images)
            top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[1])))
            loss = nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
            count = torch.tensor(float(len(targets)), device=env.device)
            totals += torch.stack([loss, top1 * count / 100, top5 * count / 100, count]).double()
    loss_sum, hits1, hits5, count = reduce_sum(totals, env).tolist()
    return {"val_loss": loss_sum / count, "top1": 100 * hits1 / count, "top5": 100 * hits5 / count}


class RunLog:
    """``metrics.csv`` and TensorBoard when installed; on resume the rows past the checkpoint's epoch are dropped."""

    def __init__(self, output: Path, columns: list[str], resume_epoch: int | None) -> None:
        self.path, self.columns = output / "metrics.csv", columns
        kept = []
        if resume_epoch is not None and self.path.exists():
            with self.path.open() as f:
                kept = [row for row in csv.DictReader(f) if int(row["epoch"]) <= resume_epoch]
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self.tb = None
        else:
            self.tb = SummaryWriter(str(output / "tensorboard"))

    def write(self, row: dict[str, float]) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns, extrasaction="ignore").writerow(
                {key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()})
        if self.tb is not None:
            for key, value in row.items():
                if key != "epoch" and isinstance(value, int | float):  # not text such as sizes
                    self.tb.add_scalar(key, value, row["epoch"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
