"""Smoke run of ``benchmarks/throughput.py --family kinds``: 1-block models at two tiny sizes (32 and 64 px, batch 1)
write every kind's row with positive numbers, the targets, and a PASS / MISS boolean wherever a target applies, and
STRING's timed inference reuses its folded basis (the cost the target is about); every kind has a target at the
issue's two sizes (224 and 448 px), axial none. The smoke run's weights are zeros: no row, target or fold it checks
depends on their values, and drawing them for every model of every setting took a third of its time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch

from benchmarks import throughput
from helpers.training import zero_inits
from vit_rope.layers import attention


def test_a_tiny_kinds_run_writes_every_row_and_target(run_benchmark: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    zero_inits(monkeypatch)
    result = run_benchmark(throughput.main, ["--family", "kinds", "--depth", "1", "--img-sizes", "32", "64",
                                             "--batch-sizes", "1", "1", "--rounds", "1", "--steps", "1", "--warmup",
                                             "0", "--device", "cpu"])
    assert result["machine"]["batch_sizes"] == [1, 1]
    assert len(result["targets"]) == len(throughput.TARGETS["kinds"])
    rows = {(row["model"], row["img_size"], row["mode"]): row for row in result["rows"]}
    models = throughput.FAMILIES["kinds"]
    assert set(rows) == {(model, size, mode) for model in models for size in (32, 64) for mode in ("infer", "train")}
    for (model, size, mode), row in rows.items():
        assert row["images_per_s"] > 0 and row["ratio"] > 0
        assert mode == "infer" or row["activation_mib"] > 0
        assert ("target" in row) == (throughput.target("kinds", model, size, mode) is not None)
        assert "target" not in row or isinstance(row["pass"], bool)
        string_infer = "string" in model and mode == "infer"
        assert row.get("string_fold_reused") is (True if string_infer else None)
    assert all((throughput.target("kinds", model, size, mode) is None) == (model == models[0])
               for model in models for size in (224, 448) for mode in ("infer", "train"))


def graph_nodes(loss) -> set[str]:
    """The names of every autograd node behind ``loss``."""
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def test_a_reference_model_rotates_by_the_reference_and_the_fused_rotation_comes_back() -> None:
    """``NAME@reference`` runs ``NAME`` with q and k rotated by the reference ``apply_rope`` (what the fused rotation
    and its autograd Function are measured against): the same loss, no fused node in its graph, and the fused
    rotation back after the call."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1, img_size=32, init_values=1.0)
    images = torch.randn(2, 3, 32, 32)
    fused, reference = (throughput.make_step(model, images, "train", False, ref)() for ref in (False, True))
    assert attention.rotated_projection is not throughput.reference_projection
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-5)
    assert "_ProjectRotateQKBackward" in graph_nodes(fused)
    assert not any("ProjectRotateQK" in name for name in graph_nodes(reference))
