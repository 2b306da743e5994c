"""Seed-merged study reports (``vit_rope.report.merge_seeds`` / ``write_study``): the numbers come from the files."""

import csv
import json
from pathlib import Path

import pytest

from vit_rope import report


def result(model: str, policy: str | None, size: int, top1: float) -> dict:
    return {"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1, "top5": 90.0,
            "loss": 1.0, "images_per_s": 100.0}


def make_study(root: Path) -> Path:
    """Two models x two seeds: a timm APE ViT (no policy) and a RoPE model under two policies."""
    runs = [{"name": f"{model}_s{seed}", "model": model, "seed": seed, "output": f"output/study/{model}_s{seed}"}
            for model in ("ape", "mixed") for seed in (0, 1)]
    rows = []
    for run in runs:
        label, bump = f"some_model ({run['output']}/last.pth)", run["seed"] * 2.0  # seed 1 scores 2 points more
        if run["model"] == "ape":
            rows += [result(label, None, 64, 50.0 + bump), result(label, None, 128, 30.0 + bump)]
        else:
            for policy, high in (("extrapolate", 40.0), ("interpolate", 48.0)):
                rows += [result(label, policy, 64, 52.0 + bump), result(label, policy, 128, high + bump)]
        metrics = root / "runs" / run["name"] / "metrics.csv"
        metrics.parent.mkdir(parents=True)
        with open(metrics, "w", newline="") as f:
            writer = csv.DictWriter(f, ["epoch", "top1", "seconds"])
            writer.writeheader()
            writer.writerows([{"epoch": 1, "top1": 20.0, "seconds": 60.0},
                              {"epoch": 2, "top1": 40.0 + bump, "seconds": 60.0}])
    (root / "eval").mkdir()
    (root / "eval" / "results.json").write_text(json.dumps({"protocol": "crop 1.0", "results": rows}))
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "machine.json").write_text(json.dumps({"cpu": "test cpu", "cores": 2, "gpu": None, "torch": "2",
                                                   "timm": "1", "date": "today", "evaluate_s": 120}))
    return root


def test_merge_seeds_gives_mean_and_range():
    rows = [result("a s0", "yarn", 64, 50.0), result("a s1", "yarn", 64, 54.0), result("other", "yarn", 64, 1.0)]
    (merged,) = report.merge_seeds(rows, {"a s0": "A", "a s1": "A"})
    assert merged["model"] == "A" and merged["seeds"] == 2
    assert (merged["top1"], merged["top1_min"], merged["top1_max"]) == (52.0, 50.0, 54.0)
    assert "52.00 ± 2.0" in report.markdown_table([merged])


def test_write_study_updates_the_readme_section_only(tmp_path):
    root = make_study(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.STUDY_BEGIN}\nstale table\n{report.STUDY_END}\nreading\n")
    section = report.write_study(root, readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{report.STUDY_END}\nreading\n")
    assert "stale table" not in text and section in text
    assert "| APE (timm ViT) | 2 | 41.00 ± 1.0 | 2.0 |" in section  # final top-1 of both seeds; 2 x 60 s per run
    assert "| RoPE-Mixed | extrapolate | **53.00 ± 1.0** | 41.00 ± 1.0 |" in section
    assert "| RoPE-Mixed | 53.00 | 41.00 (-12.0) | 49.00 (-4.0, interpolate) |" in section  # best policy at 128
    assert "| APE (timm ViT) | 51.00 | 31.00 (-20.0) | 31.00 (-20.0, -) |" in section
    assert (root / "summary.md").read_text().endswith(section + "\n")


def test_write_study_needs_the_readme_markers(tmp_path):
    root = make_study(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no study section"):
        report.write_study(root, readme)
