"""Reports of a multi-resolution evaluation: ``results.json``, a Markdown table and an accuracy-vs-size plot.

The input is ``vit_rope.eval.harness.evaluate_models``'s list, one dict per (model, size, policy): a square size
(``img_size``) or a token budget (``seq_len``, ``vit_rope.eval.naflex``). Budgets get columns of their own, labelled
``L tokens``, and are plotted dashed at ``sqrt(L * h * w)`` px for (h, w) patches, the side of the square image of L
patches: the x axis stays the input side in px, and a budget lines up with the square size of the same token count
(196 tokens of 16 px patches at 224 px). matplotlib is optional (the ``plot`` extra): without it only the plot is
skipped, with a one-line warning.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METRICS = {"top1": ("top-1 (%)", "{:.2f}"), "top5": ("top-5 (%)", "{:.2f}"), "images_per_s": ("images/s", "{:.1f}")}


def _column(result: dict[str, Any]) -> tuple[str, int]:
    """A result's column: ``("px", side)`` for a square size, ``("tokens", L)`` for a token budget (squares first)."""
    return ("tokens", result["seq_len"]) if result.get("seq_len") else ("px", result["img_size"])


def _header(column: tuple[str, int]) -> str:
    return f"{column[1]} tokens" if column[0] == "tokens" else str(column[1])


def _as_trained(result: dict[str, Any]) -> bool:
    """Whether a result is at its model's training size: that size, or for a budget the token count of that size."""
    if not result.get("seq_len"):
        return result["img_size"] == result["train_size"]
    height, width = result["patch_size"]
    return result["seq_len"] == (result["train_size"] // height) * (result["train_size"] // width)


def _x(result: dict[str, Any]) -> float:
    """Where a result is plotted: its size, or for a budget the side of the square image of as many patches."""
    return math.sqrt(result["seq_len"] * math.prod(result["patch_size"])) if result.get("seq_len") \
        else result["img_size"]


def _rows(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str | None], dict[tuple[str, int], dict[str, Any]]]:
    """Results grouped by (model, policy) row and column, in the order they were evaluated."""
    rows: dict[tuple[str, str | None], dict[tuple[str, int], dict[str, Any]]] = {}
    for result in results:
        rows.setdefault((result["model"], result["policy"]), {})[_column(result)] = result
    return rows


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table from a header and rows of cells, each cell already formatted (``str`` of anything else)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def markdown_table(results: Sequence[dict[str, Any]], metric: str = "top1") -> str:
    """One row per model (x policy), one column per size then per token budget (``L tokens``); the training size
    (for budgets: its token count) is starred in the header and each row's value there is bold (models may differ in
    training size)."""
    fmt = METRICS[metric][1]
    columns = sorted({_column(result) for result in results})
    trained = {_column(result) for result in results if _as_trained(result)}
    header = ["model", "policy"] + [_header(column) + ("*" if column in trained else "") for column in columns]
    lines = []
    for (model, policy), by_column in _rows(results).items():
        cells = []
        for column in columns:
            result = by_column.get(column)
            text = fmt.format(result[metric]) if result else ""
            if result and f"{metric}_min" in result and result["seeds"] > 1:  # merged seeds: mean ± half the range
                text += f" ± {(result[f'{metric}_max'] - result[f'{metric}_min']) / 2:.1f}"
            cells.append(f"**{text}**" if result and _as_trained(result) else text)
        lines.append([model, policy or "-", *cells])
    return table(header, lines)


def _draw(ax: Any, results: Sequence[dict[str, Any]], colors: dict[str, Any] | None = None) -> None:
    """Top-1 against size on ``ax``, one line per model (x policy) and protocol (token budgets dashed, at the side
    of the square image of as many patches), dashed vertical lines at the training sizes; ``colors`` fixes a model's
    colour across panels."""
    for train_size in sorted({result["train_size"] for result in results}):
        ax.axvline(train_size, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"train {train_size}", (train_size, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 3), textcoords="offset points", color="grey", fontsize=8)
    for (model, policy), by_column in _rows(results).items():
        for kind in sorted({column[0] for column in by_column}):  # px, then tokens
            rows = [by_column[column] for column in sorted(by_column) if column[0] == kind]
            spread = [[row["top1"] - row["top1_min"] for row in rows],
                      [row["top1_max"] - row["top1"] for row in rows]] if "top1_min" in rows[0] else None  # seeds
            notes = [note for note in (policy, "tokens" if kind == "tokens" else None) if note]
            ax.errorbar([_x(row) for row in rows], [row["top1"] for row in rows], yerr=spread, capsize=3,
                        marker="s" if kind == "tokens" else "o", linestyle="--" if kind == "tokens" else "-",
                        color=(colors or {}).get(model), label=f"{model} [{', '.join(notes)}]" if notes else model)
    ticks = sorted({round(_x(result)) for result in results})
    budgets = any(result.get("seq_len") for result in results)
    ax.set(xticks=ticks, xticklabels=[str(tick) for tick in ticks], ylabel="top-1 (%)",
           xlabel="input size (px)" + ("; dashed: token budget L at sqrt(L) x patch px" if budgets else ""))
    ax.grid(alpha=0.3)


