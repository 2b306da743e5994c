"""The probes' cost (``vit_rope.eval.probes``): feature extraction against the classifier evaluation, and the kNN vote
and the linear fit at Imagenette's scale, in one run.

    python benchmarks/probes.py --json results/performance/probes_cpu.json   # the demo's model at 48-160 px
    python benchmarks/probes.py --checkpoint output/demo/last.pth   # kNN and the fit on its Imagenette features too

Extraction: the demo's model (``vit_rope_tiny_patch16_mixed_224``, 6 blocks, random weights: cost, not accuracy) on a
batch of random images at each size: ``model(x)`` (what the classifier evaluation times) against
``model_outputs(..., logits=False)`` (the pooled features the probes read) and both from one pass (``--probe head
knn``), interleaved in every round in a new order; images/s the median over rounds, a ratio the median of per-round
ratios. kNN: DINO's vote of a val split's worth of queries (3,925) against a train split's bank (9,469), 10 classes,
k = 20; linear: the L-BFGS fit on the bank. Both on random features of a model's width (``--width``) and, with
``--checkpoint``, on that model's features of Imagenette's train and val images at ``--real-sizes``, as the harness
extracts them (the fit's time depends on the features: it stops when converged).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import timm
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# after the path set-up, as the script runs from anywhere:
from benchmarks.machine import describe_machine  # noqa: E402
from benchmarks.throughput import against, interleaved_seconds  # noqa: E402
from vit_rope.data.splits import find_split  # noqa: E402
from vit_rope.eval import report  # noqa: E402
from vit_rope.eval.extraction import Runs, forward_split  # noqa: E402
from vit_rope.eval.harness import normalisation, square_setting  # noqa: E402
from vit_rope.eval.loading import load_trained  # noqa: E402
from vit_rope.eval.probes import fit_linear, knn_votes, model_outputs  # noqa: E402

MODEL, KWARGS = "vit_rope_tiny_patch16_mixed_224", {"depth": 6, "num_classes": 10}  # the demo's model
CALLS = {"classifier": (True, False), "features": (False, True), "both": (True, True)}  # (logits, pooled)
EXTRACTION_TARGET = 0.95  # features / classifier images/s, at least: the probes cost the classifier's forward
KNN_TARGET_S, LINEAR_TARGET_S = 2.0, 10.0  # seconds per size at Imagenette's scale, at most


def random_features(bank: int, queries: int, width: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """A bank and queries of random features with random labels: kNN takes the same time on any features of a shape,
    and the fit needs few iterations on them (well conditioned), so real ones are timed too (``--checkpoint``)."""
    g = torch.Generator().manual_seed(width)
    return ((torch.randn(bank, width, generator=g), torch.randint(0, 10, (bank,), generator=g)),
            (torch.randn(queries, width, generator=g), torch.randint(0, 10, (queries,), generator=g)))


@torch.inference_mode()
def real_features(checkpoint: str, data_dir: str, size: int, batch: int) -> tuple[tuple[Tensor, Tensor], ...]:
    """The pooled features and classes of a checkpoint's model on the train and val splits at ``size`` px, as the
    harness extracts them."""
    entry = load_trained(checkpoint)
    runs = Runs([entry], [(0, None)], [normalisation(entry.model.eval(), "cpu")], "cpu", 1, "keep")
    out = []
    for split in ("train", "val"):
        samples, _ = find_split(Path(data_dir), None, split)
        done = forward_split(runs, samples, list(range(len(samples))), square_setting(size, 1.0, [0]), batch, [0],
                             {}, {0})
        out.append((done.features[0], done.targets))
    return tuple(out)


def timed(call: Callable[[], object], rounds: int) -> float:
    """The median seconds of ``call`` over ``rounds`` calls, after one untimed."""
    call()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--img-sizes", nargs="+", type=int, default=[48, 64, 96, 128, 160])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--depth", type=int, default=KWARGS["depth"])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--bank", type=int, default=9469, help="train images in the kNN bank (Imagenette's)")
    parser.add_argument("--queries", type=int, default=3925, help="val images voting (Imagenette's)")
    parser.add_argument("--width", type=int, nargs="+", default=[192, 384], help="feature widths (ViT-Ti, ViT-S)")
    parser.add_argument("--checkpoint", help="also time kNN and the fit on this train.py checkpoint's features")
    parser.add_argument("--data-dir", default="../shared/data/imagenette", help="its train/ and val/ (--checkpoint)")
    parser.add_argument("--real-sizes", type=int, nargs="+", default=[64, 160], help="its feature sizes (px)")
    parser.add_argument("--json", help="also write the results and the machine here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = timm.create_model(MODEL, **{**KWARGS, "depth": args.depth}).eval()
    rows, ratios = [], []
    for size in args.img_sizes:
        x = torch.randn(args.batch_size, 3, size, size)
        with torch.inference_mode():
            calls = {name: partial(model_outputs, model, x, *flags) for name, flags in CALLS.items()}
            for call in calls.values():
                call()  # warm-up
            seconds = interleaved_seconds(calls, args.rounds, torch.device("cpu"))
        for name, values in seconds.items():
            rows.append({"img_size": size, "call": name, "images_per_s": args.batch_size / statistics.median(values)})
        for name in ("features", "both"):
            value = statistics.median(c / f for c, f in zip(seconds["classifier"], seconds[name], strict=True))
            ratios.append({"img_size": size, "ratio": f"{name} / classifier", "value": value,
                           **against(value, EXTRACTION_TARGET)})
    sets = {f"random, width {width}": random_features(args.bank, args.queries, width) for width in args.width}
    sets.update({f"{args.checkpoint}, {size} px": real_features(args.checkpoint, args.data_dir, size, args.batch_size)
                 for size in (args.real_sizes if args.checkpoint else [])})
    search = []
    for name, ((bank, labels), (queries, truth)) in sets.items():
        knn = timed(partial(knn_votes, bank, labels, queries, 10), args.rounds)
        fit = timed(partial(fit_linear, bank, labels, 10), max(1, args.rounds // 3))
        accuracy = {"knn_top1": 100 * (knn_votes(bank, labels, queries, 10).argmax(1) == truth).float().mean().item(),
                    "linear_top1": 100 * (fit_linear(bank, labels, 10)(queries).argmax(1) == truth).float().mean()
                    .item()} if not name.startswith("random") else {}
        search += [{"features": name, "bank": len(bank), "queries": len(queries), "width": bank.shape[1],
                    "step": step, "seconds": value, **against(value, target, at_most=True), **accuracy}
                   for step, value, target in (("knn", knn, KNN_TARGET_S), ("linear fit", fit, LINEAR_TARGET_S))]
    print(report.table(["size", "call", "images/s"], [[r["img_size"], r["call"], f"{r['images_per_s']:.1f}"]
                                                      for r in rows]))
    print(report.table(["size", "ratio", "value", "target"], [[r["img_size"], r["ratio"], f"{r['value']:.3f}",
                                                                f">= {r['target']}: {'PASS' if r['pass'] else 'MISS'}"]
                                                               for r in ratios]))
    print(report.table(["features", "bank x queries", "step", "seconds", "target"],
                       [[r["features"], f"{r['bank']} x {r['queries']}", r["step"], f"{r['seconds']:.2f}",
                         f"<= {r['target']}: {'PASS' if r['pass'] else 'MISS'}"] for r in search]))
    if args.json:
        command = ["python", "benchmarks/probes.py", *(sys.argv[1:] if argv is None else argv)]
        machine = {**describe_machine(), "threads": torch.get_num_threads(), "command": " ".join(command)}
        Path(args.json).write_text(json.dumps({"machine": machine, "model": MODEL, "args": vars(args),
                                               "complete": True, "rows": rows, "ratios": ratios, "probes": search},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
