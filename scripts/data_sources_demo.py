"""The demo's training from the same images three ways: the image folder, WebDataset shards written from it, and a
Hugging Face dataset made from it; two seeds each, so that the difference between sources reads against the
difference between seeds.

    python scripts/data_sources_demo.py [--data-dir DIR] [--seeds 0 1] [--out output/sources] [key=value ...]

Writes the shards (``python -m vit_rope.shards``) and the dataset (``datasets``' ``imagefolder``, saved to disk) under
``--out`` unless they are there, trains ``configs/imagenette_cpu.yaml`` once per source and seed through
``train.main`` in this process (finished runs are kept, so a rerun resumes; ``key=value`` overrides go to every run),
then prints the last epoch's top-1 of every run and writes them with each source's mean and seed range to
``results/imagenette/data_sources/summary.json``. About 9 min a run on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train  # noqa: E402  (each run in this process: torch and timm imported once, not once per run)
from vit_rope.data.folders import resolve_data_dir  # noqa: E402
from vit_rope.data.shard_writer import write_shards  # noqa: E402
from vit_rope.eval.report import table  # noqa: E402

CONFIG = "configs/imagenette_cpu.yaml"


def prepare(folder: Path, out: Path) -> dict[str, list[str]]:
    """The shards and the dataset of ``folder`` under ``out`` (made once); each source's train.py settings."""
    shards, dataset = out / "shards", out / "hf"
    if not (shards / "_info.json").exists():
        write_shards(folder, shards, 1000, ["train", "val"])
    if not (dataset / "dataset_dict.json").exists():
        import datasets

        datasets.load_dataset("imagefolder", data_dir=str(folder)).save_to_disk(str(dataset))
    return {"folder": [f"data_dir={folder}"],
            "wds": ["dataset=wds/imagenette", f"data_dir={shards}"],
            "hfds": ["dataset=hfds/imagenette", f"data_dir={dataset}", "val_split=validation"]}


def last_top1(run: Path) -> float | None:
    """The last epoch's top-1 of a finished run, else None."""
    if not (run / "metrics.csv").exists():
        return None
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    epochs = yaml.safe_load((run / "config.yaml").read_text())["epochs"]
    return float(rows[-1]["top1"]) if rows and int(rows[-1]["epoch"]) == epochs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="the image folder (default: as train.py finds it)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--out", type=Path, default=Path("output/sources"))
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "imagenette" / "data_sources")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="train.py overrides for every run")
    args = parser.parse_intermixed_args(argv)
    folder = resolve_data_dir(args.data_dir)
    sources = prepare(folder, args.out)
    top1: dict[str, dict[int, float]] = {name: {} for name in sources}
    for seed in args.seeds:
        for name, settings in sources.items():
            run = args.out / f"{name}_s{seed}"
            if last_top1(run) is None:
                resume = ["--resume", str(run / "last.pth")] if (run / "last.pth").exists() else []
                code = train.main(["-c", str(ROOT / CONFIG), "--output", str(run), f"seed={seed}", *settings,
                                   *args.overrides, *resume])
                if code:  # train.py has said why
                    return code
            top1[name][seed] = last_top1(run)
    summary = {"config": CONFIG, "overrides": args.overrides, "seeds": args.seeds, "top1": top1,
               "mean": {name: statistics.mean(runs.values()) for name, runs in top1.items()},
               "seed_range": {name: max(runs.values()) - min(runs.values()) for name, runs in top1.items()}}
    print(table(["source", *(f"seed {seed}" for seed in args.seeds), "mean", "seed range"],
                [(name, *(f"{top1[name][seed]:.2f}" for seed in args.seeds), f"{summary['mean'][name]:.2f}",
                  f"{summary['seed_range'][name]:.2f}") for name in sources]))
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
