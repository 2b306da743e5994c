"""The evaluation loop of ``vit_rope.evaluate``: models on one val split at square sizes, RoPE policies and token
budgets under one protocol (crop_pct 1.0 by default, as RoPE-ViT); all options are checked before any image is read."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from timm.data import create_transform, resolve_data_config
from torch import nn

from vit_rope.checks import check_multiple, resolve_device
from vit_rope.data.splits import find_split, split_label
from vit_rope.encodings.policies import POLICIES
from vit_rope.errors import UserError
from vit_rope.eval import extraction, windows
from vit_rope.eval import token_budget as naflex
from vit_rope.eval.extraction import Runs, TrainFeatures, check_feature_memory, forward_split, subset, train_split
from vit_rope.eval.loading import EvalModel, check_loaded
from vit_rope.eval.probes import PROBES, ProbeOptions, feature_width
from vit_rope.models.embedding import naflex_patch
from vit_rope.models.pos_encoding import resolution_encoding


def label_map(model: EvalModel, val_classes: list[str], val_dir: str) -> torch.Tensor:
    """Each val class's output: by name if the model knows its classes (ImageNet-1k on a few synsets), else in order."""
    trained_on = f" (its run trained on {model.data_dir}: --data-dir {model.data_dir})" if model.data_dir else ""
    if not model.model.num_classes:
        raise UserError(f"{model.label} has no classifier (num_classes=0), so it has no head to evaluate: probe its "
                        "features with --probe knn or --probe linear")
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
    """The checks that need no model and no data, so that a typo fails at once."""
    naflex.check_seq_lens(seq_lens)
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise UserError(f"unknown RoPE policy {', '.join(unknown)}: choose from {', '.join(POLICIES)}")
    if not 0 < crop_pct <= 1:
        raise UserError(f"--crop-pct {crop_pct} is outside (0, 1]: it is the fraction of the resized image that the "
                        "center crop keeps (1.0 keeps all of it, 0.875 is timm's usual)")


def choose_setting(given: str | None, models: Sequence[EvalModel], field: str = "val_split",
                   default: str | None = "val") -> str | None:
    """``given`` when set, else the ``field`` the checkpoints' training runs used (all the same), else ``default``."""
    if given:
        return given
    used = {entry.label: getattr(entry, field) for entry in models if getattr(entry, field)}
    if len(set(used.values())) > 1:
        listed = ", ".join(f"{label}: {value}" for label, value in used.items())
        what = "were validated on different splits" if field == "val_split" else f"were trained with different {field}"
        flag = "--split" if field == "val_split" else f"--{field.replace('_', '-')}"
        raise UserError(f"the checkpoints {what} ({listed}); pass {flag} to pick the one to evaluate on")
    return next(iter(used.values()), default)


def check_sizes(sizes: Sequence[int], models: Sequence[EvalModel], policies: Sequence[str] = (),
                seq_lens: Sequence[int] = ()) -> None:
    """Reject sizes that do not tile into patches, policies a model cannot take, budgets without NaFlex."""
    for entry in models:
        if seq_lens and naflex_patch(entry.model) is None:  # a model that cannot take NaFlex batches: what to do
            raise UserError(f"{entry.label} cannot be evaluated at token budgets: a {type(entry.model).__name__} "
                            "does not take NaFlex batches (its forward has no patch_coord); drop --seq-lens to "
                            "evaluate it at square --img-sizes, or evaluate a vit_rope_* or timm naflexvit_* model")
        check_multiple("size", sizes, entry.model, entry.label)
        encoding = resolution_encoding(entry.model)
        for policy in policies if encoding is not None else ():
            try:
                encoding.check_policy(policy)
            except ValueError as err:
                raise UserError(f"{entry.label}: {err}") from None


def eval_transform(size: int, crop_pct: float) -> Any:
    """timm's eval transform, pixels in [0, 1]: each model normalises by its own mean/std, so one loader serves all."""
    return create_transform(input_size=(3, size, size), crop_pct=crop_pct, crop_mode="center", interpolation="bicubic",
                            mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), is_training=False)


