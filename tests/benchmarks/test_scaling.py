"""Smoke run of ``benchmarks/scaling.py --smoke``: axial and timm's APE DeiT-III in their own worker processes at 32
px (inference and training) write every row with positive seconds and memory, axial's ratios 1, and the plot; and a
row's targets read PASS, MISS, or MISS where the model failed. A bias kind (LookHere) against axial: the GPU check's
tiny scaling step (tests/scripts/test_gpu_check.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from benchmarks import scaling


def test_the_smoke_run_writes_every_row_and_the_plot(tmp_path: Path, run_benchmark: Callable) -> None:
    result = run_benchmark(scaling.main, ["--smoke", "--plot", str(png := tmp_path / "scaling.png")])  # and complete
    assert len(result["targets"]) == len(scaling.TARGETS)
    assert "/" not in result["machine"]["command"].split("--json ")[1].split()[0]  # no machine path
    rows = {(row["kind"], row["mode"], row["img_size"]): row for row in result["rows"]}
    assert set(rows) == {(kind, mode, size) for kind in ("axial", "ape")
                         for mode, size in (("infer", 32), ("train", 32))}
    for (kind, _, _), row in rows.items():
        assert not row["failed"] and row["error"] is None and row["model"] == scaling.model_name(kind)
        assert row["seconds"] > 0 and row["mib"] > 0 and row["time_ratio"] > 0 and row["memory_ratio"] > 0
        assert kind != "axial" or row["time_ratio"] == row["memory_ratio"] == 1
    assert png.exists() == (importlib.util.find_spec("matplotlib") is not None)
    assert result["plot"] == ("scaling.png" if png.exists() else None)


def test_targets_pass_miss_and_fail() -> None:
    base = [{"seconds": 1.0, "mib": 100.0}] * 3
    fast = scaling.summarise("golden", "infer", 1344, 1, [{"seconds": 1.2, "mib": 150.0}] * 3, base)
    slow = scaling.summarise("golden", "infer", 1344, 1, [{"seconds": 1.4, "mib": 150.0}] * 3, base)
    failed = scaling.summarise("alibi", "infer", 2048, 1, [{"error": "MemoryError: x"}] * 3, base)
    assert fast["pass"] and [check["metric"] for check in fast["checks"]] == ["time", "memory"]
    assert not slow["pass"] and slow["time_ratio"] == 1.4
    assert not failed["pass"] and failed["failed"] and failed["error"] == "MemoryError: x"
    assert "pass" not in scaling.summarise("axial", "infer", 1344, 1, base, base)
