"""The goal a study's RoPE arms are held to (``studies.goal``), read through the report that prints it: hold within a
point above the training size, above the same-recipe APE (and any control of another study) with every seed."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from helpers.studies import arm_runs, make_v2, set_protocol, write_results, write_runs
from studies import goal
from studies import report as study


def test_verdict_applies_the_goal_per_arm(tmp_path):
    section = study.write_study(make_v2(tmp_path / "results"))
    if importlib.util.find_spec("matplotlib"):  # one panel per policy; the as-trained plot has APE too
        assert (tmp_path / "results" / "summary_policies.png").stat().st_size > 0
        assert (tmp_path / "results" / "summary_as_trained.png").stat().st_size > 0
    assert "10 training runs (5 models x 2 seeds)" in section and "evaluation took 5 min" in section
    verdict = section.split("**Does RoPE hold its accuracy?**", 1)[1]
    # HOLDS: -0.5 at 2x; +9.5 over APE at 128 and +12 at 160 with the seed ranges apart
    assert "| HOLDS | 55.50 ± 0.5 | 55.00 ± 0.5 (-0.5) | 52.50 ± 0.5 (-3.0) | +9.5 (apart) | +12.0 (apart) | yes |" \
        in verdict
    assert "| DROPS |" in verdict and verdict.split("| DROPS |", 1)[1].split("\n", 1)[0].endswith("| no |")
    close = verdict.split("| CLOSE |", 1)[1].split("\n", 1)[0]  # holds at 2x, but at 160 its seeds overlap APE's
    assert close.startswith(" 51.00 ± 1.0 | 50.50 ± 1.0 (-0.5) |") and close.endswith("| +1.0 (overlap) | no |")
    assert "| UNDER | 52.50 ± 0.5 | 40.50 ± 0.5 (-12.0) | 35.50 ± 0.5 (-17.0) | -5.0 (below) | -5.0 (below) | no |" \
        in verdict
    assert "- **128 px** (2x): as trained HOLDS 55.00 ± 0.5, then DROPS 50.50 ± 0.5 (seed ranges apart)" in verdict
    assert "- **64 px** (1x): as trained HOLDS 55.50 ± 0.5, then DROPS 55.50 ± 0.5 (seed ranges overlap)" in verdict
    assert "- **160 px** (2.5x): as trained HOLDS 52.50 ± 0.5" in verdict
    assert "with any policy HOLDS [interpolate] 60.00 ± 0.0." in verdict  # every RoPE arm scores 60 there


def test_verdict_from_one_seed_says_so(tmp_path):
    """A study read while its second seeds train: a one-seed "range" is a point, so no verdict is final yet."""
    section = study.write_study(make_v2(tmp_path / "results", seeds=(0,)), plots=False)
    assert section.startswith("5 training runs (5 models x 1 seed) on test cpu")
    verdict = section.split("**Does RoPE hold", 1)[1]
    assert "| HOLDS | 55.00 | 54.50 (-0.5) | 52.00 (-3.0) | +9.5 (1 seed) | +12.0 (1 seed) | " \
        "yes so far (1 seed: no seed range yet) |" in verdict
    assert "as trained HOLDS 55.00, then DROPS 55.00 (1 seed: no range yet)" in verdict  # no "apart"
    assert "seed ranges" not in verdict.split("Best arm at each size", 1)[1]
    assert verdict.split("| DROPS |", 1)[1].split("\n", 1)[0].endswith("| no so far (1 seed: no seed range yet) |")


def test_v3_goal_holds_at_1_43x_to_1_71x_and_a_second_crop_gets_its_own_verdict(tmp_path):
    """RoPE-ViT's reading on a 14x14 grid (112 px): hold within a point at 160 and 192 px, beat APE at 256 px."""
    root = tmp_path / "results"
    sizes = (80, 112, 160, 192, 256)
    top1 = {"ape": (50.0, 60.0, 59.0, 57.0, 50.0), "mixed": (52.0, 61.0, 60.5, 60.2, 56.0),
            "axial": (52.0, 61.0, 58.0, 57.0, 52.0)}
    runs, evaluations = arm_runs(top1, sizes, "output/study/v3", bump=0.4, train_size=112)
    # at crop 0.875 APE gains 7 points at 256 px: MIXED no longer beats it there
    crop = {arm: [{**row, "top1": row["top1"] + (7.0 if arm == "ape" and row["img_size"] == 256 else 0.0)}
                  for row in rows] for arm, rows in evaluations.items()}
    write_runs(root, runs, evaluations, evaluate_s=dict.fromkeys(top1, 60))
    for arm, rows in crop.items():
        write_results(root / "eval_crop0.875" / arm, rows, "crop 0.875")
    section = study.write_study(root, goal=goal.Goal(hold=(1.43, 1.71), beat=(None,)), plots=False)
    main, crop_part = section.split("**At crop 0.875**", 1)
    assert "Goal: as trained, within 1 point of the training-size top-1 at 1.43x and at 1.71x, and above the APE " \
        "model of the same recipe at the largest size with every seed" in main
    header = "| model | at training size | at 160, as trained | at 192, as trained | at 256, as trained | " \
        "minus APE of the same recipe at 256 | goal met |"
    assert header in main
    mixed = "| MIXED | 61.20 ± 0.2 | 60.70 ± 0.2 (-0.5) | 60.40 ± 0.2 (-0.8) | 56.20 ± 0.2 (-5.0) |"
    assert f"{mixed} +6.0 (apart) | yes |" in main
    verdict = main.split("**Does RoPE hold its accuracy?**", 1)[1]
    assert verdict.split("| AXIAL |", 1)[1].split("\n", 1)[0].endswith("| no |")  # -3 at 1.43x: does not hold
    assert "crop 0.875" in crop_part.split("\n", 1)[0]
    assert f"{mixed} -1.0 (below) | no |" in crop_part


