"""``benchmarks/grad_checkpointing.py`` on a tiny ViT: every setting timed in one run, and the activations kept for
backward shrink as more blocks are checkpointed."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import grad_checkpointing


def test_checkpointing_more_blocks_keeps_fewer_activations(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    assert grad_checkpointing.main(["--model", "vit_rope_tiny_patch16_mixed_224", "--img-size", "32",
                                    "--batch-size", "2", "--rounds", "1", "--device", "cpu",
                                    "--model-kwargs", '{"depth": 2}', "--json", str(out)]) == 0
    rows = {row["setting"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == list(grad_checkpointing.SETTINGS)
    assert rows["none"]["ratio"] == 1.0 and all(row["images_per_s"] > 0 for row in rows.values())
    kept = [rows[name]["activation_mib"] for name in ("none", "every 2nd block", "every block")]
    assert kept[0] > kept[1] > kept[2] > 0
