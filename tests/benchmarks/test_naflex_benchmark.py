"""Smoke run of ``benchmarks/naflex.py``: a 1-block run of every contender on a tiny NaFlex batch writes every run,
mode and ratio with positive numbers, so the full measurement (minutes on a quiet machine) cannot fail at its end."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks import naflex


def test_a_tiny_run_writes_every_contender_and_ratio(run_benchmark: Callable) -> None:
    # L = 18 pads: the 1:1 image fits as 4x4 patches, the 1:4 one as 2x9
    result = run_benchmark(naflex.main, ["--depth", "1", "--rounds", "1", "--warmup", "0", "--seq-lens", "18",
                                         "--batch-size", "2"])
    rows = {(row["run"], row["mode"]): row for row in result["rows"]}
    assert set(rows) == {(run, mode) for run in [*naflex.CONTENDERS, *naflex.SQUARE] for mode in naflex.MODES}
    assert rows["ours_mixed", "train"]["valid_tokens"] == 16 + 18
    for row in rows.values():
        assert row["seconds"] > 0 and row["tokens_per_s"] > 0
        assert row["mode"] == "infer" or row["activation_mib"] > 0
    ratios = {(ratio["ratio"], ratio["mode"]) for ratio in result["ratios"]}
    assert ratios == {(name, mode) for name, *_ in naflex.SPEED_TARGETS for mode in naflex.MODES} | {
        (name, "memory") for name, *_ in naflex.MEMORY_TARGETS}
    for ratio in result["ratios"]:
        assert ratio["value"] > 0
        assert ratio["pass"] is None if ratio["target"] is None else isinstance(ratio["pass"], bool)
    assert {ratio["ratio"] for ratio in result["ratios"] if ratio["target"] is None} == {
        "timm_learned / timm_mixed (no RoPE cost)", "timm_learned / timm_axial (no RoPE cost)"}
