"""``benchmarks/pipeline.py`` with ``--source`` on the tiny folder: the same images from shards and from a dataset
timed beside the folder in one run, each against it, and their reading alone."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from benchmarks import pipeline
from helpers.training import TINY_MODEL
from vit_rope.data.shard_writer import write_shards


def test_other_sources_are_timed_against_the_folder_in_the_same_run(image_root: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_shards(image_root, tmp_path / "shards", 5, ["train", "val"])
    datasets.load_dataset("imagefolder", data_dir=str(image_root)).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "tiny.yaml").write_text(f"base: {Path(pipeline.__file__).parents[1] / 'configs' / 'base.yaml'}\n"
                                        f"model: {TINY_MODEL}\nmodel_kwargs: {{depth: 1}}\nimg_size: 32\n"
                                        "batch_size: 4\nworkers: 0\ndevice: cpu\n")
    out = tmp_path / "sources.json"
    assert pipeline.main(["-c", str(tmp_path / "tiny.yaml"), "--pipeline", "timm", "--rounds", "2", "--steps", "1",
                          "--source", f"wds/tiny={tmp_path / 'shards'}", f"hfds/tiny={tmp_path / 'hf'}",
                          "--json", str(out), f"data_dir={image_root}"]) == 0
    result = json.loads(out.read_text())
    assert set(result["source_ratio"]) == {"timm wds/tiny", "timm hfds/tiny"}
    assert all(ratio > 0 for ratio in result["source_ratio"].values())
    assert set(result["read_images_per_s"]) == {"timm", "timm wds/tiny", "timm hfds/tiny"}
    with pytest.raises(SystemExit):
        pipeline.main(["-c", str(tmp_path / "tiny.yaml"), "--pipeline", "tensor", "--source", "wds/x=y"])
