"""What a load did (``vit_rope.models.load_report``): the report's reading of its initialised weights. The one warning
an incomplete load gives, and a complete one's silence, are test_checkpoint.py's (through every loader)."""

from __future__ import annotations

import torch

from vit_rope.models.load_report import LAYERSCALE, ROPE_FREQS, LoadReport, report


def test_report_lists_loaded_keys_as_those_not_initialised_and_drops_empty_reasons():
    state = {name: torch.zeros(1) for name in ("a", "b", "freqs", "head.weight", "head.bias")}
    made = report("w.pth", state, {ROPE_FREQS: ["freqs"], LAYERSCALE: [], "new head (3 -> 10 classes)":
                                   ["head.weight", "head.bias"]})
    assert made.source == "w.pth" and made.loaded == ("a", "b")
    assert set(made.initialised) == {ROPE_FREQS, "new head (3 -> 10 classes)"}  # LayerScale's reason had no key
    assert not made.rope_freqs_loaded and made.head_reason == "new head (3 -> 10 classes)"
    complete = report(None, state, {})
    assert complete.rope_freqs_loaded and complete.head_reason is None and complete.summary() == ""


def test_summary_names_few_keys_and_counts_many():
    many = tuple(f"blocks.{i}.ls1.gamma" for i in range(6))
    made = LoadReport("w.pth", (), {ROPE_FREQS: ("freqs",), LAYERSCALE: many})
    assert made.summary() == (f"{ROPE_FREQS} (freqs); {LAYERSCALE} (blocks.0.ls1.gamma, ..., blocks.5.ls1.gamma: "
                              "6 tensors)")
