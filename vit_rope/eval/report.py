"""Reports of a multi-resolution evaluation: ``results.json``, a Markdown table and an accuracy-vs-size plot; token
budgets are plotted at ``sqrt(L * h * w)`` px, beside the square size of as many tokens. matplotlib is optional."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METRICS = {"top1": ("top-1 (%)", "{:.2f}"), "top5": ("top-5 (%)", "{:.2f}"), "images_per_s": ("images/s", "{:.1f}")}


def column_of(result: dict[str, Any]) -> tuple[str, int]:
    """A result's column in the tables and seed merging: ``("px", side)``, or ``("tokens", L)`` for a budget."""
    return ("tokens", result["seq_len"]) if result.get("seq_len") else ("px", result["img_size"])


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


def _probed(results: Sequence[dict[str, Any]]) -> bool:
    """Whether a result is of a probe other than the head: the probe is then named in the table and legend."""
    return any(result.get("probe", "head") != "head" for result in results)


def _rows(results: Sequence[dict[str, Any]]
          ) -> dict[tuple[str, str | None, str], dict[tuple[str, int], dict[str, Any]]]:
    rows: dict[tuple[str, str | None, str], dict[tuple[str, int], dict[str, Any]]] = {}
    for row in results:
        rows.setdefault((row["model"], row["policy"], row.get("probe", "head")), {})[column_of(row)] = row
    return rows


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table from a header and rows of cells, each cell already formatted (``str`` of anything else)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def markdown_table(results: Sequence[dict[str, Any]], metric: str = "top1") -> str:
    """One row per model x policy x probe, a column per size then budget; training sizes starred, a row's own bold."""
    fmt, probed = METRICS[metric][1], _probed(results)
    columns = sorted({column_of(result) for result in results})
    trained = {column_of(result) for result in results if _as_trained(result)}
    header = ["model", "policy", *(["probe"] * probed)] + [(f"{size} tokens" if kind == "tokens" else str(size))
                                                           + ("*" if (kind, size) in trained else "")
                                                           for kind, size in columns]
    lines = []
    for (model, policy, probe), by_column in _rows(results).items():
        cells = []
        for column in columns:
            result = by_column.get(column)
            text = fmt.format(result[metric]) if result else ""
            if result and f"{metric}_min" in result and result["seeds"] > 1:  # merged seeds: mean ± half the range
                text += f" ± {(result[f'{metric}_max'] - result[f'{metric}_min']) / 2:.1f}"
            cells.append(f"**{text}**" if result and _as_trained(result) else text)
        lines.append([model, policy or "-", *([probe] * probed), *cells])
    return table(header, lines)


def _draw(ax: Any, results: Sequence[dict[str, Any]], colors: dict[str, Any] | None = None,
          names: dict[str, str] | None = None) -> None:
    """Top-1 against size on ``ax``, one line per model (x policy) and protocol (token budgets dashed)."""
    for train_size in sorted({result["train_size"] for result in results}):
        ax.axvline(train_size, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"train {train_size}", (train_size, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 3), textcoords="offset points", color="grey", fontsize=8)
    probed = _probed(results)
    for (model, policy, probe), by_column in _rows(results).items():
        for kind in sorted({column[0] for column in by_column}):  # px, then tokens
            rows = [by_column[column] for column in sorted(by_column) if column[0] == kind]
            spread = [[row["top1"] - row["top1_min"] for row in rows],
                      [row["top1_max"] - row["top1"] for row in rows]] if "top1_min" in rows[0] else None  # seeds
            notes = ", ".join(note for note in (policy, probe if probed else None,
                                                "tokens" if kind == "tokens" else None) if note)
            name = (names or {}).get(model, model)  # "": one model, named in the title, its lines by their notes
            label = (f"{name} [{notes}]" if notes else name) if name else notes or model
            ax.errorbar([_x(row) for row in rows], [row["top1"] for row in rows], yerr=spread, capsize=3,
                        marker="s" if kind == "tokens" else "o", linestyle="--" if kind == "tokens" else "-",
                        color=(colors or {}).get(model), label=label)
    ticks = sorted({round(_x(result)) for result in results})
    budgets = any(result.get("seq_len") for result in results)
    ax.set(xticks=ticks, xticklabels=[str(tick) for tick in ticks], ylabel="top-1 (%)",
           xlabel="input size (px)" + ("; dashed: token budget L at sqrt(L) x patch px" if budgets else ""))
    ax.grid(alpha=0.3)


