"""Train a timm image classifier (our RoPE ViTs, timm's ViTs and RoPE ports, any timm model) from a YAML config.

    python train.py -c configs/imagenette_cpu.yaml [--data-dir DIR] [--output DIR] [key=value ...]
    torchrun --nproc_per_node=N train.py -c configs/rope_vit_s_mixed.yaml --data-dir /data/imagenet

Bad input fails before any image is decoded. Writes OUTPUT/config.yaml, metrics.csv, last.pth (every epoch and every
checkpoint_interval steps), best.pth (best validated epoch), epoch_E.pth (every keep_every epochs) and TensorBoard logs
(when installed). Exit codes: 0 done, 1 the loss diverged, 2 bad input (config, model arguments, data, checkpoint).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from timm.data import Mixup, resolve_data_config
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, random_seed
from torch.nn.parallel import DistributedDataParallel

from vit_rope.checks import check_model_name
from vit_rope.data import folders, splits
from vit_rope.errors import UserError
from vit_rope.train import distributed, engine, loaders
from vit_rope.train import state as train_state
from vit_rope.train.command_line import parse_args
from vit_rope.train.config import Config, save_config
from vit_rope.train.config_checks import check_ranks_agree, scheduler_args
from vit_rope.train.model import build_model, naflex_patch
from vit_rope.train.resume import reconcile, restore


def scan_data(cfg: Config, env: distributed.DistEnv, say: Callable[[str], None]
              ) -> tuple[Path, list[folders.Sample], list[folders.Sample], list[str]]:
    """``(data dir, train samples, val samples, classes)`` of the folders (rank 0 downloads them) or ``cfg.dataset``,
    the train split cut to ``train_fraction``; ``cfg.data_dir`` becomes the folder found, for the saved config."""
    kind = splits.dataset_kind(cfg.dataset)
    with distributed.main_process_first(env):  # rank 0 downloads (or indexes the shards), the other ranks wait
        data_dir = Path(cfg.data_dir).expanduser() if kind else folders.resolve_data_dir(cfg.data_dir,
                                                                                          cfg.download_size)
        keys = dict(input_key=cfg.input_key, target_key=cfg.target_key,
                    cache_dir=Path(cfg.cache_dir).expanduser() if cfg.cache_dir else None)
        train_samples, classes = splits.find_split(data_dir, cfg.dataset, cfg.train_split, None, "train_split", **keys)
        if len(classes) < 2:  # a one-way classifier learns nothing: loss 0 and top-1 100 from the first step
            raise UserError(f"{splits.split_label(data_dir, cfg.dataset, cfg.train_split)} has 1 class "
                            f"({classes[0]}); a classifier needs two or more, each in a folder (or with a label) of "
                            "its own")
        val_samples, _ = splits.find_split(data_dir, cfg.dataset, cfg.val_split, classes, **keys)
    cfg.data_dir = str(data_dir)
    if cfg.train_fraction < 1:
        everything = len(train_samples)
        train_samples = folders.balanced_subset(train_samples, cfg.train_fraction, cfg.train_subset_seed)
        say(f"train subset: {len(train_samples)} of {everything} images ({cfg.train_fraction:g} of each class, "
            f"train_subset_seed {cfg.train_subset_seed}), listed in {Path(cfg.output) / 'train_subset.txt'}")
    # every rank draws each step's size and images itself, from these: they must agree (a collective under DDP)
    check_ranks_agree({key: getattr(cfg, key) for key in ("train_sizes", "img_size", "batch_size", "token_budget",
                                                          "seed", "mixup", "cutmix", "repeated_aug", "epochs",
                                                          "checkpoint_interval", "naflex", "naflex_seq_lens")}
                      | {"the number of train images": len(train_samples)}, env.world_size)
    return data_dir, train_samples, val_samples, classes


def criterion(cfg: Config, num_classes: int) -> tuple[torch.nn.Module, Mixup | None]:
    """The loss (soft targets whenever images are mixed) and, when the batches are mixed here, timm's ``Mixup``."""
    mixing, mixup = cfg.mixup > 0 or cfg.cutmix > 0, None
    if mixing and not cfg.naflex:  # NaFlex mixes in its loader (timm's NaFlexMixup): the targets come soft
        mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                      switch_prob=cfg.mixup_switch_prob, label_smoothing=cfg.smoothing, num_classes=num_classes)
    if cfg.loss == "bce":
        return BinaryCrossEntropy(smoothing=cfg.smoothing), mixup  # DeiT-III; Mixup's soft targets pass through as is
    if mixing:
        return SoftTargetCrossEntropy(), mixup  # Mixup already applied the label smoothing
    return (LabelSmoothingCrossEntropy(cfg.smoothing) if cfg.smoothing else torch.nn.CrossEntropyLoss()), mixup


