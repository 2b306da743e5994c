"""``scripts/data_sources_demo.py`` on the tiny folder: it writes the shards and the dataset, trains from all three
sources, and summarises each source's top-1 against its seeds; a second call trains nothing again."""

from __future__ import annotations

import json
from pathlib import Path

import data_sources_demo

from helpers.training import TINY_MODEL


def test_every_source_trains_once_and_is_summarised(image_root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["--data-dir", str(image_root), "--seeds", "0", "1", "--out", str(tmp_path / "out"), "--results",
            str(tmp_path / "results"), f"model={TINY_MODEL}", "model_kwargs={depth: 1}", "img_size=32", "epochs=1",
            "warmup_epochs=0", "batch_size=8", "cache_dir=null", "device=cpu", "threads=1", "log_interval=0"]
    assert data_sources_demo.main(argv) == 0
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert set(summary["top1"]) == {"folder", "wds", "hfds"}
    assert all(set(runs) == {"0", "1"} for runs in summary["top1"].values())
    for name, runs in summary["top1"].items():
        assert summary["seed_range"][name] == max(runs.values()) - min(runs.values())
    trained = {run: (tmp_path / "out" / run / "last.pth").stat().st_mtime_ns for run in ("folder_s0", "hfds_s1")}
    assert data_sources_demo.main(argv) == 0  # finished runs are kept
    assert trained == {run: (tmp_path / "out" / run / "last.pth").stat().st_mtime_ns for run in trained}
