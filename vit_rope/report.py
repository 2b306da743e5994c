"""Reports of a multi-resolution evaluation: ``results.json``, a Markdown table and an accuracy-vs-size plot.

The input is ``vit_rope.evaluate.evaluate_models``'s list, one dict per (model, size, policy). matplotlib is optional
(the ``plot`` extra): without it only the plot is skipped, with a one-line warning.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS = {"top1": ("top-1 (%)", "{:.2f}"), "top5": ("top-5 (%)", "{:.2f}"), "images_per_s": ("images/s", "{:.1f}")}


def _rows(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str | None], dict[int, dict[str, Any]]]:
    """Results grouped by (model, policy) row and size, in the order they were evaluated."""
    rows: dict[tuple[str, str | None], dict[int, dict[str, Any]]] = {}
    for result in results:
        rows.setdefault((result["model"], result["policy"]), {})[result["img_size"]] = result
    return rows


def markdown_table(results: Sequence[dict[str, Any]], metric: str = "top1") -> str:
    """One row per model (x policy), one column per size; the training size is starred in the header and each
    row's value at its own training size is bold (models may differ in training size)."""
    fmt = METRICS[metric][1]
    sizes = sorted({result["img_size"] for result in results})
    train_sizes = {result["train_size"] for result in results}
    header = ["model", "policy"] + [f"{size}*" if size in train_sizes else str(size) for size in sizes]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for (model, policy), by_size in _rows(results).items():
        cells = []
        for size in sizes:
            result = by_size.get(size)
            text = fmt.format(result[metric]) if result else ""
            if result and f"{metric}_min" in result:  # merged seeds: mean ± half the range
                text += f" ± {(result[f'{metric}_max'] - result[f'{metric}_min']) / 2:.1f}"
            cells.append(f"**{text}**" if result and size == result["train_size"] else text)
        lines.append("| " + " | ".join([model, policy or "-", *cells]) + " |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: Path, title: str = "Accuracy against resolution") -> bool:
    """Top-1 against size, one line per model (x policy), dashed vertical lines at the training sizes.

    Uses matplotlib's object API with the Agg canvas, so no global backend is switched. Returns False, after a
    warning, when matplotlib is not installed.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("warning: matplotlib is not installed, skipping the plot; pip install 'vit-rope[plot]' for it")
        return False
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for train_size in sorted({result["train_size"] for result in results}):
        ax.axvline(train_size, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"train {train_size}", (train_size, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 3), textcoords="offset points", color="grey", fontsize=8)
    for (model, policy), by_size in _rows(results).items():
        sizes = sorted(by_size)
        rows = [by_size[size] for size in sizes]
        spread = [[row["top1"] - row["top1_min"] for row in rows], [row["top1_max"] - row["top1"] for row in rows]] \
            if "top1_min" in rows[0] else None  # merged seeds: bars span the seeds
        ax.errorbar(sizes, [row["top1"] for row in rows], yerr=spread, marker="o", capsize=3,
                    label=model if policy is None else f"{model} [{policy}]")
    ax.set(xticks=sorted({result["img_size"] for result in results}), xlabel="input size (px)", ylabel="top-1 (%)",
           title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return True


def write_reports(results: Sequence[dict[str, Any]], output: Path, protocol: str) -> str:
    """Write ``results.json``, ``results.md`` and ``accuracy_vs_resolution.png`` into ``output``.

    Returns:
        The top-1 table and the paths written, for the console.
    """
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps({"protocol": protocol, "results": list(results)}, indent=2))
    tables = "\n\n".join(f"## {METRICS[metric][0]}\n\n{markdown_table(results, metric)}" for metric in METRICS)
    note = "`*` training size; **bold**: the value at the row's own training size."
    (output / "results.md").write_text(f"# Accuracy against resolution\n\nProtocol: {protocol}.\n\n{note}\n\n"
                                       f"{tables}\n")
    written = ["results.json", "results.md"]
    if plot(results, output / "accuracy_vs_resolution.png"):
        written.append("accuracy_vs_resolution.png")
    return f"top-1 (%):\n{markdown_table(results)}\n\nwrote {', '.join(str(output / name) for name in written)}"


def machine() -> dict[str, Any]:
    """Where figures come from: CPU model, cores, GPU, library versions and date (saved beside results)."""
    import platform

    import timm
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return {"cpu": names[0] if names else platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "date": time.strftime("%Y-%m-%d")}


def merge_seeds(results: Sequence[dict[str, Any]], group_of: dict[str, str]) -> list[dict[str, Any]]:
    """Results of several seeds of a model merged into one row per (model, policy, size).

    Args:
        results: ``evaluate_models`` rows.
        group_of: row ``model`` label -> the name its seeds share; rows of other labels are left out.

    Returns:
        Rows with ``top1`` / ``top5`` the mean over seeds, ``top1_min`` / ``top1_max`` their range and ``seeds``.
    """
    groups: dict[tuple[str, str | None, int], list[dict[str, Any]]] = {}
    for result in results:
        if result["model"] in group_of:
            groups.setdefault((group_of[result["model"]], result["policy"], result["img_size"]), []).append(result)
    merged = []
    for (model, policy, size), rows in groups.items():
        top1 = [row["top1"] for row in rows]
        merged.append({"model": model, "policy": policy, "img_size": size, "train_size": rows[0]["train_size"],
                       "top1": sum(top1) / len(top1), "top1_min": min(top1), "top1_max": max(top1),
                       "top5": sum(row["top5"] for row in rows) / len(rows), "seeds": len(rows)})
    return merged


STUDY_LABELS = {"ape": "APE (timm ViT)", "axial": "RoPE-Axial", "mixed": "RoPE-Mixed", "axial_ape": "RoPE-Axial + APE",
                "mixed_ape": "RoPE-Mixed + APE"}
STUDY_BEGIN = "<!-- study:begin (written by scripts/imagenette_study.py --report from results/imagenette) -->"
STUDY_END = "<!-- study:end -->"


def _training(results_dir: Path, runs: Sequence[dict[str, Any]]) -> str:
    """Per model: final val top-1 at the training size (all val images) over seeds, and minutes per run."""
    lines = ["| model | seeds | final val top-1 (%) | minutes per run |", "|---|---|---|---|"]
    by_model: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        with open(results_dir / "runs" / run["name"] / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        by_model.setdefault(run["model"], []).append((float(rows[-1]["top1"]),
                                                      sum(float(row["seconds"]) for row in rows) / 60))
    for model, values in by_model.items():
        top1 = [value[0] for value in values]
        lines.append(f"| {STUDY_LABELS.get(model, model)} | {len(values)} | {sum(top1) / len(top1):.2f} ± "
                     f"{(max(top1) - min(top1)) / 2:.1f} | {sum(value[1] for value in values) / len(values):.1f} |")
    return "\n".join(lines)


def _changes(merged: Sequence[dict[str, Any]]) -> str:
    """Per model: top-1 change from the training size to the largest size, as trained and under the best policy."""
    largest = max(row["img_size"] for row in merged)
    lines = [f"| model | top-1 at training size | at {largest}, as trained | at {largest}, best policy |",
             "|---|---|---|---|"]
    for model in dict.fromkeys(row["model"] for row in merged):
        rows = [row for row in merged if row["model"] == model]
        trained = next(row for row in rows if row["img_size"] == row["train_size"] and row["policy"] in (None,
                                                                                                      "extrapolate"))
        plain = next(row for row in rows if row["img_size"] == largest and row["policy"] in (None, "extrapolate"))
        best = max((row for row in rows if row["img_size"] == largest), key=lambda row: row["top1"])
        lines.append(f"| {model} | {trained['top1']:.2f} | {plain['top1']:.2f} ({plain['top1'] - trained['top1']:+.1f})"
                     f" | {best['top1']:.2f} ({best['top1'] - trained['top1']:+.1f}, {best['policy'] or '-'}) |")
    return "\n".join(lines)


def write_study(results_dir: Path, readme: Path | None = None) -> str:
    """Seed-merged report of a study folder (``scripts/imagenette_study.py``): ``summary.md``, two plots and,
    given ``readme``, the README's section between the ``STUDY_BEGIN`` and ``STUDY_END`` lines.

    Reads ``eval/results.json`` (one ``vit_rope.evaluate`` run over every checkpoint), ``runs.json`` (name, model,
    seed, output of each training run), ``runs/<name>/metrics.csv``, ``machine.json`` and ``commands.sh``.
    """
    evaluation = json.loads((results_dir / "eval" / "results.json").read_text())
    runs = json.loads((results_dir / "runs.json").read_text())
    machine = json.loads((results_dir / "machine.json").read_text())
    group_of = {row["model"]: STUDY_LABELS.get(run["model"], run["model"]) for row in evaluation["results"]
                for run in runs if f"{run['output']}/last.pth" in row["model"]}
    merged = merge_seeds(evaluation["results"], group_of)
    as_trained = [row for row in merged if row["policy"] in (None, "extrapolate")]
    policies = [row for row in merged if row["policy"] is not None]
    plot(as_trained, results_dir / "summary_as_trained.png", "Positions as trained (mean and range over seeds)")
    plot(policies, results_dir / "summary_policies.png", "RoPE models under each resolution policy")
    seeds = sorted({run["seed"] for run in runs})
    note = ("top-1 (%) on Imagenette val, mean ± half the range over seeds " + ", ".join(map(str, seeds))
            + "; `*` training size. " + evaluation["protocol"] + ".")
    section = "\n\n".join([
        f"{len(runs)} training runs ({len(runs) // len(seeds)} models x {len(seeds)} seeds) on "
        f"{machine['cpu'] or 'CPU'} ({machine['cores']} cores{', ' + machine['gpu'] if machine['gpu'] else ''}), "
        f"torch {machine['torch']}, timm {machine['timm']}, {machine['date']}; evaluation took "
        f"{machine['evaluate_s'] / 60:.0f} min. Commands: `results/imagenette/commands.sh`.",
        "**Training** (final epoch, all val images at the training size):\n\n" + _training(results_dir, runs),
        f"**Positions as trained** (`extrapolate`; APE resampled bicubically). {note}\n\n"
        + markdown_table(as_trained),
        "**Every resolution policy** (RoPE models):\n\n" + markdown_table(policies),
        "**From the training size to the largest size:**\n\n" + _changes(merged),
        "![as trained](results/imagenette/summary_as_trained.png)\n"
        "![policies](results/imagenette/summary_policies.png)",
    ])
    (results_dir / "summary.md").write_text("# Resolution extrapolation on Imagenette\n\n" + section + "\n")
    if readme is not None:
        text = readme.read_text()
        if STUDY_BEGIN not in text or STUDY_END not in text:
            raise ValueError(f"{readme} has no study section to update: add the lines {STUDY_BEGIN!r} and "
                             f"{STUDY_END!r} where it should go")
        head, rest = text.split(STUDY_BEGIN, 1)
        readme.write_text(head + STUDY_BEGIN + "\n" + section + "\n" + STUDY_END + rest.split(STUDY_END, 1)[1])
    return section
