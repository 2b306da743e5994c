"""Smoke run of ``benchmarks/twins.py``: a 1-block run of every family at an eighth of its native input writes every
row and ratio with positive numbers and PASS / MISS booleans, and both models of every family run SDPA, ours with the
fused rotation wherever the blocks allow it, so the full measurement (tens of minutes on a quiet machine) cannot fail
at its end or compare unlike attention paths. The weights are zeros: what is checked is the rows, ratios and
attention paths, which no weight value decides, and drawing random weights (a 73M-parameter aligner among them) took
a third of the run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benchmarks import twins
from helpers.training import zero_inits

QK_NORMS = {"sapiens2", "gemma4"}  # the families whose blocks normalise q and k


def test_a_tiny_run_writes_every_family_row_and_ratio(run_benchmark: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    zero_inits(monkeypatch)
    result = run_benchmark(twins.main, ["--depth", "1", "--scale", "0.125", "--batch-size", "1", "--rounds", "1",
                                        "--warmup", "0"])
    rows = {(row["family"], row["run"], row["mode"]): row for row in result["rows"]}
    assert set(rows) == {(family, run, mode) for family in twins.FAMILIES for run in ("timm", "twin")
                         for mode in twins.MODES}
    assert rows["sapiens2", "timm", "train"]["img_size"] == [128, 96]  # non-square, in whole 16 px patches
    for (family, run, mode), row in rows.items():
        assert row["images_per_s"] > 0 and row["blocks"] == row["sdpa_blocks"] == 1
        assert mode == "infer" or row["activation_mib"] > 0
        if run == "twin":  # Sapiens2 and Gemma 4 rotate after their q/k norms; the others fuse it into the projection
            assert row["fused_rotation_blocks"] == (family not in QK_NORMS)
            assert row["qk_norm_blocks"] == (family in QK_NORMS)
            assert row["model"].startswith("vit_rope_")
    ratios = {(ratio["family"], ratio["ratio"]) for ratio in result["ratios"]}
    assert len(result["ratios"]) == 3 * len(twins.FAMILIES) and len(ratios) == 2 * len(twins.FAMILIES)
    assert all(ratio["value"] > 0 and isinstance(ratio["pass"], bool) for ratio in result["ratios"])
