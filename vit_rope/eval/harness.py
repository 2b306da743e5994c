"""The evaluation loop behind ``python -m vit_rope.evaluate`` (``vit_rope.eval.command``): checkpoints or timm models on
one val split at several square sizes and RoPE policies, and at token budgets for models that take NaFlex batches.

One protocol for every model, so that the numbers compare (crop_pct 1.0 by default, as RoPE-ViT); each size's images
are decoded once and fed to every model and policy in turn. Every option is checked (``check_options``,
``check_sizes``) before any image is read, so bad input costs nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from timm.data import create_transform, resolve_data_config
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from vit_rope.checks import check_multiple, resolve_device
from vit_rope.data.folders import ImageFolderDataset
from vit_rope.data.splits import find_split, split_label
from vit_rope.encodings.policies import POLICIES
from vit_rope.errors import UserError
from vit_rope.eval import memory, windows
from vit_rope.eval import token_budget as naflex
from vit_rope.eval.loading import EvalModel, check_loaded
from vit_rope.models.naflex_batch import naflex_patch
from vit_rope.models.pos_encoding import resolution_encoding


def label_map(model: EvalModel, val_classes: list[str], val_dir: str) -> torch.Tensor:
    """Output index of each val class: by name when the model's classes are known (so that an ImageNet-1k model
    scores on a folder of a few synsets), else in folder order (class index order for shards and datasets)."""
    trained_on = f" (its run trained on {model.data_dir}: --data-dir {model.data_dir})" if model.data_dir else ""
    if model.classes is not None:
        unknown = [name for name in val_classes if name not in model.classes]
        if unknown:
            raise UserError(f"{val_dir} has classes {unknown[:5]} that {model.label} was not trained on; evaluate "
                            f"on a folder of its classes{trained_on}")
        return torch.tensor([model.classes.index(name) for name in val_classes])
    outputs = model.model.num_classes
    if outputs != len(val_classes):
        raise UserError(f"{model.label} has {outputs} outputs but {val_dir} has {len(val_classes)} classes; use a "
                        f"folder of its classes{trained_on}, or --model-kwargs num_classes=N")
    return torch.arange(outputs)


def check_options(policies: Sequence[str], crop_pct: float, seq_lens: Sequence[int] = ()) -> None:
    """The checks that need no model and no data, run first so that a typo fails at once."""
    naflex.check_seq_lens(seq_lens)
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise UserError(f"unknown RoPE policy {', '.join(unknown)}: choose from {', '.join(POLICIES)}")
    if not 0 < crop_pct <= 1:
        raise UserError(f"--crop-pct {crop_pct} is outside (0, 1]: it is the fraction of the resized image that the "
                        "center crop keeps (1.0 keeps all of it, 0.875 is timm's usual)")


def choose_setting(given: str | None, models: Sequence[EvalModel], field: str = "val_split",
                   flag: str = "--split", default: str | None = "val") -> str | None:
    """``given`` (the ``flag``) when set, else the ``field`` the checkpoints' training runs used, else ``default``."""
    if given:
        return given
    used = {entry.label: getattr(entry, field) for entry in models if getattr(entry, field)}
    if len(set(used.values())) > 1:
        listed = ", ".join(f"{label}: {value}" for label, value in used.items())
        what = "were validated on different splits" if field == "val_split" else f"were trained with different {field}"
        raise UserError(f"the checkpoints {what} ({listed}); pass {flag} to pick the one to evaluate on")
    return next(iter(used.values()), default)


def check_sizes(sizes: Sequence[int], models: Sequence[EvalModel], policies: Sequence[str] = (),
                seq_lens: Sequence[int] = ()) -> None:
    """Reject sizes that do not tile into whole patches, naming the nearest sizes that do, policies that a model's
    RoPE cannot take (DINOv3's normalised coordinates take two), and with token budgets models without NaFlex."""
    if seq_lens:
        naflex.check_naflex(models)
    for entry in models:
        check_multiple("size", sizes, entry.model, entry.label)
        encoding = resolution_encoding(entry.model)
        for policy in policies if encoding is not None else ():
            try:
                encoding.check_policy(policy)
            except ValueError as err:
                raise UserError(f"{entry.label}: {err}") from None


