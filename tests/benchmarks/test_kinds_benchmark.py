"""Smoke run of ``benchmarks/throughput.py --family kinds``: 1-block models at the issue's two sizes (224 and 448
px, batch 1) write every kind's row with positive numbers, the targets, and a PASS / MISS boolean wherever a target
applies, and STRING's timed inference reuses its folded basis (the cost the target is about)."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks import throughput


def test_a_tiny_kinds_run_writes_every_row_and_target(run_benchmark: Callable) -> None:
    result = run_benchmark(throughput.main, ["--family", "kinds", "--depth", "1", "--img-sizes", "224", "448",
                                             "--batch-sizes", "1", "1", "--rounds", "1", "--steps", "1", "--warmup",
                                             "0", "--device", "cpu"])
    assert result["machine"]["batch_sizes"] == [1, 1]
    assert len(result["targets"]) == len(throughput.TARGETS["kinds"])
    rows = {(row["model"], row["img_size"], row["mode"]): row for row in result["rows"]}
    models = throughput.FAMILIES["kinds"]
    assert set(rows) == {(model, size, mode) for model in models for size in (224, 448) for mode in ("infer", "train")}
    for (model, _, mode), row in rows.items():
        assert row["images_per_s"] > 0 and row["ratio"] > 0
        assert mode == "infer" or row["activation_mib"] > 0
        assert ("target" in row) == (model != models[0])  # every kind has a target at both sizes, axial none
        assert "target" not in row or isinstance(row["pass"], bool)
        string_infer = "string" in model and mode == "infer"
        assert row.get("string_fold_reused") is (True if string_infer else None)
