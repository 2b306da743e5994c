"""Resolution-extrapolation studies side by side: does RoPE's accuracy as trained hold above the training size on
larger training grids?

RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) reports RoPE-Mixed extrapolating as trained from a 14x14 grid
(224 px, 16 px patches). Each study (``studies.report``) answers for one grid and recipe; this table puts every arm of
every study in one place, by training grid: top-1 at the training size, as trained at the two largest evaluated
sizes, and under the best policy at the largest. It reads the same files as each study's own report, so it is
rebuilt with them and is consistent with them. ``headline`` gives one study in a table for the README's front page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from studies.results import (
    arm_label,
    as_trained_by_arm,
    as_trained_rows,
    begin_marker,
    best_row,
    change,
    counted,
    has_evaluations,
    merged_results,
    replace_section,
    spread,
    trained_policies,
    training_row,
)
from vit_rope.eval.report import markdown_table, table

COMPARE_BEGIN = begin_marker("compare", "from every study's results folder")
COMPARE_END = "<!-- compare:end -->"
HEADLINE_END = "<!-- headline:end -->"
# every arm's saved config is read at each report: libyaml's loader (C) where PyYAML was built with it
FAST_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def patch_size(config: dict[str, Any]) -> int:
    """The patch size of a run's resolved config: ``model_kwargs.patch_size``, else the ``patchN`` of the model
    name (timm's names), else a ``ValueError`` naming the model."""
    size = (config.get("model_kwargs") or {}).get("patch_size")
    if size is None:
        match = re.search(r"patch(\d+)", config["model"])
        if match is None:
            raise ValueError(f"cannot tell the patch size of model {config['model']!r}: set model_kwargs.patch_size")
        size = int(match.group(1))
    return size if isinstance(size, int) else int(size[0])


def _grids(results_dir: Path, runs: list[dict[str, Any]]) -> dict[str, str]:
    """Arm label -> its training grid, ``"hxw"`` patches, from the first run's saved config."""
    grids = {}
    for run in runs:
        if arm_label(run) not in grids:
            text = (results_dir / "runs" / run["name"] / "config.yaml").read_text()
            config = yaml.load(text, Loader=FAST_YAML)
            side = config["img_size"] // patch_size(config)
            grids[arm_label(run)] = f"{side}x{side}"
    return grids


def comparison_rows(name: str, results_dir: Path) -> list[list[Any]]:
    """One table row per arm of the study in ``results_dir`` evaluated so far (none before the first evaluation)."""
    if not has_evaluations(results_dir):
        return []
    runs = json.loads((results_dir / "runs.json").read_text())
    _, merged = merged_results(results_dir / "eval", runs)
    grids, rows = _grids(results_dir, runs), []
    for label, by_size in as_trained_by_arm(merged, trained_policies(runs)).items():
        trained = training_row(by_size)
        if trained is None:  # not evaluated at its training size: nothing to measure a change from
            continue
        base, larger = trained["train_size"], sorted(size for size in by_size if size > trained["train_size"])[-2:]
        changes = ["-"] * (2 - len(larger)) + [change(by_size[size], trained) for size in larger]
        best = "-"
        if larger:
            row = best_row(merged, label, larger[-1])
            best = f"{change(row, trained)}, {row['policy'] or 'as trained'}"
        rows.append([name, grids[label], label, trained["seeds"], spread(trained),
                     " / ".join(f"{size / base:.3g}x" for size in larger) or "-", *changes, best])
    return rows


def comparison(studies: Mapping[str, Path]) -> str:
    """The side-by-side table of ``studies`` (name -> results folder), sorted by training grid, then study."""
    rows = [row for name, folder in studies.items() for row in comparison_rows(name, folder)]
    if not rows:
        return "(no study evaluated yet)"
    rows.sort(key=lambda row: int(row[1].split("x")[0]))  # stable: studies and arms keep their order within a grid
    return table(["study", "grid", "model", "seeds", "top-1 at training size", "larger sizes",
                  "as trained, second largest", "as trained, largest", "best policy at the largest"], rows)


def write_comparison(readme: Path, studies: Mapping[str, Path]) -> bool:
    """Rewrite the section of ``readme`` between ``COMPARE_BEGIN`` and ``COMPARE_END`` with ``comparison(studies)``;
    a page without the section is left alone (returns False), and the studies unread."""
    return replace_section(readme, COMPARE_BEGIN, COMPARE_END, lambda: comparison(studies))


REPRODUCTION_END = "<!-- reproduction:end -->"


def reproduction_begin(results_dir: Path) -> str:
    """The line that opens the table of a study's re-run arms against the study they come from (``reproduction``)."""
    return begin_marker("reproduction", f"from {results_dir.as_posix()}")


def _as_trained_by_run(results_dir: Path, arms: tuple[str, ...]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    """(arm, seed) -> size -> the run's row with positions as trained (its ``model`` the run's label: the arm's, then
    the seed), for the runs of ``arms`` evaluated so far. The evaluations are read once; the per-run labels keep
    ``merged_results`` from merging the seeds."""
    if not has_evaluations(results_dir):
        return {}
    runs = {f"{arm_label(run)}, seed {run['seed']}": run
            for run in json.loads((results_dir / "runs.json").read_text()) if run["model"] in arms}
    labelled = [{**run, "label": label} for label, run in runs.items()]
    _, merged = merged_results(results_dir / "eval", labelled)
    by_label = as_trained_by_arm(merged, trained_policies(labelled))
    return {(run["model"], run["seed"]): by_label[label] for label, run in runs.items() if label in by_label}


def reproduction(results_dir: Path, reference_dir: Path, arms: tuple[str, ...]) -> str:
    """Do the ``arms`` that the study in ``results_dir`` re-ran reproduce the study in ``reference_dir`` they come
    from? Per arm and seed run in both: top-1 with positions as trained at every size both evaluated, the reference's
    row above the re-run's, the largest difference between the two, and beside it the largest difference between the
    reference's own seeds of that arm (how far two runs of one recipe fall apart anyway)."""
    reference, rerun = _as_trained_by_run(reference_dir, arms), _as_trained_by_run(results_dir, arms)
    pairs = [key for key in rerun if key in reference]
    sizes = sorted(set.intersection(*(set(reference[key]) & set(rerun[key]) for key in pairs))) if pairs else []
    if not sizes:
        return "(no re-run evaluated yet)"

    def gap(one: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]]) -> float:
        return max(abs(one[size]["top1"] - other[size]["top1"]) for size in sizes)

    train_size, rows = rerun[pairs[0]][sizes[0]]["train_size"], []
    spreads = {}  # arm -> the largest difference between the reference's first two seeds of it
    for arm in dict.fromkeys(arm for arm, _ in pairs):
        seeds = [runs for (other, _), runs in reference.items() if other == arm]
        ok = len(seeds) > 1 and all(set(sizes) <= set(runs) for runs in seeds)
        spreads[arm] = f"{gap(*seeds[:2]):.2f}" if ok else "-"
    for arm, seed in pairs:
        label, seed_gap = rerun[arm, seed][sizes[0]]["model"].rsplit(", seed ", 1)[0], spreads[arm]
        difference = f"{gap(reference[arm, seed], rerun[arm, seed]):.2f}"
        for where, by_size, cells in ((reference_dir.name, reference[arm, seed], ["-", "-"]),
                                      ("re-run", rerun[arm, seed], [difference, seed_gap])):
            top1 = [f"**{by_size[size]['top1']:.2f}**" if size == train_size else f"{by_size[size]['top1']:.2f}"
                    for size in sizes]
            rows.append([label, seed, where, *top1, *cells])
    header = [f"{size}*" if size == train_size else str(size) for size in sizes]
    return table(["model", "seed", "run", *header, "largest difference (points)",
                  f"largest difference between {reference_dir.name}'s seeds"], rows)


def headline_begin(results_dir: Path) -> str:
    """The line that opens a study's front-page summary (``headline``) in the README."""
    return begin_marker("headline", f"from {results_dir.as_posix()}")


def headline(results_dir: Path) -> str:
    """A study in one table for the front page: every arm with positions as trained, then each RoPE arm under the
    policy that is best at the largest size (when that is not ``extrapolate``), seeds merged."""
    runs = json.loads((results_dir / "runs.json").read_text())
    _, merged = merged_results(results_dir / "eval", runs)
    largest = max(row["img_size"] for row in merged)
    rows = as_trained_rows(merged, trained_policies(runs))
    for model in dict.fromkeys(row["model"] for row in merged if row["policy"] is not None):
        best = best_row(merged, model, largest)["policy"]
        if best != "extrapolate":
            rows += [row for row in merged if row["model"] == model and row["policy"] == best]
    seeds = sorted({run["seed"] for run in runs})
    return (f"{counted(len(runs), 'finished run')}, {'seed' if len(seeds) == 1 else 'seeds'} "
            f"{', '.join(map(str, seeds))}: top-1 (%), mean ± half the "
            f"seed range; `*` training size; policy `extrapolate` or `-` (APE): positions as trained.\n\n"
            + markdown_table(rows))