def _figure(size: tuple[float, float]) -> Any:
    """A matplotlib Figure on the Agg canvas (no global backend is switched), or None, after a warning, when
    matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("warning: matplotlib is not installed, skipping the plot; pip install 'vit-rope[plot]' for it")
        return None
    return Figure(figsize=size, layout="constrained")


def plot(results: Sequence[dict[str, Any]], path: Path, title: str = "Accuracy against resolution") -> bool:
    """Top-1 against size, one line per model (x policy). Returns False when matplotlib is not installed."""
    fig = _figure((7, 4.5))
    if fig is None:
        return False
    ax = fig.add_subplot()
    models = list(dict.fromkeys(result["model"] for result in results))
    _draw(ax, results, _palette(models) if len(models) > 10 else None)  # past 10 lines the default colours repeat
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return True


def _palette(models: Sequence[str]) -> dict[str, Any]:
    """A colour per model: tab20's 10 dark hues first, then their light pairs, so that neighbours differ."""
    from matplotlib import colormaps

    return {model: colormaps["tab20"]((2 * i) % 20 + (2 * i // 20) % 2) for i, model in enumerate(models)}


def plot_panels(panels: dict[str, Sequence[dict[str, Any]]], path: Path, title: str) -> bool:
    """One panel per key (e.g. a resolution policy), each model in the same colour in every panel, one legend.
    Returns False when matplotlib is not installed."""
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig = _figure((4.2 * columns, 3.4 * rows + 1.2))
    if fig is None:
        return False
    colors = _palette(list(dict.fromkeys(row["model"] for results in panels.values() for row in results)))
    axes = fig.subplots(rows, columns, sharey=True, squeeze=False).flatten()
    for ax, (name, results) in zip(axes, panels.items(), strict=False):
        _draw(ax, results, colors)
        ax.set_title(name, fontsize=10)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles = {label.split(" [")[0]: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels(),
                                                                                    strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
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
    if any(result.get("seq_len") for result in results):
        note += (" `L tokens`: a token budget, each image resized keeping its aspect ratio to at most L patches (`*`: "
                 "the training size's token count); plain numbers are square sizes in px.")
    (output / "results.md").write_text(f"# Accuracy against resolution\n\nProtocol: {protocol}.\n\n{note}\n\n"
                                       f"{tables}\n")
    written = ["results.json", "results.md"]
    if plot(results, output / "accuracy_vs_resolution.png"):
        written.append("accuracy_vs_resolution.png")
    return f"top-1 (%):\n{markdown_table(results)}\n\nwrote {', '.join(str(output / name) for name in written)}"


def machine() -> dict[str, Any]:
    """Where figures come from: CPU model, cores, GPU, library versions (triton and CUDA: None where absent) and date
    (saved beside results)."""
    import importlib.util
    import platform

    import timm
    import torch

    triton = importlib.import_module("triton").__version__ if importlib.util.find_spec("triton") else None

    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return {"cpu": names[0] if names else platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "triton": triton, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d")}


def merge_seeds(results: Sequence[dict[str, Any]], group_of: dict[str, str]) -> list[dict[str, Any]]:
    """Results of several seeds of a model merged into one row per (model, policy, size or token budget).

    Args:
        results: ``evaluate_models`` rows.
        group_of: row ``model`` label -> the name its seeds share; rows of other labels are left out.

    Returns:
        Rows with ``top1`` / ``top5`` the mean over seeds, ``top1_min`` / ``top1_max`` their range and ``seeds``.
    """
    groups: dict[tuple[str, str | None, tuple[str, int]], list[dict[str, Any]]] = {}
    for result in results:
        if result["model"] in group_of:
            groups.setdefault((group_of[result["model"]], result["policy"], _column(result)), []).append(result)
    merged = []
    for (model, policy, _), rows in groups.items():
        top1 = [row["top1"] for row in rows]
        budget = {key: rows[0][key] for key in ("seq_len", "patch_size") if rows[0].get("seq_len")}
        merged.append({"model": model, "policy": policy, "img_size": rows[0]["img_size"], **budget,
                       "train_size": rows[0]["train_size"], "top1": sum(top1) / len(top1), "top1_min": min(top1),
                       "top1_max": max(top1), "top5": sum(row["top5"] for row in rows) / len(rows),
                       "seeds": len(rows)})
    return merged


def replace_section(page: Path, begin: str, end: str, body: str) -> bool:
    """Rewrite what lies between the line ``begin`` of ``page`` and the next ``end`` with ``body``; the rest of the
    page is kept as it is. Returns False, and leaves the page alone, when it has no such section."""
    text = page.read_text()
    if begin not in text or end not in text.split(begin, 1)[1]:
        return False
    head, rest = text.split(begin, 1)
    page.write_text(head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1])
    return True
