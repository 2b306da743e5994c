"""The probes' cost (``vit_rope.eval.probes``): feature extraction against the classifier evaluation, and the kNN vote
and the linear fit at Imagenette's scale, in one run.

    python benchmarks/probes.py --json results/performance/probes_cpu.json   # the demo's model at 48-160 px

Extraction: the demo's model (``vit_rope_tiny_patch16_mixed_224``, 6 blocks, random weights: cost, not accuracy) on a
batch of random images at each size: ``model(x)`` (what the classifier evaluation times) against
``model_outputs(..., logits=False)`` (the pooled features the probes read) and both from one pass (``--probe head
knn``), interleaved in every round in a new order; images/s the median over rounds, a ratio the median of per-round
ratios. kNN: DINO's vote of a val split's worth of queries (3,925) against a train split's bank (9,469), 10 classes,
k = 20, on random features of a model's width (``--width``); linear: the L-BFGS fit on the bank. kNN takes the same
time on any features of that shape; the fit stops when converged, and labels that carry no signal, as here, are its
worst case (the most iterations).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# after the path set-up, as the script runs from anywhere:
from benchmarks.machine import describe_machine  # noqa: E402
from benchmarks.throughput import against, interleaved_seconds  # noqa: E402
from vit_rope.eval import report  # noqa: E402
from vit_rope.eval.probes import fit_linear, knn_votes, model_outputs  # noqa: E402

MODEL, KWARGS = "vit_rope_tiny_patch16_mixed_224", {"depth": 6, "num_classes": 10}  # the demo's model
CALLS = {"classifier": (True, False), "features": (False, True), "both": (True, True)}  # (logits, pooled)
EXTRACTION_TARGET = 0.95  # features / classifier images/s, at least: the probes cost the classifier's forward
KNN_TARGET_S, LINEAR_TARGET_S = 2.0, 10.0  # seconds per size at Imagenette's scale, at most


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
    search = []
    for width in args.width:
        g = torch.Generator().manual_seed(width)
        bank, queries = torch.randn(args.bank, width, generator=g), torch.randn(args.queries, width, generator=g)
        labels = torch.randint(0, 10, (args.bank,), generator=g)  # no signal: the fit's worst case
        knn = timed(partial(knn_votes, bank, labels, queries, 10), args.rounds)
        fit = timed(partial(fit_linear, bank, labels, 10), max(1, args.rounds // 3))
        search += [{"width": width, "step": "knn", "seconds": knn, **against(knn, KNN_TARGET_S, at_most=True)},
                   {"width": width, "step": "linear fit", "seconds": fit,
                    **against(fit, LINEAR_TARGET_S, at_most=True)}]
    print(report.table(["size", "call", "images/s"], [[r["img_size"], r["call"], f"{r['images_per_s']:.1f}"]
                                                      for r in rows]))
    print(report.table(["size", "ratio", "value", "target"], [[r["img_size"], r["ratio"], f"{r['value']:.3f}",
                                                                f">= {r['target']}: {'PASS' if r['pass'] else 'MISS'}"]
                                                               for r in ratios]))
    print(report.table(["width", f"{args.bank} bank x {args.queries} queries", "seconds", "target"],
                       [[r["width"], r["step"], f"{r['seconds']:.2f}",
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
