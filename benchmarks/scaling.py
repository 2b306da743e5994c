"""How each position encoding's cost grows with image size: ViT-S seconds and peak memory against RoPE-Axial, on CPU.

    python benchmarks/scaling.py --json results/performance/scaling_cpu_vit_s.json \
        --plot results/performance/scaling_cpu_vit_s.png
    python benchmarks/scaling.py --kinds lookhere --img-sizes 224 448 --train-sizes 448 --rounds 1
    python benchmarks/scaling.py --smoke                              # a tiny run (the test's), under a minute
    python benchmarks/scaling.py --kinds fire fire@autograd fire@checkpoint --img-sizes --train-sizes 448 --threads 1

Inference (batch ``--batch``, ``torch.inference_mode()``, eval()) runs at every ``--img-sizes`` entry, training (a
cross-entropy's forward and backward, train(), batch ``--train-batch``) at every ``--train-sizes`` entry. Each model
lives in its own worker process, built once, so that one kind's large allocations cannot pollute another's figure; a
failed step is reported in its row, and a worker that dies is started again for the next request. ``KIND@FORM``, a
bias kind, trains without ``offset_attention``'s autograd Function (``without_function``). Memory is the peak resident
memory of a step above what the worker held just before it (freed heap trimmed): Linux's VmHWM, reset
through /proc/self/clear_refs, minus VmRSS. Each round runs every (mode, size) with the models in a new random order
(seeded), one warm-up step (at ``WARM`` px at most) then ``--steps`` timed ones; a model's figure is the median over
rounds, its ratio to axial the median of the per-round ratios (paired within a round). ``TARGETS``: the largest
ratios to axial (PASS / MISS).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import vit_rope  # noqa: E402,F401  (registers the vit_rope_* models)
from benchmarks.throughput import LIBC, against, paired_ratio, peak_bytes, setup_machine  # noqa: E402
from vit_rope.eval import report  # noqa: E402

KINDS = ["ape", "axial", "mixed", "golden", "string", "dinov3", "lookhere", "alibi", "pape", "pape_ri", "comrope_ap",
         "comrope_ld", "liere", "fire"]
BASELINE = "axial"
# (mode, img size, ratio to axial: "time" or "memory", largest ratio allowed)
TARGETS = [("infer", 1344, "time", 1.3), ("infer", 1344, "memory", 2.0), ("infer", 2048, "time", 1.5),
           ("train", 896, "time", 1.5), ("train", 896, "memory", 1.5)]
# axial and timm's APE: two worker processes, forked from one fork server; another kind of ours against axial runs in
# make gpu-check's tiny CPU run (--kinds lookhere)
SMOKE = {"kinds": ["ape"], "img_sizes": [32], "train_sizes": [32], "train_batch": 2, "rounds": 1}

def model_name(kind: str) -> str:
    """timm's APE DeiT-III for ``ape``; ours otherwise (DINOv3's registered without the size, as it has no 224)."""
    kind = kind.partition("@")[0]
    if kind == "ape":
        return "deit3_small_patch16_224"
    name = f"vit_rope_small_patch16_{kind}_224"
    return name if timm.is_model(name) or not timm.is_model(name[:-4]) else name[:-4]


WARM = 448  # px: the warm-up step's size at most. Above it the timed step is the first at its size for every kind
# alike (a kind's tables kept per size are built in it: what a new size costs), and the large rows take half the time


def _measure(model: nn.Module, mode: str, size: int, batch: int, steps: int, device: str = "cpu",
             amp: bool = False) -> dict[str, float]:
    """One warm-up (at ``WARM`` px at most) then ``steps`` timed steps of ``mode`` at ``size``: median seconds, largest
    peak MiB above start (on CUDA: the allocator's peak above what it held)."""
    cuda = device.startswith("cuda")
    model.to(device).train(mode == "train")  # STRING folds its basis into qkv in eval(), once, in the warm-up
    labels = torch.zeros(batch, dtype=torch.long, device=device)

    def step(images: Tensor) -> None:
        with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=amp):
            if mode == "infer":
                with torch.inference_mode():
                    model(images)
            else:
                nn.functional.cross_entropy(model(images), labels).backward()
                model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)

    step(torch.randn(batch, 3, min(size, WARM), min(size, WARM), device=device))
    images = torch.randn(batch, 3, size, size, device=device)
    seconds, mib = [], []

    def timed(images: Tensor) -> None:
        start = time.perf_counter()
        step(images)
        seconds.append(time.perf_counter() - start)

    for _ in range(steps):
        mib.append(peak_bytes(functools.partial(timed, images), torch.device(device)) / 2**20)
    del images
    gc.collect()
    if LIBC is not None:  # an idle worker hands its freed heap back: 14 of them after 896 px training fill 24 GB
        LIBC.malloc_trim(0)
    return {"seconds": statistics.median(seconds), "mib": max(mib)}


