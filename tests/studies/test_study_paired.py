"""Arms set against the same model trained another way in another study (``studies.paired``), read through the
report that prints them: each change from the training size here, there, and their difference, at every crop both
studies were evaluated at."""

import shutil
from pathlib import Path

import pytest

from helpers.studies import arm_runs, set_protocol, write_runs
from studies import goal, paired
from studies import report as study


def make_study(root: Path, top1: dict[str, tuple[float, float, float]], folder: str = "out") -> Path:
    """A study with arms ``ape`` (APE) and ``mixed`` (RoPE, baseline ``ape``), 2 seeds each (seed 1 one point up),
    evaluated at 64 (the training size), 128 and 160 px with positions as trained."""
    return write_runs(root, *arm_runs(top1, (64, 128, 160), folder))


def pairs(other: Path) -> list[paired.Pair]:
    return [paired.Pair(arm, goal.Control(f"other {arm}", other, arm)) for arm in ("mixed", "ape")]


def section_of(text: str) -> str:
    return text.split("**Against the same model in another study**", 1)[1].split("\n\n", 2)[1]


def test_each_change_is_set_against_the_other_studys_and_the_difference_is_read_off(tmp_path):
    # here (say, less data) RoPE loses 10 / 20 points above 64 px where the other study's lost 4 / 8; APE the same
    # in both (+1, -2)
    here = make_study(tmp_path / "here", {"ape": (50.0, 51.0, 48.0), "mixed": (52.0, 42.0, 32.0)})
    there = make_study(tmp_path / "there", {"ape": (60.0, 61.0, 58.0), "mixed": (62.0, 58.0, 54.0)})
    table = section_of(study.write_study(here, pairs=pairs(there), plots=False))
    assert "| model | against | top-1 at training size | change at 128 | change at 160 |" in table
    assert "| MIXED | other mixed | 52.50 ± 0.5 / 62.50 ± 0.5 | -10.0 / -4.0 (-6.0) | -20.0 / -8.0 (-12.0) |" in table
    assert "| APE | other ape | 50.50 ± 0.5 / 60.50 ± 0.5 | +1.0 / +1.0 (+0.0) | -2.0 / -2.0 (+0.0) |" in table


def test_no_table_until_an_arm_of_a_pair_is_evaluated_and_only_at_crops_the_other_has(tmp_path):
    there = make_study(tmp_path / "there", {"ape": (60.0, 61.0, 58.0), "mixed": (62.0, 58.0, 54.0)})
    without = make_study(tmp_path / "without", {"ape": (50.0, 51.0, 48.0)})  # arm "mixed" not evaluated yet
    section = study.write_study(without, pairs=pairs(there)[:1], plots=False)  # the pair of arm mixed
    assert "Against the same model" not in section
    here = make_study(tmp_path / "here", {"ape": (50.0, 51.0, 48.0), "mixed": (52.0, 42.0, 32.0)})
    shutil.copytree(here / "eval", here / "eval_crop0.875")
    set_protocol((here / "eval_crop0.875").rglob("results.json"), "crop 0.875")
    main, crop = study.write_study(here, pairs=pairs(there), plots=False).split("**At crop 0.875**", 1)
    assert "Against the same model" in main and "Against the same model" not in crop  # "there" has no crop 0.875


def test_a_counterpart_never_evaluated_is_an_error_that_names_it(tmp_path):
    here = make_study(tmp_path / "here", {"ape": (50.0, 51.0, 48.0), "mixed": (52.0, 42.0, 32.0)})
    there = make_study(tmp_path / "there", {"ape": (60.0, 61.0, 58.0)})
    with pytest.raises(ValueError, match=r"holds no evaluated run of arm 'mixed', the control 'other mixed'"):
        study.write_study(here, pairs=pairs(there), plots=False)
