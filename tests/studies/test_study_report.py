"""Study reports (``studies.report.write_study``): every number comes from the study's files, the docs section is
rewritten in place, and runs trained elsewhere are credited to their machine. The goal's verdict: test_study_goal."""

from pathlib import Path

import pytest

from helpers.studies import make_v2, result, set_protocol, write_runs
from studies import goal
from studies import report as study


def scores(runs: list[dict], bump: float, ape: tuple[float, float], rope: dict[str, tuple[float, float]]) -> list:
    """Each run's results at 64 and 128 px: APE's top-1 ``ape``, a RoPE arm's ``rope`` per policy; seed s adds s x
    ``bump``."""
    return [result(f"m ({run['output']}/last.pth)", policy, size, top1 + run["seed"] * bump) for run in runs
            for policy, at in ({None: ape} if run["model"] == "ape" else rope).items()
            for size, top1 in zip((64, 128), at, strict=True)]


def make_v1(root: Path) -> Path:
    """v1's layout: two models x two seeds in one results.json, runs.json without baselines."""
    runs = [{"name": f"{model}_s{seed}", "model": model, "label": label, "seed": seed,
             "output": f"output/study/{model}_s{seed}"}
            for model, label in (("ape", "APE (timm ViT)"), ("mixed", "RoPE-Mixed")) for seed in (0, 1)]
    rows = scores(runs, 2.0, (50.0, 30.0), {"extrapolate": (52.0, 40.0), "interpolate": (52.0, 48.0)})
    return write_runs(root, runs, {"": rows})


def test_write_study_updates_the_readme_section_only(tmp_path):
    root = make_v1(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{study.study_begin(root)}\nstale table\n{study.STUDY_END}\nreading\n")
    section = study.write_study(root, readme, plots=False)
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
    study.write_study(root, readme, plots=False)
    text = readme.read_text()
    assert f"{other}\nkeep me\n{study.STUDY_END}\n" in text and "\nold\n" not in text


def test_write_study_needs_the_readme_markers(tmp_path):
    root = make_v1(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no study section"):
        study.write_study(root, readme, plots=False)


def test_evaluations_must_share_a_protocol(tmp_path):
    root = make_v2(tmp_path / "results")
    set_protocol([root / "eval" / "ape" / "results.json"], "crop 0.875")
    with pytest.raises(ValueError, match="different protocols"):
        study.write_study(root, plots=False)


def test_an_arm_trained_on_normalised_coordinates_is_read_under_its_own_policy(tmp_path):
    """DINOv3's RoPE is trained with ``normalized`` positions (runs.json ``as_trained``): that policy, not
    ``extrapolate``, is its positions as trained in every table and in the verdict."""
    runs = [{"name": f"{arm}_s{seed}", "model": arm, "seed": seed, "output": f"out/{arm}_s{seed}",
             "label": label, "baseline": baseline, **extra}
            for arm, label, baseline, extra in (("ape", "APE", None, {}),
                                                ("dinov3", "DINOv3 RoPE", "ape", {"as_trained": "normalized"}))
            for seed in (0, 1)]
    rows = scores(runs, 0.5, (50.0, 45.0), {"normalized": (60.0, 60.0), "extrapolate": (60.0, 20.0)})
    root = write_runs(tmp_path / "results", runs, {"ape": rows[:4], "dinov3": rows[4:]})
    section = study.write_study(root, goal=goal.Goal(hold=(2.0,), beat=(2.0,)), plots=False)
    as_trained = section.split("**Positions as trained**")[1].split("**Every resolution policy**")[0]
    assert "| DINOv3 RoPE | normalized | **60.25 ± 0.2** | 60.25 ± 0.2 |" in as_trained
    assert "| DINOv3 RoPE | extrapolate |" not in as_trained
    assert "| DINOv3 RoPE | 60.25 | 60.25 (+0.0) | 60.25 (+0.0, normalized) |" in section
    verdict = section.split("**Does RoPE hold its accuracy?**")[1]
    assert "| DINOv3 RoPE | 60.25 ± 0.2 | 60.25 ± 0.2 (+0.0) | +15.0 (apart) | yes |" in verdict


def test_machines_recorded_by_arm_in_earlier_files_stand_for_every_run_of_it():
    runs = [{"name": f"{arm}_s{seed}", "model": arm} for arm in ("ape", "axial") for seed in (0, 1)]
    there, other = {"cpu": "there"}, {"cpu": "other"}
    assert study.machines_by_run({"axial": there, "ape_s1": other}, runs) == {
        "axial_s0": there, "axial_s1": there, "ape_s1": other}
