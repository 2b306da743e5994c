"""The studies side by side (``studies.compare``): rows from each study's files, sorted by training grid, and
a docs section rewritten between its markers only."""

import json
from pathlib import Path

import pytest
import yaml

from helpers.studies import write_results
from studies import compare as study_compare


def make_study(root: Path, model: str, model_kwargs: dict, img_size: int, rows: dict[str, dict],
               seeds: tuple[int, ...] = (0,)) -> Path:
    """A study folder with one run per arm and seed: ``rows`` maps an arm to {(policy, size): top1}, which seed s
    scores plus s."""
    runs, results = [], []
    for arm, scores in rows.items():
        for seed in seeds:
            run = {"name": f"{arm}_s{seed}", "model": arm, "label": arm.upper(), "seed": seed,
                   "output": f"out/{arm}_s{seed}"}
            runs.append(run)
            (root / "runs" / run["name"]).mkdir(parents=True)
            (root / "runs" / run["name"] / "config.yaml").write_text(
                yaml.safe_dump({"model": model, "model_kwargs": model_kwargs, "img_size": img_size}))
            results += [{"model": f"m ({run['output']}/last.pth)", "policy": policy, "img_size": size,
                         "train_size": img_size, "top1": top1 + seed, "top5": 90.0, "loss": 1.0, "images_per_s": 1.0}
                        for (policy, size), top1 in scores.items()]
    write_results(root / "eval", results)
    (root / "runs.json").write_text(json.dumps(runs))
    return root


@pytest.fixture
def studies(tmp_path: Path) -> dict[str, Path]:
    """A 14x14 study (8 px patches at 112) given before a 4x4 one (16 px patches at 64), and one not yet run."""
    large = make_study(tmp_path / "large", "vit_rope_tiny_patch16_mixed_224", {"patch_size": 8}, 112, {
        "rope": {("extrapolate", 112): 60.0, ("extrapolate", 192): 50.0, ("extrapolate", 256): 40.0,
                 ("interpolate", 112): 60.0, ("interpolate", 192): 61.0, ("interpolate", 256): 62.5},
        "ape": {(None, 112): 58.0, (None, 192): 57.0, (None, 256): 55.0}})
    small = make_study(tmp_path / "small", "vit_tiny_patch16_224", {}, 64, {
        "ape": {(None, 64): 45.0, (None, 80): 46.0}})
    return {"big": large, "small": small, "later": tmp_path / "not_run"}


def test_patch_size_comes_from_the_kwargs_then_the_name():
    assert study_compare.patch_size({"model": "vit_tiny_patch16_224", "model_kwargs": {"patch_size": 8}}) == 8
    assert study_compare.patch_size({"model": "vit_tiny_patch16_224", "model_kwargs": {"patch_size": [14, 14]}}) == 14
    assert study_compare.patch_size({"model": "vit_small_patch14_dinov2"}) == 14
    with pytest.raises(ValueError, match="'resnet50'.*model_kwargs.patch_size"):
        study_compare.patch_size({"model": "resnet50", "model_kwargs": None})


def test_comparison_sorts_by_grid_and_measures_changes_from_the_training_size(studies):
    lines = study_compare.comparison(studies).splitlines()
    assert lines[0].startswith("| study | grid | model | seeds | top-1 at training size |")
    assert lines[2] == "| small | 4x4 | APE | 1 | 45.00 | 1.25x | - | 46.00 (+1.0) | 46.00 (+1.0), " \
                       "as trained |"  # one larger size: the second-largest column is empty
    assert lines[3] == "| big | 14x14 | ROPE | 1 | 60.00 | 1.71x / 2.29x | 50.00 (-10.0) | " \
                       "40.00 (-20.0) | 62.50 (+2.5), interpolate |"
    assert lines[4].startswith("| big | 14x14 | APE | 1 | 58.00 | 1.71x / 2.29x | 57.00 (-1.0) |")
    assert len(lines) == 5  # the study without files adds nothing


def test_comparison_of_nothing_evaluated_says_so(tmp_path):
    assert study_compare.comparison({"v1": tmp_path / "missing"}) == "(no study evaluated yet)"


def test_write_comparison_rewrites_its_section_only(studies, tmp_path):
    page = tmp_path / "studies.md"
    page.write_text(f"intro\n{study_compare.COMPARE_BEGIN}\nold table\n{study_compare.COMPARE_END}\nreading\n")
    assert study_compare.write_comparison(page, studies)
    text = page.read_text()
    assert text.startswith(f"intro\n{study_compare.COMPARE_BEGIN}\n| study |")
    assert text.endswith(f"|\n{study_compare.COMPARE_END}\nreading\n") and "old table" not in text
    assert study_compare.write_comparison(page, studies) and page.read_text() == text  # rebuilding changes nothing
    other = tmp_path / "other.md"
    other.write_text(f"no section here\n{study_compare.COMPARE_BEGIN}\n")  # no end marker: left alone
    assert not study_compare.write_comparison(other, studies)
    assert other.read_text() == f"no section here\n{study_compare.COMPARE_BEGIN}\n"


def test_headline_shows_every_arm_as_trained_then_each_rope_arm_under_its_best_policy(studies):
    text = study_compare.headline(studies["big"])
    assert text.startswith("2 finished runs, seed 0: top-1 (%)")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "model" not in line]
    assert rows == ["| ROPE | extrapolate | **60.00** | 50.00 | 40.00 |",
                    "| APE | - | **58.00** | 57.00 | 55.00 |",
                    "| ROPE | interpolate | **60.00** | 61.00 | 62.50 |"]  # best at 256 px


def test_headline_names_the_seeds_and_merges_them(tmp_path):
    folder = make_study(tmp_path, "vit_tiny_patch16_224", {}, 64, {"ape": {(None, 64): 45.0, (None, 128): 44.0}},
                        seeds=(0, 1))
    text = study_compare.headline(folder)
    assert text.startswith("2 finished runs, seeds 0, 1: top-1 (%)")
    assert "| APE | - | **45.50 ± 0.5** | 44.50 ± 0.5 |" in text.splitlines()


def test_reproduction_puts_each_rerun_under_the_run_it_repeats(tmp_path):
    scores = {("extrapolate", 64): 50.0, ("extrapolate", 128): 40.0, ("interpolate", 128): 45.0}
    source = make_study(tmp_path / "v2", "vit_rope_tiny_patch16_mixed_224", {}, 64,
                        {"mixed": scores, "ape": {(None, 64): 52.0, (None, 128): 49.0}, "other": scores}, seeds=(0, 1))
    rerun = make_study(tmp_path / "encodings", "vit_rope_tiny_patch16_mixed_224", {}, 64,
                       {"mixed": {**scores, ("extrapolate", 128): 41.5}, "new_kind": scores})
    table = study_compare.reproduction(rerun, source, ("mixed", "ape"))
    lines = table.splitlines()
    assert lines[0] == ("| model | seed | run | 64* | 128 | largest difference (points) | largest difference "
                        "between v2's seeds |")
    assert lines[2:] == ["| MIXED | 0 | v2 | **50.00** | 40.00 | - | - |",  # as trained only; seed 1 not re-run
                         "| MIXED | 0 | re-run | **50.00** | 41.50 | 1.50 | 1.00 |"]  # v2's seed 1 scores 1 more
    assert study_compare.reproduction(rerun, source, ("ape",)) == "(no re-run evaluated yet)"