def figure(size: tuple[float, float], layout: str = "constrained") -> Any:
    """A Figure on the Agg canvas (no global backend switched), or None, after a warning, without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("warning: matplotlib is not installed, skipping the plot; pip install 'vit-rope[plot]' for it")
        return None
    return Figure(figsize=size, layout=layout)


def short_names(models: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """The model name every label shares (None if they differ), for the title, and each label's legend name: its
    checkpoint path cut to the folders and file that differ (``demo`` for best.pth of several runs)."""
    splits = [label.rsplit(" (", 1) for label in models]
    if len(models) < 2 or not all(len(split) == 2 and "/" in split[1] for split in splits):
        return None, {label: label for label in models}
    parts = [split[1].rstrip(")").split("/") for split in splits]
    front = len(os.path.commonprefix(parts))  # the folders all share, then the trailing ones
    back = len(os.path.commonprefix([path[front:][::-1] for path in parts]))
    paths = ["/".join(path[front:len(path) - back]) for path in parts]
    if not all(paths) or len(set(paths)) < len(paths):
        paths = [split[1].rstrip(")") for split in splits]
    heads = {split[0] for split in splits}
    common = heads.pop() if len(heads) == 1 else None
    return common, {label: path if common else f"{split[0]} ({path})"
                    for label, split, path in zip(models, splits, paths, strict=True)}


def _covers_a_curve(ax: Any, legend: Any) -> bool:
    """Whether the drawn ``legend`` lies over a line of ``ax`` (points, segments, seed ranges) or an annotation."""
    box = legend.get_window_extent().padded(2)
    for container in ax.containers:  # one errorbar per line: its data line, then its caps
        for line in [container.lines[0], *container.lines[1]]:
            points = ax.transData.transform(line.get_xydata())
            between = [start + (end - start) * step / 20  # the segments, sampled every 1/20
                       for start, end in zip(points[:-1], points[1:], strict=True) for step in range(1, 20)]
            if any(box.contains(*point) for point in [*points, *between]):
                return True
    return any(box.overlaps(text.get_window_extent()) for text in ax.texts)


def accuracy_figure(results: Sequence[dict[str, Any]], title: str = "Accuracy against resolution") -> Any:
    """Top-1 against size as a matplotlib Figure (None without matplotlib), lines named by what tells them apart; the
    legend inside the axes where it covers no line, else outside."""
    fig = figure((7, 4.5))
    if fig is None:
        return None
    ax = fig.add_subplot()
    models = list(dict.fromkeys(result["model"] for result in results))
    common, names = (models[0], {models[0]: ""}) if len(models) == 1 else short_names(models)
    _draw(ax, results, _palette(models) if len(models) > 10 else None, names)  # past 10 lines the colours repeat
    fig.suptitle(title)
    if common:
        ax.set_title(common, fontsize=9)
    named = {"policy": any(result["policy"] for result in results), "probe": _probed(results)}  # one model's lines
    heading = ", ".join(name for name, shown in named.items() if shown and len(models) == 1) or None
    legend = ax.legend(fontsize=7, title=heading, title_fontsize=7)
    fig.draw_without_rendering()
    if _covers_a_curve(ax, legend):
        legend.remove()
        fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=7, title=heading,
                   title_fontsize=7)
    return fig


def probe_panels(results: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The results by probe, each model x policy renamed to one line of one colour in every panel."""
    _, names = short_names(list(dict.fromkeys(result["model"] for result in results)))
    panels: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        line = names[result["model"]] + (f", {result['policy']}" if result["policy"] else "")
        panels.setdefault(result.get("probe", "head"), []).append({**result, "model": line, "policy": None})
    return panels


def plot(results: Sequence[dict[str, Any]], path: Path, title: str = "Accuracy against resolution") -> bool:
    """``accuracy_figure`` saved to ``path``, or one panel per probe; False without matplotlib."""
    if _probed(results):
        return plot_panels(probe_panels(results), path, title)
    fig = accuracy_figure(results, title)
    if fig is None:
        return False
    fig.savefig(path, dpi=120)
    return True


def _palette(models: Sequence[str]) -> dict[str, Any]:
    """A colour per model: tab20's 10 dark hues first, then their light pairs, so that neighbours differ."""
    from matplotlib import colormaps

    return {model: colormaps["tab20"]((2 * i) % 20 + (2 * i // 20) % 2) for i, model in enumerate(models)}


def plot_panels(panels: dict[str, Sequence[dict[str, Any]]], path: Path, title: str) -> bool:
    """One panel per key (e.g. a policy), each model in one colour in all, one legend; False without matplotlib."""
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig = figure((max(4.2 * columns, 7.0), 3.4 * rows + 1.2))  # one panel as wide as a plot, for the legend
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
    ncols = 3 if max(map(len, handles), default=0) < 50 else 1  # long names one to a line, or they run off the figure
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=ncols, fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return True


def write_reports(results: Sequence[dict[str, Any]], output: Path, protocol: str) -> str:
    """Write the reports into ``output``; returns the top-1 table and the paths written, for the console."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps({"protocol": protocol, "results": list(results)}, indent=2))
    tables = "\n\n".join(f"## {METRICS[metric][0]}\n\n{markdown_table(results, metric)}" for metric in METRICS)
    note = "`*` training size; **bold**: the value at the row's own training size."
    if _probed(results):
        note += (" `probe`: head is the model's classifier; knn DINO's weighted kNN on the pooled features against the "
                 "train split's (`knn_k`, `knn_temperature`; at the same size, or `bank_size`); linear a linear "
                 "classifier fitted on the train split's features at one size (`linear_size`), evaluated at every "
                 "size.")
    if any(result.get("seq_len") for result in results):
        note += (" `L tokens`: a token budget, each image resized keeping its aspect ratio to at most L patches (`*`: "
                 "the training size's token count); plain numbers are square sizes in px.")
    (output / "results.md").write_text(f"# Accuracy against resolution\n\nProtocol: {protocol}.\n\n{note}\n\n"
                                       f"{tables}\n")
    written = ["results.json", "results.md"]
    if plot(results, output / "accuracy_vs_resolution.png"):
        written.append("accuracy_vs_resolution.png")
    return f"top-1 (%):\n{markdown_table(results)}\n\nwrote {', '.join(str(output / name) for name in written)}"
