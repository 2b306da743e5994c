"""A study's runs and evaluations as every report reads them (``studies.results``): rows belong to a run by their
checkpoint, arms merge their seeds under one label in ``runs.json``'s order, and positions as trained follow the arm's
own policy."""

import json
from pathlib import Path

import pytest

from studies import results


def run(arm: str, seed: int, **extra: str) -> dict:
    return {"name": f"{arm}_s{seed}", "model": arm, "seed": seed, "output": f"out/{arm}_s{seed}", **extra}


def row(entry: dict, policy: str | None, size: int, top1: float, checkpoint: str = "last.pth") -> dict:
    return {"model": f"m ({entry['output']}/{checkpoint})", "policy": policy, "img_size": size, "train_size": 64,
            "top1": top1, "top5": 90.0}


def write(folder: Path, rows: list[dict], protocol: str = "crop 1.0") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"protocol": protocol, "results": rows}))


def test_a_row_is_a_run_by_its_checkpoint_path():
    entry = run("mixed", 0)
    assert results.is_run("m (out/mixed_s0/last.pth)", entry)
    assert not results.is_run("m (out/mixed_s0/epoch10.pth)", entry)
    assert results.is_run("m (out/mixed_s0/epoch10.pth)", entry, "epoch10.pth")
    assert not results.is_run("m (out/mixed_s01/last.pth)", entry)  # another run whose name starts alike


def test_labels_come_from_runs_json_then_the_arm():
    assert results.arm_label(run("mixed", 0, label="RoPE-Mixed + sizes")) == "RoPE-Mixed + sizes"
    assert results.arm_label(run("golden", 0)) == "golden"  # a runs.json written by hand, without labels


def test_one_seed_shows_no_spread_and_two_show_half_their_range():
    assert results.spread({"top1": 50.0, "top1_min": 50.0, "top1_max": 50.0, "seeds": 1}) == "50.00"
    assert results.spread({"top1": 51.0, "top1_min": 50.0, "top1_max": 52.0, "seeds": 2}) == "51.00 ± 1.0"
    assert (results.counted(1, "seed"), results.counted(2, "seed")) == ("1 seed", "2 seeds")


def test_seeds_merge_in_the_order_of_runs_json_and_other_studies_rows_are_left_out(tmp_path):
    runs = [run("mixed", 0), run("ape", 0), run("mixed", 1), run("ape", 1)]
    write(tmp_path / "eval" / "ape", [row(runs[1], None, 64, 50.0), row(runs[3], None, 64, 54.0),
                                      row(run("other", 0), None, 64, 10.0)])  # a run of another study
    write(tmp_path / "eval" / "mixed", [row(runs[0], "extrapolate", 64, 60.0), row(runs[2], "extrapolate", 64, 61.0),
                                        row(runs[0], "interpolate", 64, 62.0)])
    protocol, merged = results.merged_results(tmp_path / "eval", runs)
    assert protocol == "crop 1.0"
    assert [(r["model"], r["policy"], r["seeds"]) for r in merged] == [
        ("mixed", "extrapolate", 2), ("mixed", "interpolate", 1), ("ape", None, 2)]
    ape = merged[-1]
    assert (ape["top1"], ape["top1_min"], ape["top1_max"]) == (52.0, 50.0, 54.0)


def test_positions_as_trained_follow_each_arms_policy():
    runs = [run("dinov3", 0, label="DINOv3", as_trained="normalized"), run("mixed", 0, label="Mixed"),
            run("ape", 0, label="APE")]
    policies = results.trained_policies(runs)
    assert policies == {"DINOv3": "normalized", "Mixed": "extrapolate", "APE": "extrapolate"}
    table = [("DINOv3", "normalized", 64, 60.0), ("DINOv3", "extrapolate", 128, 30.0),
             ("DINOv3", "normalized", 128, 58.0), ("Mixed", "extrapolate", 64, 59.0),
             ("Mixed", "interpolate", 128, 57.0), ("APE", None, 64, 55.0)]
    merged = [{"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1}
              for model, policy, size, top1 in table]
    by_arm = results.as_trained_by_arm(merged, policies)
    assert {arm: {size: r["top1"] for size, r in rows.items()} for arm, rows in by_arm.items()} == {
        "DINOv3": {64: 60.0, 128: 58.0}, "Mixed": {64: 59.0}, "APE": {64: 55.0}}
    assert results.training_row(by_arm["DINOv3"])["top1"] == 60.0
    assert results.best_row(merged, "DINOv3", 128)["policy"] == "normalized"  # the best over every policy
    assert len(results.as_trained_rows(merged, policies)) == 4


def test_no_evaluation_or_two_protocols_is_an_error_that_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no results.json: run the study's evaluation first"):
        results.read_evaluations(tmp_path)
    write(tmp_path / "a", [])
    write(tmp_path / "b", [], protocol="crop 0.875")
    with pytest.raises(ValueError, match=r"different protocols: \['crop 0.875', 'crop 1.0'\]; delete the stale"):
        results.read_evaluations(tmp_path)