def normalisation(model: nn.Module, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std ``[1, 3, 1, 1]`` of a timm model's data config, which it was trained with."""
    config = resolve_data_config({}, model=model)
    return tuple(torch.tensor(config[key], device=device).view(1, 3, 1, 1) for key in ("mean", "std"))


def protocol(crop_pct: float) -> str:
    """The preprocessing in words, stored with the results so that no numbers are compared across protocols."""
    return (f"resize the short side to floor(size / {crop_pct}) px (PIL bicubic), center-crop size x size, each "
            "model's own mean/std normalisation, as in training (timm create_transform, crop_mode center)")


def square_setting(size: int, crop_pct: float, models: Iterable[int]) -> naflex.Setting:
    return naflex.Setting(f"{size} px", {"img_size": size, "seq_len": None, "crop_pct": crop_pct},
                          eval_transform(size, crop_pct), None, list(models))


@torch.inference_mode()
def evaluate_models(models: Sequence[EvalModel], data_dir: str | Path, img_sizes: Sequence[int],
                    policies: Sequence[str] | None = None, crop_pct: float = 1.0, device: str = "auto",
                    limit: int | None = None, batch_size: int = 64, workers: int = 4,
                    val_split: str = "val", seq_lens: Sequence[int] = (), window: str | int = "keep",
                    pad_windows: bool = False, *, dataset: str | None = None, input_key: str | None = None,
                    target_key: str | None = None, probes: ProbeOptions | None = None) -> list[dict[str, Any]]:
    """Top-1, top-5 (%), loss and images/s of every model at every size, token budget, policy and probe; ``policies``
    None runs each RoPE model under its own policy, as timm does (a fixed one runs the Eva twins as never trained)."""
    device, probes = resolve_device(device), probes or ProbeOptions()
    check_options(policies or (), crop_pct, seq_lens)
    keys = {"input_key": input_key, "target_key": target_key}
    val_dir = split_label(data_dir, dataset, val_split)
    samples, val_classes = find_split(Path(data_dir), dataset, val_split, split_key="--split", **keys)
    check_sizes(img_sizes, models, policies or (), seq_lens)
    settings = [square_setting(size, crop_pct, range(len(models))) for size in img_sizes]
    settings += naflex.budget_settings(seq_lens, [naflex_patch(entry.model) for entry in models])
    head, knn, linear = (probe in probes.probes for probe in PROBES)
    bank = probes.bank_size if knn else None  # one bank size for every val setting, else each setting's own
    fits = [probes.linear_size or entry.train_size for entry in models]  # where each model's linear probe is fitted
    # the train split's sizes that serve every val setting, per model: the --bank-size bank, the linear probe's fit
    needs = [{size for size in (bank, fit if linear else None) if size} for fit in fits]
    fixed = sorted(set().union(*needs))
    for entry in models:
        check_loaded(entry.model, entry.label)
        for flag, size in (("--bank-size", bank), ("--linear-size", probes.linear_size if linear else None)):
            if size:
                check_multiple(flag, [size], entry.model, entry.label)
        windows.check_windows(entry.model, sorted({*img_sizes, *fixed}), window, pad_windows, entry.label)
    maps = [label_map(entry, val_classes, val_dir).to(device) if head else None for entry in models]
    train = train_split(data_dir, dataset, probes, val_classes, **keys) if probes.pooled else None
    widths = [feature_width(entry.model, entry.label, entry.train_size) for entry in models] if train else []
    norms = [normalisation(entry.model, device) for entry in models]
    # each RoPE model's own policy, read before any run sets another; None (left as built, options too) runs it
    own = [entry.model.resolution_policy.name if hasattr(entry.model, "set_resolution_policy") else None
           for entry in models]
    pairs = [(i, policy) for i in range(len(models)) for policy in ((policies or (None,)) if own[i] else (None,))]
    runs = Runs(models, pairs, norms, device, workers, window)
    for entry in models:
        entry.model.to(device).eval()
    indices = subset(len(samples), limit)
    free, cpu, asked = extraction.free_bytes(device), device != "cuda", min(batch_size, len(indices))
    fixed_settings = [square_setting(size, crop_pct, [i for i, need in enumerate(needs) if size in need])
                      for size in fixed]
    if train:  # at most: per run, the features of its fixed sizes, the bank at one setting, the val features there
        free -= check_feature_memory({row: widths[i] for row, (i, _) in enumerate(runs.runs)}, len(train.indices),
                                     len(indices), {row: len(needs[i]) for row, (i, _) in enumerate(runs.runs)},
                                     knn and not bank, free)
    batch_sizes = [extraction.fit_batch([(models[i].label, models[i].model) for i in setting.models], setting.name,
                                        setting.fields, asked, free, 4 if cpu else 2, 2 * workers * cpu)  # bf16 on CUDA
                   for setting in settings + fixed_settings]
    for setting, batch in zip(settings + fixed_settings, batch_sizes, strict=True):
        if batch < asked:
            print(f"{setting.name}: batches of {batch} images, as many as fit in the {free / 2**30:.1f} GiB free "
                  f"(--batch-size {batch_size})", flush=True)
    banks = TrainFeatures(runs, train, probes, fits) if train else None
    per_setting = [setting.name for setting in settings] if knn and not bank else []
    for setting, batch in zip(fixed_settings, batch_sizes[len(settings):], strict=True):
        rows = [row for row, (i, _) in enumerate(runs.runs) if i in setting.models]
        banks.fit(setting, batch, rows, [*per_setting, *([f"{bank} px"] if bank else [])])
    results = []
    for setting, batch in zip(settings, batch_sizes[:len(settings)], strict=True):  # the val settings
        fed = [row for row, (i, _) in enumerate(runs.runs) if i in setting.models]
        if per_setting:
            banks.extract(setting, batch, fed)
        heads = {row: maps[runs.runs[row][0]] for row in fed} if head else {}
        done = forward_split(runs, samples, indices, setting, batch, fed, heads, set(fed) if train else set())
        if not done.counted:
            raise UserError(f"none of the {len(indices)} val images evaluated could be read; replace the corrupt files "
                            "or raise --limit")
        if done.skipped:
            print(f"warning: {done.skipped} unreadable image(s) left out at {setting.name}: top-1 and top-5 are over "
                  f"the {done.counted} of {len(indices)} that could be read")
        for row in fed:
            (i, policy), (loss_sum, hits1, hits5, seconds) = runs.runs[row], done.totals[row].tolist()
            common = {"model": models[i].label, "policy": policy or own[i], **setting.fields,
                      "train_size": models[i].train_size}
            timing = {"images_per_s": len(indices) / seconds, "images": done.counted, "device": device,
                      **({"windows": [list(w) for w in done.windows[i]]} if i in done.windows else {})}
            if head:
                results.append({**common, "probe": "head", "top1": 100 * hits1 / done.counted,
                                "top5": 100 * hits5 / done.counted, "loss": loss_sum / done.counted, **timing})
            results += [{**common, **banks.score(probe, row, f"{bank} px" if bank else setting.name, done), **timing}
                        for probe in probes.probes if probe != "head"]
        if per_setting:
            banks.release(setting.name)
    return results
