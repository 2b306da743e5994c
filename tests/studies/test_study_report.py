"""Study reports (``studies.report.write_study``): every number comes from the study's files, and the verdict applies
the goal (hold within 1 point at 2x, above the same-recipe APE with every seed at 2x and at the largest size)."""

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from studies import goal
from studies import report as study


def result(model: str, policy: str | None, size: int, top1: float) -> dict:
    return {"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1, "top5": 90.0,
            "loss": 1.0, "images_per_s": 100.0}


def write_runs(root: Path, runs: list[dict], evaluations: dict[str, list[dict]], evaluate_s: object = 120) -> Path:
    """A study folder: ``runs.json``, per-run ``metrics.csv`` (final top-1 40 + 2 x seed), one results.json per key
    of ``evaluations`` (``""`` is v1's single file), ``machine.json``."""
    for run in runs:
        metrics = root / "runs" / run["name"] / "metrics.csv"
        metrics.parent.mkdir(parents=True)
        with open(metrics, "w", newline="") as f:
            writer = csv.DictWriter(f, ["epoch", "top1", "seconds"])
            writer.writeheader()
            writer.writerows([{"epoch": 1, "top1": 20.0, "seconds": 60.0},
                              {"epoch": 2, "top1": 40.0 + 2 * run["seed"], "seconds": 60.0}])
    for name, rows in evaluations.items():
        (root / "eval" / name).mkdir(parents=True, exist_ok=True)
        (root / "eval" / name / "results.json").write_text(json.dumps({"protocol": "crop 1.0", "results": rows}))
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "machine.json").write_text(json.dumps({"cpu": "test cpu", "cores": 2, "gpu": None, "torch": "2",
                                                   "timm": "1", "date": "today", "evaluate_s": evaluate_s}))
    return root


def make_v1(root: Path) -> Path:
    """v1's layout: two models x two seeds in one results.json, runs.json without labels or baselines."""
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
    return write_runs(root, runs, {"": rows})


def test_write_study_updates_the_readme_section_only(tmp_path):
    root = make_v1(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{study.study_begin(root)}\nstale table\n{study.STUDY_END}\nreading\n")
    section = study.write_study(root, readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{study.STUDY_END}\nreading\n")
    assert "stale table" not in text and section in text
    assert "| APE (timm ViT) | 2 | 41.00 ± 1.0 | 2.0 |" in section  # final top-1 of both seeds; 2 x 60 s per run
    assert "| RoPE-Mixed | extrapolate | **53.00 ± 1.0** | 41.00 ± 1.0 |" in section
    assert "| RoPE-Mixed | 53.00 | 41.00 (-12.0) | 49.00 (-4.0, interpolate) |" in section  # best policy at 128
    assert "| APE (timm ViT) | 51.00 | 31.00 (-20.0) | 31.00 (-20.0, -) |" in section
    assert "goal met" not in section  # v1 names no baselines, so there is no verdict
    # plots linked from where each page is: the README beside results/, summary.md inside it
    assert "![as trained](results/summary_as_trained.png)" in section
    summary = (root / "summary.md").read_text()
    assert summary.endswith(section.replace("](results/summary_", "](summary_") + "\n")


def test_write_study_leaves_other_study_sections_alone(tmp_path):
    root = make_v1(tmp_path / "results")
    other = study.study_begin(tmp_path / "elsewhere")
    readme = tmp_path / "README.md"
    readme.write_text(f"{other}\nkeep me\n{study.STUDY_END}\n{study.study_begin(root)}\nold\n{study.STUDY_END}\n")
    study.write_study(root, readme)
    text = readme.read_text()
    assert f"{other}\nkeep me\n{study.STUDY_END}\n" in text and "\nold\n" not in text


def test_write_study_needs_the_readme_markers(tmp_path):
    root = make_v1(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no study section"):
        study.write_study(root, readme)


def make_v2(root: Path, seeds: tuple[int, ...] = (0, 1)) -> Path:
    """v2's layout: one eval folder per arm and a baseline per RoPE arm. ``holds`` keeps its training-size top-1 at
    128 px and beats APE with both seeds; ``drops`` loses 5 points; ``close`` holds but its seeds overlap APE's;
    ``under`` falls below APE with every seed."""
    top1 = {  # arm -> (64 px, 128 px, 160 px) for seed 0; seed 1 adds ``bump`` points
        "ape": ((50.0, 45.0, 40.0), 1.0), "holds": ((55.0, 54.5, 52.0), 1.0),
        "drops": ((55.0, 50.0, 45.0), 1.0), "close": ((50.0, 49.5, 40.5), 2.0), "under": ((52.0, 40.0, 35.0), 1.0)}
    runs, evaluations = [], {}
    for arm, (values, bump) in top1.items():
        for seed in seeds:
            run = {"name": f"{arm}_s{seed}", "model": arm, "label": arm.upper(), "seed": seed,
                   "baseline": None if arm == "ape" else "ape", "output": f"output/study/v2/{arm}_s{seed}"}
            runs.append(run)
            label = f"m ({run['output']}/last.pth)"
            evaluations.setdefault(arm, []).extend(
                result(label, None if arm == "ape" else "extrapolate", size, value + seed * bump)
                for size, value in zip((64, 128, 160), values, strict=True))
            if arm != "ape":
                evaluations[arm].append(result(label, "interpolate", 160, 60.0))
    return write_runs(root, runs, evaluations, evaluate_s=dict.fromkeys(top1, 60))


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
    section = study.write_study(make_v2(tmp_path / "results", seeds=(0,)))
    assert section.startswith("5 training runs (5 models x 1 seed) on test cpu")
    verdict = section.split("**Does RoPE hold", 1)[1]
    assert "| HOLDS | 55.00 | 54.50 (-0.5) | 52.00 (-3.0) | +9.5 (1 seed) | +12.0 (1 seed) | " \
        "yes so far (1 seed: no seed range yet) |" in verdict
    assert "as trained HOLDS 55.00, then DROPS 55.00 (1 seed: no range yet)" in verdict  # no "apart"
    assert "seed ranges" not in verdict.split("Best arm at each size", 1)[1]
    assert verdict.split("| DROPS |", 1)[1].split("\n", 1)[0].endswith("| no so far (1 seed: no seed range yet) |")


def test_evaluations_must_share_a_protocol(tmp_path):
    root = make_v2(tmp_path / "results")
    path = root / "eval" / "ape" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "protocol": "crop 0.875"}))
    with pytest.raises(ValueError, match="different protocols"):
        study.write_study(root)