def make_control(root: Path, top1: tuple[float, float, float], protocol: str = "crop 1.0") -> Path:
    """Another study with one APE arm (``ape``, 2 seeds, seed 1 one point up) at 64, 128 and 160 px."""
    write_runs(root, *arm_runs({"ape": top1}, (64, 128, 160), "out/other"))
    set_protocol([root / "eval" / "ape" / "results.json"], protocol)
    return root


def test_a_control_of_another_study_must_be_beaten_too(tmp_path):
    """v4's goal names v3's APE beside its own: an arm above its same-recipe APE but under the control is no."""
    root = make_v2(tmp_path / "results")
    strong = goal.Control("the other APE", make_control(tmp_path / "strong", (60.0, 58.0, 57.0)), "ape")
    section = study.write_study(root, controls=[strong], plots=False)
    assert "and above the APE model of the same recipe and the other APE at 2x and at the largest size" in section
    assert "| minus APE of the same recipe at 2x | at 160 | minus the other APE at 2x | at 160 | goal met |" in section
    # HOLDS: 55.00 / 52.50 against the control's 58.50 / 57.50 (seeds 58-59, 57-58)
    holds = section.split("**Does RoPE hold", 1)[1].split("| HOLDS |", 1)[1].split("\n", 1)[0]
    assert holds.endswith("| +9.5 (apart) | +12.0 (apart) | -3.5 (below) | -5.0 (below) | no |")
    weak = goal.Control("the other APE", make_control(tmp_path / "weak", (40.0, 30.0, 20.0)), "ape")
    section = study.write_study(root, controls=[weak], plots=False)
    holds = section.split("**Does RoPE hold", 1)[1].split("| HOLDS |", 1)[1].split("\n", 1)[0]
    assert holds.endswith("| +24.5 (apart) | +32.0 (apart) | yes |")


def test_a_control_is_read_at_each_crop_only_where_it_was_evaluated(tmp_path):
    root = make_v2(tmp_path / "results")
    shutil.copytree(root / "eval", root / "eval_crop0.875")
    set_protocol((root / "eval_crop0.875").rglob("results.json"), "crop 0.875")
    control = goal.Control("the other APE", make_control(tmp_path / "other", (40.0, 30.0, 20.0)), "ape")
    main, crop = study.write_study(root, controls=[control], plots=False).split("**At crop 0.875**", 1)
    assert "minus the other APE" in main and "minus the other APE" not in crop  # the other study has no second crop


def test_a_control_of_another_protocol_or_never_evaluated_is_an_error(tmp_path):
    root = make_v2(tmp_path / "results")
    other = make_control(tmp_path / "other", (40.0, 30.0, 20.0), protocol="crop 0.875")
    with pytest.raises(ValueError, match="the control 'x' was evaluated as 'crop 0.875', this study as 'crop 1.0'"):
        study.write_study(root, controls=[goal.Control("x", other, "ape")], plots=False)
    with pytest.raises(ValueError, match=r"holds no evaluated run of arm 'mixed', the control 'x'"):
        study.write_study(root, controls=[goal.Control("x", other, "mixed")], plots=False)


def test_the_headline_counts_seeds_per_model_when_one_model_has_fewer(tmp_path):
    """A study whose newest arm has run one seed of two: the first line says so instead of "5 models x 2 seeds"."""
    results = make_v2(tmp_path / "results")
    runs = json.loads((results / "runs.json").read_text())
    (results / "runs.json").write_text(json.dumps([run for run in runs if run["name"] != "under_s1"]))
    section = study.write_study(results, plots=False)
    assert section.startswith("9 training runs (5 models, 1 to 2 seeds each) on test cpu")
    assert "| UNDER | 52.00 |" in section.split("**Does RoPE hold", 1)[1]  # its one seed, no range
