"""Smoke run of ``benchmarks/probes.py``: a 1-block run at one size, a small random bank and a tiny checkpoint's
features write every call, ratio and probe step with positive numbers, so the full measurement cannot fail at its
end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks import probes
from helpers.evaluation import write_checkpoint


def test_a_tiny_run_writes_every_call_ratio_and_step(run_benchmark: Callable, image_root: Path,
                                                     tmp_path: Path) -> None:
    checkpoint = str(write_checkpoint(tmp_path / "best.pth"))
    result = run_benchmark(probes.main, ["--img-sizes", "32", "--batch-size", "2", "--depth", "1", "--rounds", "1",
                                         "--bank", "50", "--queries", "20", "--width", "8", "--checkpoint",
                                         checkpoint, "--data-dir", str(image_root), "--real-sizes", "32"])
    assert {(row["img_size"], row["call"]) for row in result["rows"]} == {(32, call) for call in probes.CALLS}
    assert {ratio["ratio"] for ratio in result["ratios"]} == {"features / classifier", "both / classifier"}
    assert {(row["features"], row["bank"], row["queries"], row["step"]) for row in result["probes"]} == {
        (name, bank, queries, step) for name, bank, queries in (("random, width 8", 50, 20),
                                                                (f"{checkpoint}, 32 px", 24, 12))
        for step in ("knn", "linear fit")}
    assert all(row["images_per_s"] > 0 for row in result["rows"])
    assert all(row["value"] > 0 and isinstance(row["pass"], bool) for row in result["ratios"])
    assert all(row["seconds"] > 0 and isinstance(row["pass"], bool) for row in result["probes"])
    assert all(0 <= row["knn_top1"] <= 100 for row in result["probes"] if row["bank"] == 24)