def eval_transform(size: int, crop_pct: float) -> Any:
    """timm's eval transform: Resize(short side floor(size / crop_pct), bicubic), CenterCrop(size), ToTensor, with
    pixels left in [0, 1]: each model is normalised with its own mean/std (``normalisation``), as it was trained."""
    return create_transform(input_size=(3, size, size), crop_pct=crop_pct, crop_mode="center", interpolation="bicubic",
                            mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), is_training=False)


def normalisation(model: nn.Module, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std (``[1, 3, 1, 1]``) of a timm model's data config, which ``train.py`` normalised with
    (ImageNet's for ours and DeiT, 0.5 for timm's augreg ViTs)."""
    config = resolve_data_config({}, model=model)
    return (torch.tensor(config["mean"], device=device).view(1, 3, 1, 1),
            torch.tensor(config["std"], device=device).view(1, 3, 1, 1))


def subset(count: int, limit: int | None) -> list[int]:
    """``limit`` evenly spaced indices of ``count`` samples; samples are sorted by class, so every class appears."""
    if limit is None or limit >= count:
        return list(range(count))
    return [i * count // limit for i in range(limit)]


def protocol(crop_pct: float) -> str:
    """The preprocessing in words, stored with the results so that no numbers are compared across protocols."""
    return (f"resize the short side to floor(size / {crop_pct}) px (PIL bicubic), center-crop size x size, each "
            "model's own mean/std normalisation, as in training (timm create_transform, crop_mode center)")


@torch.inference_mode()
def evaluate_models(models: Sequence[EvalModel], data_dir: str | Path, img_sizes: Sequence[int],
                    policies: Sequence[str] | None = None, crop_pct: float = 1.0, device: str = "auto",
                    limit: int | None = None, batch_size: int = 64, workers: int = 4,
                    val_split: str = "val", seq_lens: Sequence[int] = (), window: str | int = "keep",
                    pad_windows: bool = False, *, dataset: str | None = None, input_key: str | None = None,
                    target_key: str | None = None) -> list[dict[str, Any]]:
    """Top-1, top-5 (%), loss and images/s (forward only) of every model at every size and token budget on
    ``data_dir/val_split`` (``dataset`` and its keys as ``train.py``'s), once per policy for RoPE models.

    ``policies`` None runs each RoPE model under the policy it was built with, as timm runs it (a fixed default would
    evaluate the Eva twins as they were never trained); models without ``set_resolution_policy`` run once, with policy
    None. A Swin's windows follow ``window`` (``vit_rope.eval.windows``; its rows' ``windows``), a size they do not
    tile refused unless ``pad_windows``. A batch that would not fit in free memory is cut (``vit_rope.eval.memory``).
    Bad input raises ``UserError`` before any image is decoded.
    """
    device = resolve_device(device)
    check_options(policies or (), crop_pct, seq_lens)
    val_dir = split_label(data_dir, dataset, val_split)
    samples, val_classes = find_split(Path(data_dir), dataset, val_split, split_key="--split", input_key=input_key,
                                      target_key=target_key)
    check_sizes(img_sizes, models, policies or (), seq_lens)
    settings = [naflex.Setting(f"{size} px", {"img_size": size, "seq_len": None, "crop_pct": crop_pct},
                               eval_transform(size, crop_pct), None, list(range(len(models)))) for size in img_sizes]
    settings += naflex.budget_settings(seq_lens, [naflex_patch(entry.model) for entry in models])
    for entry in models:
        check_loaded(entry.model, entry.label)
    trained = {i: windows.trained_windows(entry.model) for i, entry in enumerate(models)
               if windows.has_windows(entry.model)}
    for i, windowed in trained.items():
        windows.check_windows(models[i].model, list(img_sizes), window, windowed, pad_windows, models[i].label)
    maps = [label_map(entry, val_classes, val_dir).to(device) for entry in models]
    norms = [normalisation(entry.model, device) for entry in models]
    # each RoPE model's own policy, read before any run sets another; None (left as built, options too) runs it
    own = [entry.model.resolution_policy.name if hasattr(entry.model, "set_resolution_policy") else None
           for entry in models]
    runs = [(i, policy) for i in range(len(models)) for policy in ((policies or (None,)) if own[i] else (None,))]
    for entry in models:
        entry.model.to(device).eval()
    indices = subset(len(samples), limit)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None  # CUDA runs asynchronously: time whole calls
    results = []
    free, cpu, asked = memory.free_bytes(device), device != "cuda", min(batch_size, len(indices))
    batch_sizes = [memory.fit_batch([(models[i].label, models[i].model) for i in setting.models], setting.name,
                                    setting.fields, asked, free, 4 if cpu else 2, 2 * workers * cpu)  # bf16 on CUDA
                   for setting in settings]
    for setting, batch in zip(settings, batch_sizes, strict=True):
        if batch < asked:
            print(f"{setting.name}: batches of {batch} images, as many as fit in the {free / 2**30:.1f} GiB free "
                  f"(--batch-size {batch_size})", flush=True)
    for setting, batch in zip(settings, batch_sizes, strict=True):
        loader = DataLoader(Subset(ImageFolderDataset(samples, setting.transform), indices), batch,
                            num_workers=workers, pin_memory=device == "cuda", collate_fn=setting.collate)
        fed = [row for row, (i, _) in enumerate(runs) if i in setting.models]
        used = {i: windows.set_windows(models[i].model, setting.fields["img_size"], window, trained[i])
                for i in trained if setting.fields.get("img_size")}
        totals = torch.zeros(len(runs), 4, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, seconds
        skipped = counted = 0
        batches = tqdm(loader, setting.name, leave=False, disable=not sys.stderr.isatty())
        for step, (images, targets, bad) in enumerate(batches):  # images [B, C, H, W] or a NaFlex batch
            images, skipped = naflex.to_device(images, device), skipped + int((bad > 0).sum())  # slots refilled
            keep = (bad == 0).to(device)  # [B]; an unreadable image's slot holds the next readable one: not twice
            counted += int(keep.sum())
            for row in fed:
                i, policy = runs[row]
                model, labels = models[i].model, maps[i][targets.to(device)]
                inputs = naflex.normalise(images, *norms[i])
                if policy is not None:
                    model.set_resolution_policy(policy)
                with amp:
                    if step == 0:  # untimed warm-up: first-call allocations and kernel choices are not throughput
                        model(inputs)
                    sync()
                    start = time.perf_counter()
                    logits = model(inputs).float()
                    sync()
                seconds = time.perf_counter() - start
                logits, labels = logits[keep], labels[keep]
                hits = logits.topk(min(5, logits.shape[1])).indices == labels[:, None]  # [B, k], rank order
                loss = nn.functional.cross_entropy(logits, labels, reduction="sum")
                totals[row] += torch.tensor([loss.item(), hits[:, 0].sum().item(), hits.any(1).sum().item(), seconds],
                                            dtype=torch.float64)
        if not counted:
            raise UserError(f"none of the {len(indices)} val images evaluated could be read; replace the corrupt files "
                            "or raise --limit")
        if skipped:
            print(f"warning: {skipped} unreadable image(s) left out at {setting.name}: top-1 and top-5 are over the "
                  f"{counted} of {len(indices)} that could be read")
        for row in fed:
            (i, policy), (loss_sum, hits1, hits5, seconds) = runs[row], totals[row].tolist()
            results.append({"model": models[i].label, "policy": policy or own[i], **setting.fields,
                            "train_size": models[i].train_size, "top1": 100 * hits1 / counted,
                            "top5": 100 * hits5 / counted, "loss": loss_sum / counted,
                            "images_per_s": len(indices) / seconds, "images": counted, "device": device,
                            **({"windows": [list(w) for w in used[i]]} if i in used else {})})
    return results