def without_function(form: str) -> None:
    """The bias kinds' attention in training by plain autograd in place of ``offset_attention._OffsetAttention``: SDPA
    per chunk of rows, its mask a differentiable copy out of the table; ``checkpoint``: each chunk recomputed in
    backward (``torch.utils.checkpoint``), ``autograd``: each chunk's mask and scores kept."""
    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    from vit_rope.encodings.bias import offset_attention as oa

    def chunk(q: Tensor, k: Tensor, v: Tensor, flipped: Tensor, grid: tuple[int, int], prefix: int, scale: float,
              start: int, stop: int) -> Tensor:
        mask, (h, w) = None, grid
        if stop > prefix:  # [1, nh, Q, P + N]
            view = oa._table_view(flipped, grid)[:, (start - prefix) // w: (stop - prefix) // w]
            mask = F.pad(view.reshape(flipped.shape[0], stop - start, h * w), (prefix, 0))[None].to(q.dtype)
        return F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=mask, scale=scale)

    def apply(q: Tensor, k: Tensor, v: Tensor, flipped: Tensor, grid: tuple[int, int], prefix: int,
              scale: float) -> Tensor:
        B, nh, N, _ = k.shape
        chunks = (oa._chunks(grid, prefix, N * B * nh, elements=oa.SCORE_ELEMENTS) if flipped.requires_grad else
                  oa._chunks(grid, prefix, N * nh, oa.FLASH_QUERIES))
        run = functools.partial(checkpoint, chunk, use_reentrant=False) if form == "checkpoint" else chunk
        return torch.cat([run(q, k, v, flipped, grid, prefix, scale, a, b) for a, b in chunks], dim=2)

    oa._OffsetAttention = type("Plain", (), {"apply": staticmethod(apply)})