def test_v3_goal_holds_at_1_43x_to_1_71x_and_a_second_crop_gets_its_own_verdict(tmp_path):
    """RoPE-ViT's reading on a 14x14 grid (112 px): hold within a point at 160 and 192 px, beat APE at 256 px."""
    root = tmp_path / "results"
    sizes = (80, 112, 160, 192, 256)
    top1 = {"ape": (50.0, 60.0, 59.0, 57.0, 50.0), "mixed": (52.0, 61.0, 60.5, 60.2, 56.0),
            "axial": (52.0, 61.0, 58.0, 57.0, 52.0)}
    runs, evaluations, crop = [], {}, {}
    for arm, values in top1.items():
        for seed in (0, 1):
            run = {"name": f"{arm}_s{seed}", "model": arm, "label": arm.upper(), "seed": seed,
                   "baseline": None if arm == "ape" else "ape", "output": f"output/study/v3/{arm}_s{seed}"}
            runs.append(run)
            label, policy = f"m ({run['output']}/last.pth)", None if arm == "ape" else "extrapolate"
            rows = [{**result(label, policy, size, value + seed * 0.4), "train_size": 112}
                    for size, value in zip(sizes, values, strict=True)]
            evaluations.setdefault(arm, []).extend(rows)
            # at crop 0.875 APE gains 7 points at 256 px: MIXED no longer beats it there
            crop.setdefault(arm, []).extend({**row, "top1": row["top1"] + (7.0 if arm == "ape" and
                                                                             row["img_size"] == 256 else 0.0)}
                                            for row in rows)
    write_runs(root, runs, evaluations, evaluate_s=dict.fromkeys(top1, 60))
    for arm, rows in crop.items():
        (root / "eval_crop0.875" / arm).mkdir(parents=True)
        (root / "eval_crop0.875" / arm / "results.json").write_text(json.dumps({"protocol": "crop 0.875",
                                                                                 "results": rows}))
    section = study.write_study(root, goal=goal.Goal(hold=(1.43, 1.71), beat=(None,)))
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


def test_an_arm_trained_on_normalised_coordinates_is_read_under_its_own_policy(tmp_path):
    """DINOv3's RoPE is trained with ``normalized`` positions (runs.json ``as_trained``): that policy, not
    ``extrapolate``, is its positions as trained in every table and in the verdict."""
    runs = [{"name": f"{arm}_s{seed}", "model": arm, "seed": seed, "output": f"out/{arm}_s{seed}",
             "label": label, "baseline": baseline, **extra}
            for arm, label, baseline, extra in (("ape", "APE", None, {}),
                                                ("dinov3", "DINOv3 RoPE", "ape", {"as_trained": "normalized"}))
            for seed in (0, 1)]
    rows = []
    for run in runs:
        label, bump = f"m ({run['output']}/last.pth)", run["seed"] * 0.5
        if run["model"] == "ape":
            rows += [result(label, None, 64, 50.0 + bump), result(label, None, 128, 45.0 + bump)]
        else:
            for policy, high in (("normalized", 60.0), ("extrapolate", 20.0)):
                rows += [result(label, policy, 64, 60.0 + bump), result(label, policy, 128, high + bump)]
    root = write_runs(tmp_path / "results", runs, {"ape": rows[:4], "dinov3": rows[4:]})
    section = study.write_study(root, goal=goal.Goal(hold=(2.0,), beat=(2.0,)))
    as_trained = section.split("**Positions as trained**")[1].split("**Every resolution policy**")[0]
    assert "| DINOv3 RoPE | normalized | **60.25 ± 0.2** | 60.25 ± 0.2 |" in as_trained
    assert "| DINOv3 RoPE | extrapolate |" not in as_trained
    assert "| DINOv3 RoPE | 60.25 | 60.25 (+0.0) | 60.25 (+0.0, normalized) |" in section
    verdict = section.split("**Does RoPE hold its accuracy?**")[1]
    assert "| DINOv3 RoPE | 60.25 ± 0.2 | 60.25 ± 0.2 (+0.0) | +15.0 (apart) | yes |" in verdict


