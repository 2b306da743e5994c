"""``benchmarks/official_kinds.py`` without the official code (which stays out of this repository): the arguments
are checked before anything is built, a run through ``main`` with a stand-in 'official' side (a copy of our tiny LieRE
attention stack) writes its parity check and a row per mode with both sides' images/s and the ratio's verdict, a
stand-in that computes something else is refused before any timing, and the saved command names no checkout path."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from benchmarks import official_kinds
from benchmarks.official_kinds import Pair, Widths
from vit_rope.encodings.generators.liere import LieRE

TINY = Widths(dim=32, heads=2, depth=2, mlp=64, img_size=64)


def stand_in(root: Path, kind: str, widths: Widths, batch: int) -> Pair:
    """Our tiny LieRE attention stack against a copy of itself as the 'official' side."""
    encoding = LieRE(TINY.depth, TINY.heads, TINY.dim // TINY.heads, (TINY.grid,) * 2, generator_dim=4)
    ours = official_kinds.OurAttention(encoding, TINY, qkv_bias=False)
    return Pair(ours, copy.deepcopy(ours), torch.randn(batch, 1 + TINY.grid**2, TINY.dim), "stand-in")


def checkout(tmp_path: Path, repo: str) -> Path:
    """A folder holding the file that ``parse`` looks for in a checkout of ``repo``."""
    marker = tmp_path / repo / official_kinds.REPOS[repo][1]
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    return tmp_path / repo


@pytest.mark.parametrize("argv, message", [
    ([], "at least one official checkout"),
    (["--liere", "."], "no models/rope_vit.py"),
    (["--liere", "{liere}", "--kinds", "pape"], "none of --kinds"),
    (["--liere", "{liere}", "--rounds", "0"], "--rounds must be at least 1"),
])
def test_the_arguments_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                   message: str) -> None:
    liere = checkout(tmp_path, "liere")
    with pytest.raises(SystemExit):
        official_kinds.main([word.format(liere=liere) for word in argv])
    assert message in capsys.readouterr().err


def test_a_stand_in_run_writes_parity_rows_and_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       run_benchmark: Callable) -> None:
    monkeypatch.setitem(official_kinds.BUILDERS, "liere", stand_in)
    liere = checkout(tmp_path, "liere")
    result = run_benchmark(official_kinds.main, ["--liere", str(liere), "--batch-size", "2", "--rounds", "2",
                                                 "--steps", "1", "--warmup", "0"])
    assert result["machine"]["command"].startswith("benchmarks/official_kinds.py --liere <LieRE> ")
    assert result["official"]["liere"]["commit"] is None  # no git work tree
    assert result["parity"]["liere"]["max_abs_diff_train"] == 0.0
    rows = {(row["kind"], row["mode"]): row for row in result["rows"]}
    assert set(rows) == {("liere", mode) for mode in official_kinds.MODES}
    for row in rows.values():
        assert row["ours_images_per_s"] > 0 and row["official_images_per_s"] > 0 and row["ratio"] > 0
        assert len(row["ours_rounds"]) == len(row["official_rounds"]) == 2
        assert row["target"] == official_kinds.TARGET and isinstance(row["pass"], bool)


def test_a_side_that_computes_something_else_is_refused() -> None:
    pair = stand_in(Path("."), "liere", TINY, 2)
    with torch.no_grad():
        pair.official.layers[1].proj.bias.add_(1e-2)
    with pytest.raises(AssertionError, match="infer"):
        official_kinds.parity(pair)


def test_an_official_module_must_come_from_its_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the checkout put on the path for this test only
    with pytest.raises(ImportError, match="not from the checkout"):
        official_kinds.import_official(tmp_path, "json")


def test_the_command_names_repositories_not_paths() -> None:
    root = official_kinds.ROOT
    argv = ["--comrope", "/somewhere/ComRoPE", "--pape=/elsewhere/pape", "--json", str(root / "results" / "x.json")]
    checkouts = {"comrope": Path("/somewhere/ComRoPE"), "pape": Path("/elsewhere/pape")}
    assert official_kinds.command_line(argv, checkouts) == (
        "benchmarks/official_kinds.py --comrope <ComRoPE> --pape=<parabolic-position-encoding> --json results/x.json")
