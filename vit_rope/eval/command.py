"""Accuracy against input resolution: checkpoints or timm models on ``DIR/val`` (``--val-split``) at several sizes and
RoPE policies, by their classifier or by kNN and linear probes of their features (a backbone without a head).

Exit codes (docs/evaluation.md): 0 done, 2 bad input, all checked before any evaluation starts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from vit_rope.checks import check_model_name, check_output_dir
from vit_rope.data.folders import resolve_data_dir
from vit_rope.data.splits import dataset_kind, find_split, split_label
from vit_rope.encodings.policies import POLICIES
from vit_rope.errors import UserError
from vit_rope.eval import token_budget as naflex
from vit_rope.eval import windows
from vit_rope.eval.harness import check_options, check_sizes, choose_setting, evaluate_models, protocol
from vit_rope.eval.loading import EvalModel, check_weights, load_pretrained, load_trained, parse_kwarg
from vit_rope.eval.probes import PROBES, ProbeOptions
from vit_rope.eval.report import write_reports
from vit_rope.train.distributed import flushed_subnormals, set_cpu_threads


def _whole(text: str, least: int = 1) -> int:
    if not text.isdigit() or int(text) < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {least}")
    return int(text)


PROBE_FLAGS = {"--knn-k": ("knn",), "--knn-temperature": ("knn",), "--bank-size": ("knn",),
               "--linear-size": ("linear",), "--train-split": ("knn", "linear"), "--train-limit": ("knn", "linear")}


def data_root(given: str | None, dataset: str | None, models: list[EvalModel]) -> Path:
    """``--data-dir``; by default as in ``train.py`` for an image folder, the checkpoint's for shards and datasets."""
    if not dataset_kind(dataset):
        return resolve_data_dir(given)
    if given:
        return Path(given).expanduser()
    trained = next((entry.data_dir for entry in models if entry.data_dir), None)
    if trained and Path(trained).expanduser().is_dir():  # when it is here
        print(f"--data-dir {trained}: the checkpoint's data_dir", flush=True)
        return Path(trained).expanduser()
    raise UserError(f"--dataset {dataset} reads --data-dir, which is not set; pass the folder of its shards or "
                    "dataset" + (f" (the checkpoint trained on {trained}, which is not here)" if trained else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vit-rope-evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="+", default=[], metavar="PATH", help="train.py checkpoints")
    parser.add_argument("--model", nargs="+", default=[], metavar="NAME", help="timm model names")
    parser.add_argument("--pretrained-file", nargs="+", metavar="PATH", help="weights for each --model, in order")
    parser.add_argument("--random-init", action="store_true",
                        help="evaluate a --model without weights, labelled 'random init': chance accuracy, for timing")
    parser.add_argument("--model-kwargs", nargs="+", type=parse_kwarg, default=[], metavar="KEY=VALUE",
                        help="extra timm.create_model arguments for every --model (values read as YAML)")
    parser.add_argument("--train-size", type=_whole, help="training size of the --model models (default: theirs)")
    parser.add_argument("--no-ema", action="store_true", help="evaluate a checkpoint's model weights, not its EMA")
    parser.add_argument("--data-dir", help="dataset root holding the val split (one folder per class); default as "
                        "train.py: ../shared/data/imagenette when it exists, else Imagenette downloaded")
    parser.add_argument("--dataset", metavar="KIND/NAME",
                        help="what --data-dir holds, as train.py's dataset: wds/<name> (WebDataset shards), "
                        "hfds/<name> (a Hugging Face dataset on disk) or folder (default: the checkpoints')")
    parser.add_argument("--split", "--val-split", dest="split", metavar="NAME",
                        help="split to evaluate on: a folder of --data-dir, a split of the shards or dataset (default: "
                        "the val_split the checkpoints were trained with, else val)")
    parser.add_argument("--input-key", metavar="KEY", help="shards: the image members' extensions (jpg;png); a "
                        "dataset: its image column (default: the checkpoints')")
    parser.add_argument("--target-key", metavar="KEY", help="shards: the .json field of the label; a dataset: its "
                        "label column (default: the checkpoints')")
    parser.add_argument("--img-sizes", nargs="+", type=_whole, metavar="SIZE",
                        help="square input sizes, multiples of the patch size (default: every model's training "
                        "size, each model at all of them; none with --seq-lens)")
    parser.add_argument("--seq-lens", nargs="+", type=naflex.seq_len_arg, default=[], metavar="L",
                        help="token budgets: each image resized keeping its aspect ratio to at most L patches (timm's "
                        "NaFlex eval transform), for models that take NaFlex batches; with --img-sizes, both")
    parser.add_argument("--policy", nargs="+",
                        help=f"RoPE policies: {', '.join(POLICIES)} (default: each model's own, as timm runs it)")
    parser.add_argument("--window-size", type=windows.window_arg, default="keep", metavar="RULE",
                        help="a Swin's windows at each size: keep (default: as trained), scale (with the image, "
                        "timm's set_input_size rule) or a number of tokens per side")
    parser.add_argument("--pad-windows", action="store_true", help="pad a Swin's windows where a size's stages "
                        "are not whole windows (timm's dynamic_img_size), instead of refusing the size")
    parser.add_argument("--probe", nargs="+", choices=PROBES, metavar="PROBE",
                        help="what is scored: head (the classifier; the default), knn (DINO's weighted kNN on pooled "
                        "features) or linear (a linear probe fitted at one size); knn or linear alone need no head")
    parser.add_argument("--knn-k", type=_whole, help="train images that vote in kNN (default 20)")
    parser.add_argument("--knn-temperature", type=float, help="kNN vote weight exp(similarity / T), default 0.07")
    parser.add_argument("--bank-size", type=_whole, metavar="SIZE",
                        help="the kNN bank's image size for every evaluated size (default: each evaluated one)")
    parser.add_argument("--linear-size", type=_whole, metavar="SIZE",
                        help="the size the linear probe is fitted at (default: each model's training size)")
    parser.add_argument("--train-split", metavar="NAME",
                        help="the split the probes are built from (default: the checkpoints' train_split, else train)")
    parser.add_argument("--train-limit", type=_whole, metavar="N",
                        help="build the probes from N train images, spread evenly over the classes (default: all)")
    parser.add_argument("--crop-pct", type=float, default=1.0, help="center-crop fraction (default 1.0)")
    parser.add_argument("--output", default="output/eval", help="folder for the results (default output/eval)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto (default): CUDA with bf16 autocast when available")
    parser.add_argument("--limit", type=_whole, help="evaluate this many images, spread evenly over the classes")
    parser.add_argument("--batch-size", type=_whole, default=64, help="default 64")
    parser.add_argument("--workers", type=partial(_whole, least=0), default=4,
                        help="data loader processes (default 4; 0 loads here)")
    args = parser.parse_args(argv)
    if not args.checkpoint and not args.model:
        parser.error("pass --checkpoint PATH ... and/or --model NAME ...")
    if args.train_size is not None and not args.model:
        parser.error("--train-size goes with --model: a --checkpoint is rebuilt at the size its run trained at")
    if args.model_kwargs and not args.model:
        parser.error("--model-kwargs goes with --model: a --checkpoint is rebuilt with the model_kwargs its run saved")
    weights = args.pretrained_file or [None] * len(args.model)
    if len(weights) != len(args.model):
        parser.error(f"--pretrained-file takes one file per --model: got {len(weights)} for {len(args.model)}")
    kwargs = dict(args.model_kwargs)
    probes = tuple(dict.fromkeys(args.probe or ["head"]))
    if "head" not in probes:  # a backbone: its classifier, if its weights have one, is not read
        kwargs.setdefault("num_classes", 0)
    try:
        check_options(args.policy or (), args.crop_pct, args.seq_lens)
        for flag, users in PROBE_FLAGS.items():  # a probe's setting without that probe would be silently ignored
            if getattr(args, flag[2:].replace("-", "_")) is not None and not set(users) & set(probes):
                raise UserError(f"{flag} sets the {' or '.join(users)} probe, which this run does not evaluate "
                                f"(--probe {' '.join(probes)}): add --probe {users[0]}, or drop {flag}")
        given = {"k": args.knn_k, "temperature": args.knn_temperature, "bank_size": args.bank_size,
                 "linear_size": args.linear_size, "train_limit": args.train_limit}
        options = ProbeOptions(probes, **{key: value for key, value in given.items() if value is not None})
        check_output_dir(args.output, "--output")
        for name in args.model:  # every typo before the advice about any model's weights
            check_model_name(name)
        for name, file in zip(args.model, weights, strict=True):
            check_weights(name, file, kwargs, args.random_init, "evaluate")
        unloaded = [name for name, file in zip(args.model, weights, strict=True)
                    if file is None and not kwargs.get("pretrained")]
        if args.device != "cuda":  # loader workers need cores of their own, or every thread stalls
            set_cpu_threads(0, args.workers)
        models = [load_trained(path, not args.no_ema) for path in args.checkpoint]
        dataset = choose_setting(args.dataset, models, "dataset", None)
        data_dir = data_root(args.data_dir, dataset, models)
        split = choose_setting(args.split, models)
        keys = {key: choose_setting(getattr(args, key), models, key, None) for key in ("input_key", "target_key")}
        # the --model classifiers' size; checkpoints carry theirs, and evaluate_models reads the split anyway
        num_classes = len(find_split(data_dir, dataset, split, split_key="--split", **keys)[1]) if args.model else 0
        models += [load_pretrained(name, file, num_classes, args.train_size, kwargs)
                   for name, file in zip(args.model, weights, strict=True)]
        labels = [entry.label for entry in models]
        repeated = next((label for label in labels if labels.count(label) > 1), None)
        if repeated:
            raise UserError(f"{repeated} is given twice, and its rows would merge in the reports: name each "
                            "checkpoint or --model / --pretrained-file pair once")
        sizes = args.img_sizes or ([] if args.seq_lens else sorted({entry.train_size for entry in models}))
        check_sizes(sizes, models, args.policy or (), args.seq_lens)
        text = "; ".join([protocol(args.crop_pct)] * bool(sizes) + [naflex.PROTOCOL] * bool(args.seq_lens))
        print(f"protocol: {text}; sizes {sizes}; " + (f"budgets {args.seq_lens}; " if args.seq_lens else "")
              + split_label(data_dir, dataset, split) + (f", {args.limit} images evenly spread" if args.limit else ""),
              flush=True)
        print("\n".join(f"  {entry.label}: trained at {entry.train_size} px" for entry in models), flush=True)
        if unloaded:
            print(f"warning: {', '.join(unloaded)} evaluated with random weights (--random-init): chance accuracy, "
                  "labelled 'random init'", flush=True)
        if options.pooled:  # the checkpoints' train split, asked only of the probes
            options = replace(options, train_split=choose_setting(args.train_split, models, "train_split", "train"))
            print(f"probes: {', '.join(probes)} built from {split_label(data_dir, dataset, options.train_split)}"
                  + (f", {args.train_limit} images evenly spread" if args.train_limit else ""), flush=True)
        with flushed_subnormals():
            results = evaluate_models(models, data_dir, sizes, args.policy, args.crop_pct, args.device, args.limit,
                                      args.batch_size, args.workers, split, args.seq_lens, args.window_size,
                                      args.pad_windows, dataset=dataset, probes=options, **keys)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(write_reports(results, Path(args.output), text))
    return 0