def make_control(root: Path, top1: tuple[float, float, float], protocol: str = "crop 1.0") -> Path:
    """Another study with one APE arm (``ape``, 2 seeds, seed 1 one point up) at 64, 128 and 160 px."""
    runs = [{"name": f"ape_s{seed}", "model": "ape", "label": "APE", "seed": seed, "output": f"out/other/ape_s{seed}"}
            for seed in (0, 1)]
    rows = [result(f"m ({run['output']}/last.pth)", None, size, value + run["seed"])
            for run in runs for size, value in zip((64, 128, 160), top1, strict=True)]
    write_runs(root, runs, {"ape": rows})
    path = root / "eval" / "ape" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "protocol": protocol}))
    return root


def test_a_control_of_another_study_must_be_beaten_too(tmp_path):
    """v4's goal names v3's APE beside its own: an arm above its same-recipe APE but under the control is no."""
    root = make_v2(tmp_path / "results")
    strong = goal.Control("the other APE", make_control(tmp_path / "strong", (60.0, 58.0, 57.0)), "ape")
    section = study.write_study(root, controls=[strong])
    assert "and above the APE model of the same recipe and the other APE at 2x and at the largest size" in section
    assert "| minus APE of the same recipe at 2x | at 160 | minus the other APE at 2x | at 160 | goal met |" in section
    # HOLDS: 55.00 / 52.50 against the control's 58.50 / 57.50 (seeds 58-59, 57-58)
    holds = section.split("**Does RoPE hold", 1)[1].split("| HOLDS |", 1)[1].split("\n", 1)[0]
    assert holds.endswith("| +9.5 (apart) | +12.0 (apart) | -3.5 (below) | -5.0 (below) | no |")
    weak = goal.Control("the other APE", make_control(tmp_path / "weak", (40.0, 30.0, 20.0)), "ape")
    section = study.write_study(root, controls=[weak])
    holds = section.split("**Does RoPE hold", 1)[1].split("| HOLDS |", 1)[1].split("\n", 1)[0]
    assert holds.endswith("| +24.5 (apart) | +32.0 (apart) | yes |")


def test_a_control_is_read_at_each_crop_only_where_it_was_evaluated(tmp_path):
    root = make_v2(tmp_path / "results")
    shutil.copytree(root / "eval", root / "eval_crop0.875")
    for path in (root / "eval_crop0.875").rglob("results.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "protocol": "crop 0.875"}))
    control = goal.Control("the other APE", make_control(tmp_path / "other", (40.0, 30.0, 20.0)), "ape")
    main, crop = study.write_study(root, controls=[control]).split("**At crop 0.875**", 1)
    assert "minus the other APE" in main and "minus the other APE" not in crop  # the other study has no second crop


def test_a_control_of_another_protocol_or_never_evaluated_is_an_error(tmp_path):
    root = make_v2(tmp_path / "results")
    other = make_control(tmp_path / "other", (40.0, 30.0, 20.0), protocol="crop 0.875")
    with pytest.raises(ValueError, match="the control 'x' was evaluated as 'crop 0.875', this study as 'crop 1.0'"):
        study.write_study(root, controls=[goal.Control("x", other, "ape")])
    with pytest.raises(ValueError, match=r"holds no evaluated run of arm 'mixed', the control 'x'"):
        study.write_study(root, controls=[goal.Control("x", other, "mixed")])


def test_machines_recorded_by_arm_in_earlier_files_stand_for_every_run_of_it():
    runs = [{"name": f"{arm}_s{seed}", "model": arm} for arm in ("ape", "axial") for seed in (0, 1)]
    there, other = {"cpu": "there"}, {"cpu": "other"}
    assert study.machines_by_run({"axial": there, "ape_s1": other}, runs) == {
        "axial_s0": there, "axial_s1": there, "ape_s1": other}
