"""Seed merging (``vit_rope.eval.report.merge_seeds``): mean and range over seeds."""

from vit_rope.eval import report


def result(model: str, policy: str | None, size: int, top1: float) -> dict:
    return {"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1, "top5": 90.0,
            "loss": 1.0, "images_per_s": 100.0}


def test_merge_seeds_gives_mean_and_range():
    rows = [result("a s0", "yarn", 64, 50.0), result("a s1", "yarn", 64, 54.0), result("other", "yarn", 64, 1.0)]
    (merged,) = report.merge_seeds(rows, {"a s0": "A", "a s1": "A"})
    assert merged["model"] == "A" and merged["seeds"] == 2
    assert (merged["top1"], merged["top1_min"], merged["top1_max"]) == (52.0, 50.0, 54.0)
    assert "52.00 ± 2.0" in report.markdown_table([merged])


def test_one_seed_shows_no_spread():
    """``± 0.0`` would read as seeds that agree; one seed has no range to show."""
    (merged,) = report.merge_seeds([result("a s0", "yarn", 64, 50.0)], {"a s0": "A"})
    assert merged["seeds"] == 1
    assert "| A | yarn | **50.00** |" in report.markdown_table([merged])


def test_replace_section_keeps_the_page_around_it_and_leaves_pages_without_it_alone(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("top\n<!-- a -->\nold\n<!-- b -->\nbottom <!-- b -->\n")
    assert report.replace_section(page, "<!-- a -->", "<!-- b -->", "new\nlines")
    assert page.read_text() == "top\n<!-- a -->\nnew\nlines\n<!-- b -->\nbottom <!-- b -->\n"
    for text in ("top\n", "<!-- b -->\n<!-- a -->\n"):  # no begin; an end only before it
        page.write_text(text)
        assert not report.replace_section(page, "<!-- a -->", "<!-- b -->", "new") and page.read_text() == text
