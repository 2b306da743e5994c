"""A study's runs and evaluations as every report reads them (``studies.results``): rows belong to a run by their
checkpoint, arms merge their seeds under one label in ``runs.json``'s order, and positions as trained follow the arm's
own policy; the docs sections the study script rewrites."""

import pytest

from helpers.studies import write_results as write
from studies import results
from vit_rope.eval import report


def run(arm: str, seed: int, **extra: str) -> dict:
    return {"name": f"{arm}_s{seed}", "model": arm, "seed": seed, "output": f"out/{arm}_s{seed}", **extra}


def row(entry: dict, policy: str | None, size: int, top1: float, checkpoint: str = "last.pth") -> dict:
    return {"model": f"m ({entry['output']}/{checkpoint})", "policy": policy, "img_size": size, "train_size": 64,
            "top1": top1, "top5": 90.0}


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


def evaluated(model: str, policy: str | None, top1: float, **fields) -> dict:
    return {"model": model, "policy": policy, "img_size": 64, "train_size": 64, "top1": top1, "top5": 90.0,
            "loss": 1.0, "images_per_s": 100.0, **fields}


def test_merge_seeds_gives_mean_and_range_and_one_seed_no_spread():
    rows = [evaluated("a s0", "yarn", 50.0), evaluated("a s1", "yarn", 54.0), evaluated("other", "yarn", 1.0)]
    (merged,) = results.merge_seeds(rows, {"a s0": "A", "a s1": "A"})
    assert merged["model"] == "A" and merged["seeds"] == 2
    assert (merged["top1"], merged["top1_min"], merged["top1_max"]) == (52.0, 50.0, 54.0)
    assert "52.00 ± 2.0" in report.markdown_table([merged])
    (single,) = results.merge_seeds(rows[:1], {"a s0": "A"})  # ``± 0.0`` would read as seeds that agree
    assert single["seeds"] == 1 and "| A | yarn | **50.00** |" in report.markdown_table([single])


def test_a_token_budget_merges_apart_from_the_size_of_its_token_count():
    """196 tokens of 16 px patches plot at 224 px, but they are a seed-merged row of their own."""
    rows = [evaluated(f"m{seed}", None, 70.0 + seed, train_size=224, **fields)
            for seed in (0, 2) for fields in ({"img_size": 224, "seq_len": None},
                                              {"img_size": None, "seq_len": 196, "patch_size": [16, 16]})]
    merged = results.merge_seeds(rows, {"m0": "m", "m2": "m"})
    assert [(row["img_size"], row.get("seq_len"), row["top1"], row["seeds"]) for row in merged] == \
        [(224, None, 71.0, 2), (None, 196, 71.0, 2)]
    assert report.markdown_table(merged).splitlines()[2] == "| m | - | **71.00 ± 1.0** | **71.00 ± 1.0** |"


def test_replace_section_keeps_the_page_around_it_and_leaves_pages_without_it_alone(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("top\n<!-- a -->\nold\n<!-- b -->\nbottom <!-- b -->\n")
    assert results.replace_section(page, "<!-- a -->", "<!-- b -->", "new\nlines")
    assert page.read_text() == "top\n<!-- a -->\nnew\nlines\n<!-- b -->\nbottom <!-- b -->\n"
    for text in ("top\n", "<!-- b -->\n<!-- a -->\n"):  # no begin; an end only before it
        page.write_text(text)
        assert not results.replace_section(page, "<!-- a -->", "<!-- b -->", "new") and page.read_text() == text