def train(cfg: Config) -> None:
    """Run (or resume) the training described by ``cfg``."""
    env = distributed.init_distributed(cfg.device)
    random_seed(cfg.seed, env.rank)
    pipeline, _ = loaders.choose_pipeline(cfg)  # the batched tensor pipeline needs no loader workers
    threads = distributed.set_cpu_threads(cfg.threads, 0 if pipeline == "tensor" else cfg.workers)
    if env.device.type == "cuda":
        distributed.set_tf32(cfg.tf32)
    say = print if env.is_main else lambda *args, **kwargs: None
    check_model_name(cfg.model)  # before a download of the default data set
    resume = train_state.load_checkpoint(cfg.resume) if cfg.resume else None  # a bad path fails before slow data work
    if resume is not None and resume["model_name"] != cfg.model:
        raise UserError(f"{cfg.resume} was written for model '{resume['model_name']}', this run builds "
                        f"'{cfg.model}'; pass --model {resume['model_name']}")
    if resume is not None:
        cfg = reconcile(cfg, resume, env.is_main)  # optimizer and schedule keys as saved; other differences named
    finetune = train_state.load_checkpoint(cfg.finetune) if cfg.finetune and resume is None else None

    data_dir, train_samples, val_samples, classes = scan_data(cfg, env, say)  # the model needs the number of classes

    net, model_kwargs = build_model(cfg, classes, resume, finetune, say)
    channels_last = cfg.channels_last and env.device.type == "cuda"
    net.to(env.device, memory_format=torch.channels_last if channels_last else torch.preserve_format)
    data_config = resolve_data_config({"input_size": (3, cfg.img_size, cfg.img_size), "crop_pct": cfg.crop_pct,
                                       "interpolation": cfg.interpolation}, model=net)
    patch = naflex_patch(net, cfg.model) if cfg.naflex else 16
    with distributed.main_process_first(env):  # rank 0 writes the decoded cache, the other ranks read it
        train_loader, val_loader = loaders.build_loaders(cfg, train_samples, val_samples, data_config, env.rank,
                                                      env.world_size, env.device, patch=patch, num_classes=len(classes))
    say(f"{cfg.model}: {sum(p.numel() for p in net.parameters()) / 1e6:.2f}M params on {env.world_size} x "
        f"{env.device.type} ({threads} CPU threads each); {len(train_samples)} train / {len(val_samples)} val "
        f"images, {len(classes)} classes, {len(train_loader)} steps per epoch")

    # ---- optimizer, schedule, loss, EMA (timm): no weight decay on 1-D params and model.no_weight_decay() ------
    optimizer = create_optimizer_v2(net, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)
    scheduler, _ = create_scheduler_v2(optimizer, **scheduler_args(cfg), updates_per_epoch=len(train_loader))
    scaler = torch.amp.GradScaler(env.device.type, enabled=cfg.amp and cfg.amp_dtype == "float16"
                                  and env.device.type == "cuda")  # bf16 needs no loss scaling
    loss_fn, mixup = criterion(cfg, len(classes))
    ema = ModelEmaV3(net, decay=cfg.model_ema_decay) if cfg.model_ema else None

    # ---- resume a run (its model weights were loaded above), at the start of an epoch or mid-epoch ---------------
    start_epoch, start_step, totals, best_top1 = 0, 0, None, float("-inf")
    if resume is not None:
        start_epoch, start_step, totals, best_top1 = restore(resume, cfg, env, len(train_loader), optimizer,
                                                             scheduler, scaler, ema)
        say(f"resumed {cfg.resume} at epoch {start_epoch}" + (f", step {start_step}" if start_step else ""))

    model = net
    if env.distributed:
        model = DistributedDataParallel(net, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)
    output = Path(cfg.output)
    columns = ["epoch", "train_loss", "val_loss", "top1", "top5", "lr", "images_per_s", "seconds"]
    columns += ["ema_top1", "ema_top5"] if ema is not None else []
    columns += ["tokens_per_s", "sizes"] + ["padding"] * cfg.naflex  # last, so readers of older columns still work
    if env.is_main:
        output.mkdir(parents=True, exist_ok=True)
        save_config(cfg, output / "config.yaml")
        if cfg.train_fraction < 1:  # the images a subset run trained on, relative to the data dir
            (output / "train_subset.txt").write_text(
                "".join(f"{str(path).removeprefix(f'{data_dir}/')}\n" for path, _ in train_samples))
        log = engine.RunLog(output, columns, start_epoch if resume else None)

    def position(epochs_done: int, step: int) -> str:
        return f"step {step} of epoch {epochs_done + 1}" if step else f"epoch {epochs_done}"

    saved = position(start_epoch, start_step) if resume else None  # where last.pth stands, for the divergence error

    def save_last(epochs_done: int, extra: dict[str, Any], copies: Sequence[str] = ()) -> None:
        """Write OUTPUT/last.pth (rank 0), after the same checkpoint under the names ``copies`` (best.pth, epoch_E.pth):
        a crash between the writes leaves last.pth an epoch behind, so resuming redoes the epoch and writes the copies
        again, where the other order would lose them. A collective: every rank must call it."""
        nonlocal saved
        saved = position(epochs_done, extra.get("step", 0))
        rng = train_state.gather_rng_states(env)
        if not env.is_main:
            return
        ckpt = {"model_name": cfg.model, "model_kwargs": model_kwargs, "classes": classes, "model": net.state_dict(),
                **({"model_ema": ema.module.state_dict()} if ema else {}),  # the key timm's loaders look for
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(), "epoch": epochs_done, "best_top1": best_top1, "rng": rng,
                "config": dataclasses.asdict(cfg), **extra}
        for name in (*copies, "last.pth"):
            train_state.save_checkpoint(ckpt, output / name)

    def save_mid_epoch(epoch: int, step: int, totals: engine.EpochTotals) -> None:
        """last.pth at ``step`` of ``epoch`` (0-based, in progress) with its totals so far; a resume goes on from it."""
        save_last(epoch, {"step": step, "epoch_totals": dataclasses.asdict(totals)})

    for epoch in range(start_epoch, cfg.epochs):
        start = time.perf_counter()
        loaders.set_epoch(train_loader, epoch, start_step)
        try:
            stats = engine.train_one_epoch(model, train_loader, optimizer, scheduler, loss_fn, cfg, env, epoch,
                                           scaler=scaler, mixup=mixup, ema=ema, start_step=start_step, totals=totals,
                                           checkpoint=save_mid_epoch)
            start_step, totals = 0, None
        except engine.NonFiniteLossError as err:
            kept = f"{output / 'last.pth'} ({saved}) is the last good checkpoint" if saved else "no checkpoint yet"
            raise engine.NonFiniteLossError(f"{err}; {kept}") from None
        validated = (epoch + 1) % cfg.val_interval == 0 or epoch + 1 == cfg.epochs
        if validated:
            stats |= engine.validate(model, val_loader, cfg, env)
            if ema is not None:
                stats |= {f"ema_{key}": value for key, value in engine.validate(ema.module, val_loader, cfg,
                                                                                  env).items()}
        scheduler.step(epoch + 1, stats.get("top1"))  # per-epoch schedulers only (plateau); the rest step per update
        stats |= {"epoch": epoch + 1, "seconds": time.perf_counter() - start}
        is_best = validated and stats["top1"] > best_top1
        best_top1 = stats["top1"] if is_best else best_top1
        copies = ["best.pth"] if is_best else []
        if cfg.keep_every and (epoch + 1) % cfg.keep_every == 0:
            copies.append(f"epoch_{epoch + 1}.pth")
        save_last(epoch + 1, {"metrics": stats}, copies)
        if not env.is_main:
            continue
        log.write(stats)
        # sizes when 2+ were drawn; the val columns in validated epochs only
        shown = [key for key in columns[1:] if key in stats and (key != "sizes" or " " in stats["sizes"])]
        say(f"epoch {epoch + 1}/{cfg.epochs} " + " ".join(
            f"{key} {stats[key]}" if isinstance(stats[key], str) else f"{key} {stats[key]:.4g}" for key in shown)
            + (f" ({stats['skipped']} unreadable image(s) skipped)" if stats["skipped"] else ""), flush=True)
    if env.is_main:
        log.close()
        say(f"done: best top1 {best_top1:.2f}; checkpoints in {output}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (0 done, 1 loss diverged, 2 bad input)."""
    logging.basicConfig(format="%(levelname)s: %(message)s")
    with warnings.catch_warnings():  # a warning is one line for the user, not the library line that raised it
        warnings.showwarning = lambda message, *args, **kwargs: print(f"warning: {message}", file=sys.stderr)
        try:
            with distributed.flushed_subnormals():
                train(parse_args(argv))
        except (UserError, engine.NonFiniteLossError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2 if isinstance(err, UserError) else 1
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