def _serve(name: str, threads: int | None, conn: Any, plain: str | None = None) -> None:
    """Worker: build ``name`` once, then answer (mode, size, batch, steps) requests until ``None``; ``plain``: a bias
    kind's training without its autograd Function (``without_function``)."""
    if plain:
        without_function(plain)
    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as train.py and vit_rope.evaluate run (PaPE's subnormals)
    try:
        torch.manual_seed(0)
        model, broken = timm.create_model(name, num_classes=1000, dynamic_img_size=True), None
    except Exception as err:
        broken = {"error": f"build: {type(err).__name__}: {err}"}
    conn.send({"ready": True})
    while (request := conn.recv()) is not None:
        try:
            conn.send(broken or _measure(model, *request))
        except Exception as err:  # MemoryError, RuntimeError (allocation), ...: reported, the worker lives on
            gc.collect()
            conn.send({"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"})


class Worker:
    """A process holding one model: ``ask`` returns its answer, or an error where it died or ran past ``timeout``
    seconds (then it is started again on the next request)."""

    def __init__(self, name: str, threads: int | None, timeout: float, plain: str | None = None) -> None:
        self.name, self.threads, self.timeout, self.plain, self.proc = name, threads, timeout, plain, None

    def start(self) -> None:
        """A process forked from multiprocessing's fork server, a new interpreter that imports torch, timm and
        vit_rope once for every worker (each imported them itself under ``spawn``: seconds of a tiny run each) and
        initialises no device, so that a worker's CUDA is its own."""
        server = mp.get_context("forkserver")
        server.set_forkserver_preload(["torch", "timm", "vit_rope"])
        self.conn, child = server.Pipe()
        self.proc = server.Process(target=_serve, args=(self.name, self.threads, child, self.plain), daemon=True)
        self.proc.start()
        child.close()  # the parent's copy: with it closed, a dead worker reads as EOF

    def ask(self, request: tuple | None) -> dict[str, Any]:
        """The answer to ``request`` (``None``: wait until the worker has built its model)."""
        if self.proc is None:
            self.start()
            if "error" in (ready := self.ask(None)):  # died while starting
                return ready
        deadline = time.monotonic() + self.timeout
        with contextlib.suppress(EOFError, OSError):
            if request is not None:
                self.conn.send(request)
            while not self.conn.poll(0.5):
                if not self.proc.is_alive() or time.monotonic() > deadline:
                    raise EOFError
            return self.conn.recv()
        late = time.monotonic() > deadline
        self.proc.kill()  # dead already, or hung
        self.proc.join()
        code, self.proc = self.proc.exitcode, None
        return {"error": f"worker {'past --timeout' if late else 'died'} (exit code {code}"
                         f"{', out of memory?' if code == -9 and not late else ''})"}

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(10)
            self.proc.kill()


def summarise(kind: str, mode: str, size: int, batch: int, results: list[dict], base: list[dict]) -> dict[str, Any]:
    """A row from a model's per-round results and axial's: medians, paired ratios, errors and targets."""
    ok, errors = [r for r in results if "error" not in r], sorted({r["error"] for r in results if "error" in r})
    pairs = [(r, b) for r, b in zip(results, base, strict=True) if "error" not in r and "error" not in b]

    def ratio(key: str) -> float | None:  # memory at least 1 KiB, the resolution of /proc/self/status
        return paired_ratio(*([max(x[key], 1 / 1024) for x in side] for side in zip(*pairs, strict=True))) \
            if pairs else None

    row = {"kind": kind, "model": model_name(kind), "mode": mode, "img_size": size, "batch_size": batch,
           "tokens": (size // 16) ** 2, "failed": bool(errors), "error": "; ".join(errors) or None,
           **{key: statistics.median(r[key] for r in ok) if ok else None for key in ("seconds", "mib")},
           "time_ratio": ratio("seconds"), "memory_ratio": ratio("mib"), "rounds": results}
    checks = [{"metric": metric, **against(row[f"{metric}_ratio"] or float("inf"), most, at_most=True)}
              for on_mode, on_size, metric, most in TARGETS if (on_mode, on_size) == (mode, size) and kind != BASELINE]
    if checks:  # a run that failed misses its targets
        row.update(target=", ".join(f"{c['metric']} <= {c['target']}" for c in checks), checks=checks,
                   **{"pass": not row["failed"] and all(c["pass"] for c in checks)})
    return row


def benchmark(args: argparse.Namespace, save: Callable[[list[dict]], None]) -> list[dict]:
    """Every round: each (mode, size) with the models in a new order; ``save`` gets the rows after each round."""
    kinds = [BASELINE] + [kind for kind in args.kinds if kind != BASELINE]
    for kind in [kind for kind in kinds if not timm.is_model(model_name(kind))]:
        print(f"skip {kind}: {model_name(kind)} is not registered", flush=True)
        kinds.remove(kind)
    workers = {kind: Worker(model_name(kind), args.threads, args.timeout, kind.partition("@")[2] or None)
               for kind in kinds}
    for worker in workers.values():  # all start (import, build) together, and all are ready before the first step
        worker.start()
    for worker in workers.values():
        worker.ask(None)
    settings = [*(("infer", size, args.batch) for size in args.img_sizes),
                *(("train", size, args.train_batch) for size in args.train_sizes)]
    results: dict[tuple, list[dict]] = {(kind, mode, size): [] for kind in kinds for mode, size, _ in settings}
    order = random.Random(args.seed)

    def rows() -> list[dict]:
        return [summarise(kind, mode, size, batch, results[kind, mode, size], results[BASELINE, mode, size])
                for mode, size, batch in settings for kind in kinds]

    try:
        for round_ in range(args.rounds):
            for mode, size, batch in settings:
                for kind in order.sample(kinds, len(kinds)):
                    result = workers[kind].ask((mode, size, batch, args.steps, args.device, args.amp))
                    results[kind, mode, size].append(result)
                    shown = result.get("error") or f"{result['seconds']:.3f} s, {result['mib']:.0f} MiB"
                    print(f"round {round_ + 1} {mode} {size} px {kind}: {shown}", flush=True)
            save(rows())
    finally:
        for worker in workers.values():
            worker.close()
    return rows()


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table: seconds, MiB, ratios to axial, targets and PASS / MISS, errors."""
    def num(value: float | None, fmt: str) -> str:
        return "" if value is None else format(value, fmt)
    return report.table(
        "kind mode size batch seconds MiB time/axial memory/axial target result error".split(),
        [(r["kind"], r["mode"], r["img_size"], r["batch_size"], num(r["seconds"], ".3f"), num(r["mib"], ".1f"),
          num(r["time_ratio"], ".3f"), num(r["memory_ratio"], ".3f"), r.get("target", ""),
          {True: "PASS", False: "MISS", None: ""}[r.get("pass")], r["error"] or "") for r in rows])


def plot(rows: list[dict], path: Path) -> bool:
    """Log-log inference seconds and MiB against patch tokens, a line per kind; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        points = [r for r in rows if r["kind"] == kind and r["mode"] == "infer" and not r["failed"]]
        for ax, key in zip(axes, ("seconds", "mib"), strict=True):
            ax.plot([r["tokens"] for r in points], [max(r[key], 1e-3) for r in points], marker="o", label=kind)
    for ax, label in zip(axes, ("seconds per forward", "peak MiB above the weights"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="patch tokens N = (size / 16)^2", ylabel=label,
               title=f"ViT-S inference, batch {rows[0]['batch_size']}: {label}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def shown(path: str) -> str:
    """A path as saved: relative to the repository when inside it, else its file name (no machine paths)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else resolved.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=KINDS,
                        help="encodings (ape: timm's DeiT-III; KIND@autograd or KIND@checkpoint: a bias kind without "
                             "its autograd Function); axial always")
    parser.add_argument("--img-sizes", type=int, nargs="*", default=[224, 448, 896, 1344, 2048])
    parser.add_argument("--train-sizes", type=int, nargs="*", default=[448, 896])
    parser.add_argument("--batch", type=int, default=1, help="inference batch")
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per model per round, after one warm-up")
    parser.add_argument("--threads", type=int, help="torch CPU threads in the workers (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--seed", type=int, default=0, help="seeds the rounds' orders")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a step may take (then: failed)")
    parser.add_argument("--json", help="write the rows, targets and machine to this file")
    parser.add_argument("--plot", help="write a PNG of inference seconds and memory against tokens")
    parser.add_argument("--smoke", action="store_true", help=f"tiny settings for a test: {SMOKE}")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if args.smoke:
        vars(args).update(SMOKE)
    if any(size % 16 for size in args.img_sizes + args.train_sizes):
        parser.error("every size must be a multiple of 16 (whole patches)")
    machine = setup_machine(None, batch=args.batch, train_batch=args.train_batch, rounds=args.rounds, steps=args.steps,
                            worker_threads=args.threads or "torch's default", subnormals_flushed=True,
                            device=args.device, amp=args.amp)
    command = (shown(arg) if arg in (args.json, args.plot) else arg for arg in raw)  # no machine paths
    machine["command"] = " ".join(["python benchmarks/scaling.py", *command])
    print(f"# {machine}", flush=True)
    targets = [dict(zip(("mode", "img_size", "metric", "target"), t, strict=True)) | {"sense": "<="} for t in TARGETS]

    def save(rows: list[dict], complete: bool = False, plotted: bool = False) -> None:
        if args.json:  # after every round, so that a stopped run keeps the rounds it finished
            result = {"machine": machine, "complete": complete, "targets": targets,
                      "plot": shown(args.plot) if plotted else None, "rows": rows}
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    rows = benchmark(args, save)
    print("\n" + table(rows))
    save(rows, complete=True, plotted=plot(rows, Path(args.plot)) if args.plot else False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
