"""Smoke run of ``benchmarks/probes.py``: a 1-block run at one size and a small bank writes every call, ratio and
probe step with positive numbers, so the full measurement cannot fail at its end."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks import probes


def test_a_tiny_run_writes_every_call_ratio_and_step(run_benchmark: Callable) -> None:
    result = run_benchmark(probes.main, ["--img-sizes", "32", "--batch-size", "2", "--depth", "1", "--rounds", "1",
                                         "--bank", "50", "--queries", "20", "--width", "8"])
    assert {(row["img_size"], row["call"]) for row in result["rows"]} == {(32, call) for call in probes.CALLS}
    assert {ratio["ratio"] for ratio in result["ratios"]} == {"features / classifier", "both / classifier"}
    assert {(row["width"], row["step"]) for row in result["probes"]} == {(8, "knn"), (8, "linear fit")}
    assert all(row["images_per_s"] > 0 for row in result["rows"])
    assert all(row["value"] > 0 and isinstance(row["pass"], bool) for row in result["ratios"])
    assert all(row["seconds"] > 0 and isinstance(row["pass"], bool) for row in result["probes"])
