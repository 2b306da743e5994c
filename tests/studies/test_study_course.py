"""``studies.course``: accuracy as trained over a run's schedule, from its kept checkpoints and its final one,
merged over the seeds that kept checkpoints only."""

import csv
from pathlib import Path

import pytest

from helpers.studies import write_results
from studies import course as study_course


def row(checkpoint: str, policy: str | None, size: int, top1: float) -> dict:
    return {"model": f"m (depth=6) ({checkpoint})", "policy": policy, "img_size": size, "train_size": 112, "top1": top1,
            "top5": 90.0}


@pytest.fixture
def study(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Mixed with two seeds that kept epoch 10, APE with one, Axial with none; 30 epochs each. Mixed's loss at 256 px
    shrinks over the schedule (-20 at epoch 10, -10 at 30, seed means), APE's does not change."""
    runs = [{"name": f"{arm}_s{seed}", "model": arm, "label": label, "seed": seed, "output": f"out/{arm}_s{seed}"}
            for arm, label in (("mixed", "RoPE-Mixed"), ("ape", "APE"), ("axial", "RoPE-Axial")) for seed in (0, 1)]
    final, kept = [], []
    for run in runs:
        (tmp_path / "runs" / run["name"]).mkdir(parents=True)
        with open(tmp_path / "runs" / run["name"] / "metrics.csv", "w", newline="") as f:
            csv.writer(f).writerows([["epoch", "top1"], [29, 60.0], [30, 61.0]])
        policy, bump = (None, 0.0) if run["model"] == "ape" else ("extrapolate", run["seed"] * 2.0)
        final += [row(f"{run['output']}/last.pth", policy, 112, 60.0 + bump),
                  row(f"{run['output']}/last.pth", policy, 256, 50.0 + bump if policy else 65.0)]
        if run["model"] == "mixed" or run["name"] == "ape_s0":
            kept += [row(f"{run['output']}/epoch_10.pth", policy, 112, 50.0 + bump),
                     row(f"{run['output']}/epoch_10.pth", policy, 256, 30.0 + bump if policy else 55.0)]
    final.append(row("out/mixed_s0/last.pth", "interpolate", 256, 59.0))  # not as trained: left out
    write_results(tmp_path / "eval", final)
    write_results(tmp_path / "course" / "mixed", kept)
    return tmp_path, runs


def test_rows_are_kept_and_final_epochs_over_the_same_seeds(study):
    folder, runs = study
    rows = study_course.course_rows(folder, runs)
    keys = [(row["model"], row["epoch"], row["img_size"], row["seeds"]) for row in rows]
    assert keys == [("RoPE-Mixed", 10, 112, 2), ("RoPE-Mixed", 10, 256, 2), ("RoPE-Mixed", 30, 112, 2),
                    ("RoPE-Mixed", 30, 256, 2), ("APE", 10, 112, 1), ("APE", 10, 256, 1), ("APE", 30, 112, 1),
                    ("APE", 30, 256, 1)]  # Axial kept nothing; APE's seed 1 kept nothing, so epoch 30 is seed 0's
    mixed_10 = rows[1]
    assert (mixed_10["top1"], mixed_10["top1_min"], mixed_10["top1_max"]) == (31.0, 30.0, 32.0)
    assert all(row["policy"] in (None, "extrapolate") for row in rows)


def test_table_gives_the_change_from_the_training_size_per_epoch(study):
    lines = study_course.course_table(*study).splitlines()
    assert lines[0] == "| model | epoch | seeds | 112* | 256 | 256 minus 112 |"
    assert lines[2:] == ["| RoPE-Mixed | 10 | 2 | **51.00 ± 1.0** | 31.00 ± 1.0 | -20.0 |",
                         "| RoPE-Mixed | 30 | 2 | **61.00 ± 1.0** | 51.00 ± 1.0 | -10.0 |",
                         "| APE | 10 | 1 | **50.00** | 55.00 | +5.0 |",
                         "| APE | 30 | 1 | **60.00** | 65.00 | +5.0 |"]


def test_no_kept_checkpoint_gives_no_table(tmp_path):
    write_results(tmp_path / "eval", [row("out/a_s0/last.pth", None, 112, 60.0)])
    assert study_course.course_table(tmp_path, [{"name": "a_s0", "model": "a", "seed": 0, "output": "out/a_s0"}]) == ""


def test_kept_checkpoints_under_another_protocol_are_an_error(study):
    folder, runs = study
    write_results(folder / "course" / "mixed", [row("out/mixed_s0/epoch_10.pth", "extrapolate", 112, 1.0)],
                  protocol="crop 0.875")
    with pytest.raises(ValueError, match="another protocol.*'crop 0.875', not 'crop 1.0'"):
        study_course.course_rows(folder, runs)


def test_a_kept_checkpoint_of_no_run_is_an_error_that_names_it(study):
    folder, runs = study  # e.g. a run renamed or its output moved after its course was evaluated
    write_results(folder / "course" / "old", [row("out/renamed_s0/epoch_10.pth", "extrapolate", 112, 1.0)])
    named = r"'m \(depth=6\) \(out/renamed_s0/epoch_10.pth\)'.*out/mixed_s0, out/mixed_s1"
    with pytest.raises(ValueError, match=named):
        study_course.course_rows(folder, runs)


def test_kept_epoch_reads_the_file_name():
    assert study_course.kept_epoch(Path("out/run/epoch_20.pth")) == 20
    assert study_course.kept_epoch(Path("out/run/last.pth")) is None
    assert study_course.kept_epoch(Path("out/run/epoch_20.pth.tmp")) is None
