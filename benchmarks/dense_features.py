"""Dense patch features of a DINOv3 backbone at high resolution: time and peak memory, ours against timm's port.

    python benchmarks/dense_features.py                         # ViT-S/16 at 1024 px: 64x64 = 4096 patch tokens
    python benchmarks/dense_features.py --img-size 2048 --weights dinov3_vits16.pth   # a checkpoint (timm or Meta)

What a frozen-backbone user runs (segmentation, depth, matching heads read patch features): ``forward_intermediates``
of the last 4 blocks as ``[B, C, H/16, W/16]`` maps, under ``inference_mode``. Each model runs in its own process (peak
resident memory is per process), the two alternating for ``--rounds`` rounds; a round's time is the median of
``--steps`` calls after a warm-up. Reported: median seconds per image, their ratio, and the peak resident memory of
each process above its resident memory before the first call (the activations of one call, weights excluded).

The peak is given twice. With glibc's default allocator, as a user runs it, freed blocks below its dynamic mmap
threshold (which rises to 32 MiB after the first large free) stay in the heap, so the peak also counts memory the
process no longer uses, and it depends on the order of allocations. With ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB
(an extra process per model and round) every tensor of 1 MiB or more is returned to the system when freed, so the
peak is that of the tensors alive at once, which is what the model's code decides.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import vit_rope  # noqa: E402  (registers the vit_rope_* models)
from benchmarks.machine import describe_machine  # noqa: E402
from vit_rope.eval import report  # noqa: E402

MODELS = {"timm": "vit_small_patch16_dinov3", "vit_rope": "vit_rope_small_patch16_dinov3"}
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}  # glibc: blocks >= 1 MiB are mmapped, returned when freed


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(name: str, img_size: int, steps: int, weights: str | None) -> dict[str, float]:
    """One process: the model's median seconds per call and the peak memory the calls added."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=0).eval()
    if weights and name.startswith("vit_rope"):
        vit_rope.load_weights(model, weights)
    elif weights:
        model.load_state_dict(torch.load(weights, weights_only=True))
    x = torch.randn(1, 3, img_size, img_size)
    before = rss_mib()
    times = []
    with torch.inference_mode():
        for _ in range(steps + 1):  # the first call warms up
            start = time.perf_counter()
            features = model.forward_intermediates(x, indices=4, intermediates_only=True)
            times.append(time.perf_counter() - start)
    assert features[-1].shape[-2:] == (img_size // 16, img_size // 16)
    return {"seconds": statistics.median(times[1:]), "peak_mib": rss_mib() - before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--img-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--weights", help="a DINOv3 ViT-S/16 checkpoint (timm's layout; Meta's for ours only)")
    parser.add_argument("--json", help="also write the results and the machine here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this model in this process
    args = parser.parse_args(argv)
    if args.img_size % 16:
        parser.error(f"--img-size {args.img_size} is not a multiple of the patch size 16: use "
                     f"{max(16, args.img_size // 16 * 16)}")
    if args.one:
        print(json.dumps(measure(args.one, args.img_size, args.steps, args.weights)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {key: [] for key in MODELS}
    for _ in range(args.rounds):
        for key, name in MODELS.items():
            command = [sys.executable, __file__, "--one", name, "--img-size", str(args.img_size), "--steps",
                       str(args.steps), *(["--weights", args.weights] if args.weights else [])]
            timed, fixed = (json.loads(subprocess.run(command, check=True, capture_output=True, text=True,
                                                      env={**os.environ, **env}).stdout.strip().splitlines()[-1])
                            for env in ({}, FIXED_MMAP))
            runs[key].append({**timed, "peak_mib_fixed_mmap": fixed["peak_mib"]})
    rows = {key: {field: statistics.median(r[field] for r in values)
                  for field in ("seconds", "peak_mib", "peak_mib_fixed_mmap")} for key, values in runs.items()}
    ratio = statistics.median(t["seconds"] / o["seconds"] for t, o in zip(runs["timm"], runs["vit_rope"], strict=True))
    tokens = (args.img_size // 16) ** 2
    print(report.table(["model", "tokens", "s / image", "peak MiB over weights", "same, 1 MiB mmap threshold",
                        "speed vs timm"],
                       [[MODELS[key], tokens, f"{row['seconds']:.2f}", f"{row['peak_mib']:.0f}",
                         f"{row['peak_mib_fixed_mmap']:.0f}", f"{ratio:.3f}" if key == "vit_rope" else "1"]
                        for key, row in rows.items()]))
    if args.json:
        machine = {**describe_machine(), "threads": torch.get_num_threads(), "command": " ".join(sys.argv)}
        Path(args.json).write_text(json.dumps({"machine": machine, "img_size": args.img_size, "rows": rows,
                                               "speed_ratio": ratio, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
