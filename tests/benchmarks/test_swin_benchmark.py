"""Smoke run of ``benchmarks/swin.py --smoke``: timm's Swin, ours and the official code of each kind (checked equal on
the same weights before timing) in both modes, with ratios to timm's and the official's and memory in training."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import swin


def test_the_smoke_run_times_every_model_against_both_references(tmp_path: Path) -> None:
    out = tmp_path / "swin.json"
    assert swin.main(["--smoke", "--img-size", "56", "--batch-size", "2", "--rounds", "1", "--steps", "1",
                      "--warmup", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["targets"] == swin.TARGETS
    rows = {(row["model"], row["mode"]): row for row in result["rows"]}
    names = {swin.BASELINE, swin.BOUND,
             *(f"{side}_{kind}_tiny" for side in ("swin_rope", "official") for kind in swin.KINDS)}
    assert set(rows) == {(name, mode) for name in names for mode in ("infer", "train")}
    assert all(row["images_per_s"] > 0 for row in rows.values())
    assert rows[swin.BASELINE, "infer"]["ratio"] == 1.0
    for kind in swin.KINDS:
        ours = rows[f"swin_rope_{kind}_tiny", "train"]
        assert ours["ratio_to_official"] > 0 and ours["sense"] == ">=" and ours["official"]["target"] == 1.2
        assert ours["activation_mib"] > 0 and ours["memory"]["sense"] == "<="
    assert all(rows[swin.BOUND, mode]["ratio_to_official"] > 0 for mode in ("infer", "train"))


def test_the_bound_keeps_the_projections_and_passes_the_values_through() -> None:
    attention = swin.official.WindowAttention(16, window_size=(2, 2), num_heads=2)
    bound, x = swin.NoAttention(attention), torch.randn(3, 4, 16)
    values = attention.qkv(x)[..., 32:]  # [q | k | v] along the channels
    torch.testing.assert_close(bound(x, mask=torch.zeros(1, 4, 4)), attention.proj(values))
