"""``train.py`` and ``vit_rope.evaluate`` on WebDataset shards and on a Hugging Face dataset (``dataset`` setting):
every pipeline trains from them, a run of two DDP ranks with loader workers killed mid-epoch resumes to the weights
of an uninterrupted one (which checkpoints its blocks), the checkpoint's dataset is what evaluation reads by default,
and settings that do not fit are refused before any data is read; two torchrun launches with the same rendezvous
arguments, as on two machines, train one run. The same DDP ranks train every pipeline from the image folder too."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
import yaml

import train
from helpers.ddp import WORLD, free_port, run_ranks
from helpers.training import DATA_CONFIG, REPO, assert_same_weights, killed_at, metrics, tiny_args
from vit_rope import evaluate
from vit_rope.data import shard_writer as shards
from vit_rope.data.splits import find_split
from vit_rope.data.steps import SizeSchedule
from vit_rope.eval.loading import load_trained
from vit_rope.train import engine, loaders
from vit_rope.train.command_line import build_config

# the per-image pipeline in a loader worker with a size per step and Mixup; the tensor pipeline; timm's NaFlex loader
PIPELINES = {"per_image": ("workers=1", "train_sizes=[32, 48]", "mixup=0.8", "auto_augment=rand-m9-mstd0.5-inc1"),
             "tensor": ("decoded_cache=true", "train_sizes=[32, 48]"),
             "naflex": ("naflex=true", "naflex_seq_lens=[9, 16]")}


@pytest.fixture(autouse=True)
def index_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def shard_dir(image_root: Path, tmp_path: Path) -> Path:
    shards.write_shards(image_root, tmp_path / "shards", 5, ["train", "val"])
    return tmp_path / "shards"


@pytest.fixture
def dataset_dir(image_root: Path, tmp_path: Path) -> Path:
    datasets.load_dataset("imagefolder", data_dir=str(image_root)).save_to_disk(str(tmp_path / "hf"))
    return tmp_path / "hf"


def source_args(kind: str, shard_dir: Path, dataset_dir: Path) -> tuple[str, ...]:
    return {"wds": ("--data-dir", str(shard_dir), "--dataset", "wds/tiny"),  # timm's flag, or dataset=...
            "hfds": ("--data-dir", str(dataset_dir), "dataset=hfds/tiny", "val_split=validation")}[kind]


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("kind", ["wds", "hfds"])
def test_every_pipeline_trains_from_shards_and_datasets(shard_dir: Path, dataset_dir: Path, tmp_path: Path,
                                                        kind: str, pipeline: str, capsys) -> None:
    out = tmp_path / "run"
    assert train.main(tiny_args(tmp_path, out, *source_args(kind, shard_dir, dataset_dir), *PIPELINES[pipeline])) == 0
    assert "24 train / 12 val images, 3 classes" in capsys.readouterr().out
    rows = metrics(out)
    assert len(rows) == 2 and all(float(row["train_loss"]) < 5 for row in rows)
    saved = torch.load(out / "last.pth", weights_only=False)
    assert saved["config"]["dataset"] == f"{kind}/tiny" and saved["classes"] == ["class_0", "class_1", "class_2"]


def test_evaluation_reads_the_checkpoints_dataset_and_split(image_root: Path, shard_dir: Path, dataset_dir: Path,
                                                            tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert train.main(tiny_args(tmp_path, out, *source_args("hfds", shard_dir, dataset_dir), "target_key=label",
                                "--epochs", "1")) == 0
    best = str(out / "best.pth")
    assert load_trained(best).target_key == "label"  # evaluation reads labels where training did
    assert evaluate.main(["--checkpoint", best, "--output", str(tmp_path / "eval"), "--workers", "0"]) == 0
    assert f"hfds/tiny in {dataset_dir} [validation]" in capsys.readouterr().out  # the checkpoint's data_dir
    moved = dataset_dir.rename(tmp_path / "moved")
    assert evaluate.main(["--checkpoint", best, "--output", str(tmp_path / "eval"), "--workers", "0"]) == 2
    assert "--dataset hfds/tiny reads --data-dir, which is not set" in capsys.readouterr().err
    assert evaluate.main(["--checkpoint", best, "--data-dir", str(moved), "--output", str(tmp_path / "eval"),
                          "--workers", "0"]) == 0
    top1 = [row["top1"] for row in metrics(out)][-1]
    report = (tmp_path / "eval" / "results.md").read_text()
    assert f"{float(top1):.2f}" in report  # the run's own validation, repeated
    # the same images as shards, named on the command line: the same accuracy
    assert evaluate.main(["--checkpoint", best, "--data-dir", str(shard_dir), "--dataset", "wds/tiny", "--split",
                          "val", "--output", str(tmp_path / "eval_wds"), "--workers", "0"]) == 0
    assert f"{float(top1):.2f}" in (tmp_path / "eval_wds" / "results.md").read_text()
    # the image folder the shards were written from: named as timm names it
    assert evaluate.main(["--checkpoint", best, "--data-dir", str(image_root), "--dataset", "folder", "--split",
                          "val", "--output", str(tmp_path / "eval_folder"), "--workers", "0"]) == 0
    assert f"{float(top1):.2f}" in (tmp_path / "eval_folder" / "results.md").read_text()


DDP_PIPELINES = {  # from the image folder; a fixed size is the per-image case without its options
    "tensor": PIPELINES["tensor"],
    "timm": ("workers=1", "auto_augment=3a", "reprob=0.25", "train_sizes=[32, 48]"),  # per image, in workers
    "naflex": ("workers=1", "mixup=0.8", "cutmix=1.0", "reprob=0.25", *PIPELINES["naflex"]),
}


def _ddp_runs(rank: int, root: Path, shard_dir: Path, out: Path, ports: list[int]) -> tuple[list[str], list[int]]:
    """On every rank, in one launch: a 1-epoch train.py run of each pipeline from the image folder (what this rank
    printed in each); the shards' train split's indices this rank reads in epoch 1, then train.py from the shards
    uninterrupted with grad_checkpointing (its recomputation replays drop-path's draws), killed mid-epoch and resumed
    without, with two loader workers each and every source of randomness on: the same weights prove both."""
    printed = []
    for port, (pipeline, extra) in zip(ports, DDP_PIPELINES.items(), strict=False):  # the shards: the last 3 ports
        os.environ["MASTER_PORT"] = str(port)
        with contextlib.redirect_stdout(io.StringIO()) as text:
            assert train.main(tiny_args(root, out / pipeline, "--epochs", "1", "--batch-size", "6",
                                        "model_kwargs.depth=1", *extra)) == 0
        printed.append(text.getvalue())
    samples = [find_split(shard_dir, "wds", split)[0] for split in ("train", "val")]
    steps = loaders.build_loaders(build_config(None, ["batch_size=4", "workers=0"]), *samples, DATA_CONFIG, rank,
                                  WORLD)[0].batch_sampler
    indices = [index for step in steps for index, _, _ in step]
    # 12 images per rank in steps of 4 at 48 px: 3 steps per epoch, a checkpoint after step 2
    args = (*source_args("wds", shard_dir, shard_dir), "--img-size", "48", "--batch-size", "4", "workers=2",
            "checkpoint_interval=2", "train_sizes=[32, 48]", "mixup=0.8", "cutmix=1.0",
            "auto_augment=rand-m9-mstd0.5-inc1", "reprob=0.25", "drop_path=0.1", "model_ema=true", "warmup_epochs=1",
            "model_kwargs.depth=1")
    os.environ["MASTER_PORT"] = str(ports[-3])
    assert train.main(tiny_args(out, out / "straight", *args, "grad_checkpointing=true")) == 0
    os.environ["MASTER_PORT"] = str(ports[-2])
    real, engine.Progress.update = engine.Progress.update, killed_at(2, 3)  # after the step-2 checkpoint of epoch 2
    with pytest.raises(KeyboardInterrupt):
        train.main(tiny_args(out, out / "resumed", *args))
    engine.Progress.update = real
    os.environ["MASTER_PORT"] = str(ports[-1])
    assert train.main(tiny_args(out, out / "resumed", *args, "--resume", str(out / "resumed" / "last.pth"))) == 0
    return printed, indices


def test_ddp_ranks_write_each_pipelines_files_split_the_shards_and_resume(image_root: Path, shard_dir: Path,
                                                                          tmp_path: Path) -> None:
    """Two ranks with torchrun's environment, forked (the one real torchrun launch is the two-node test below): from
    the folder, every pipeline writes one set of files and only rank 0 prints; from the shards, the ranks read
    disjoint halves and a killed run resumes to a grad-checkpointed run's weights."""
    ranks = run_ranks(_ddp_runs, tmp_path, image_root, shard_dir, tmp_path,
                      [free_port() for _ in range(len(DDP_PIPELINES) + 3)])
    for index, (pipeline, extra) in enumerate(DDP_PIPELINES.items()):
        out, printed = tmp_path / pipeline, ranks[0][0][index]
        assert sorted(p.name for p in out.iterdir()) == ["best.pth", "config.yaml", "last.pth", "metrics.csv"]
        assert len(metrics(out)) == 1
        assert printed.count("epoch 1/1") == 1 and ranks[1][0][index] == ""  # only rank 0 prints
        assert "2 x cpu" in printed and f"data pipeline: {pipeline} (" in printed
        assert len(torch.load(out / "last.pth", weights_only=True)["rng"]) == 2  # one RNG state per rank
        assert yaml.safe_load((out / "config.yaml").read_text())["epochs"] == 1
        if "train_sizes=[32, 48]" in extra:  # 12 images per rank in batches of 6 at 32 px: 2 steps, at the size drawn
            drawn = [SizeSchedule((32, 48), 32, 6)(0, step)[0] for step in range(2)]
            assert metrics(out)[0]["sizes"] == " ".join(f"{size}:{drawn.count(size)}" for size in sorted(set(drawn)))
    indices = [ranks[0][1], ranks[1][1]]
    assert not set(indices[0]) & set(indices[1])  # 24 images, 2 ranks x 3 steps of 4: every image once
    assert sorted(indices[0] + indices[1]) == list(range(24))
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    assert len(torch.load(tmp_path / "resumed" / "last.pth", weights_only=True)["rng"]) == WORLD
    assert [row["train_loss"] for row in metrics(tmp_path / "straight")] == [
        row["train_loss"] for row in metrics(tmp_path / "resumed")]


@pytest.mark.parametrize("overrides, message", [
    (("dataset=tfds/imagenet",), "dataset 'tfds/imagenet' is not a kind of data"),
    (("dataset=wds/x", "data_dir=null"), "dataset wds/x reads data_dir, which is not set"),
    (("input_key=jpg",), "input_key name where shards or a dataset keep images"),
    (("dataset=wds/x", "val_split=validation"), "has no split 'validation' \\(it has train, val\\); set val_split"),
    (("dataset=wds/x", "train_split=training"), "has no split 'training' \\(it has train, val\\); set train_split"),
])
def test_settings_that_do_not_fit_the_data_are_refused_before_training(shard_dir: Path, tmp_path: Path, capsys,
                                                                       overrides: tuple[str, ...],
                                                                       message: str) -> None:
    assert train.main(tiny_args(shard_dir, tmp_path / "run", *overrides)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run" / "last.pth").exists()


def test_two_nodes_with_the_same_rendezvous_arguments_train_one_run_from_shards(shard_dir: Path,
                                                                                tmp_path: Path) -> None:
    """Two torchrun launches, as on two machines (one process each here), with the same c10d rendezvous arguments:
    they meet, train as ranks 0 and 1 of 2, and only rank 0 writes and prints. The suite's one real torchrun launch
    (the README's way to train on several processes); the DDP test above forks its ranks."""
    out, port = tmp_path / "run", free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_id=test",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "train.py",
               *tiny_args(tmp_path, out, *source_args("wds", shard_dir, shard_dir), "--epochs", "1",
                          "--batch-size", "6", "workers=1", "model_kwargs.depth=1")]
    nodes = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert results[0][1] == results[1][1] == ""  # fresh interpreters: no warning from an import or a library
    printed = results[0][0] + results[1][0]
    assert printed.count("on 2 x cpu") == 1 and printed.count("epoch 1/1") == 1  # rank 0 of 2 alone speaks
    assert printed.count("data pipeline: timm (") == 1
    assert len(torch.load(out / "last.pth", weights_only=True)["rng"]) == 2  # one RNG state per rank
    assert sorted(p.name for p in out.iterdir()) == ["best.pth", "config.yaml", "last.pth", "metrics.csv"]
    assert build_config(out / "config.yaml").epochs == 1
    assert [row["sizes"] for row in metrics(out)] == ["32:2"]  # 12 images per rank in batches of 6


def test_a_dataset_in_the_folders_order_trains_to_the_folders_weights(image_root: Path, dataset_dir: Path,
                                                                      tmp_path: Path) -> None:
    """imagefolder keeps the folder's order within a class, and the images' bytes: the same samples in the same
    order, so the same batches and the same weights, whatever reads them."""
    args = (*PIPELINES["per_image"], "model_ema=true", "--epochs", "1", "model_kwargs.depth=1")
    assert train.main(tiny_args(image_root, tmp_path / "folder", *args)) == 0
    assert train.main(tiny_args(tmp_path, tmp_path / "dataset", *source_args("hfds", dataset_dir, dataset_dir),
                                *args)) == 0
    assert_same_weights(tmp_path / "folder", tmp_path / "dataset")
