"""Where a training process runs (``vit_rope.train.distributed``): one process is rank 0 of 1 and its collectives
change nothing; two gloo ranks (forked, as under ``torchrun``) sum over each other and rank 0 goes first; CPU threads
follow the explicit count, ``OMP_NUM_THREADS``, or this process's share of the cores. In the same two ranks, the
per-image pipeline with ``train_sizes`` and 2 loader workers each: the ranks agree on every step's size and batch
length without talking, take disjoint shards of the data and refuse to start when their size settings differ (a DDP
run resumed mid-epoch: test_train_datasets)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers.ddp import WORLD, free_port, run_ranks
from helpers.training import PER_IMAGE, indexed_loaders
from vit_rope.errors import UserError
from vit_rope.train import distributed, loaders
from vit_rope.train.config_checks import check_ranks_agree

TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def one_process(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_one_process_is_rank_0_of_1_and_its_collectives_change_nothing(one_process):
    env = distributed.init_distributed("cpu")
    assert (env.device, env.rank, env.world_size, env.distributed, env.is_main) == (torch.device("cpu"), 0, 1,
                                                                                       False, True)
    values = torch.tensor([1.5, -2.0])
    assert torch.equal(distributed.reduce_sum(values, env), values)
    ran = []
    with distributed.main_process_first(env):
        ran.append(True)
    assert ran == [True]


def test_auto_takes_the_cpu_without_a_gpu_and_cuda_without_one_is_an_error(one_process, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.init_distributed("auto").device == torch.device("cpu")
    with pytest.raises(UserError, match="--device cuda.*pass --device cpu"):
        distributed.init_distributed("cuda")


def test_cpu_threads_follow_the_count_then_omp_then_the_process_share(monkeypatch, threads_restored):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)  # 8 cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert distributed.set_cpu_threads(0, workers=1) == 3  # 8 cores / 2 processes, minus 1 loader worker
    assert distributed.set_cpu_threads(0, workers=6) == 1  # never below one thread
    assert distributed.set_cpu_threads(2, workers=6) == 2  # an explicit count wins over the share
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as torchrun sets it; PyTorch read it at start-up
    torch.set_num_threads(1)
    assert distributed.set_cpu_threads(0, workers=0) == 1  # left as set, not the share of 4


def _two_ranks(rank: int, port: int, marker: Path, root: Path) -> dict[str, Any]:
    os.environ["MASTER_PORT"] = str(port)
    env = distributed.init_distributed("cpu")
    try:
        values = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        total = distributed.reduce_sum(values, env)
        with distributed.main_process_first(env):
            seen = marker.exists()  # rank 0 creates it inside the block, before rank 1 may enter
            if env.is_main:
                marker.write_text("rank 0 was here")
        loader, _ = indexed_loaders(root, *PER_IMAGE, "batch_size=4", "train_sizes=[16, 24, 32]", "workers=2",
                                    rank=rank, world_size=WORLD)
        steps = {}
        for epoch in (0, 1):
            loaders.set_epoch(loader, epoch)
            steps[epoch] = [(images.shape[-1], targets.tolist()) for images, targets, _ in loader]
        refusal = None
        try:  # a rank launched with other sizes: both must refuse before any step
            check_ranks_agree({"train_sizes": [16, 32, 48] if rank == 0 else [16, 32, 64], "seed": 0}, WORLD)
        except UserError as err:
            refusal = str(err)
        return {"env": (env.rank, env.world_size, env.is_main), "total": total.tolist(), "own": values.tolist(),
                "seen": seen, "steps": steps, "shard": list(loader.batch_sampler.order), "refusal": refusal}
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_over_each_other_rank_0_goes_first_and_they_agree_on_every_step(image_root: Path,
                                                                                     tmp_path: Path) -> None:
    ranks = run_ranks(_two_ranks, tmp_path, free_port(), tmp_path / "marker", image_root)
    assert [rank["env"] for rank in ranks] == [(0, 2, True), (1, 2, False)]
    assert all(rank["total"] == [3.0, 30.0] for rank in ranks)
    assert [rank["own"] for rank in ranks] == [[1.0, 10.0], [2.0, 20.0]]  # the input is not summed in place
    assert [rank["seen"] for rank in ranks] == [False, True]
    # the per-image pipeline with train_sizes, 2 workers a rank
    for epoch in (0, 1):
        shapes = [[(size, len(targets)) for size, targets in rank["steps"][epoch]] for rank in ranks]
        assert shapes[0] == shapes[1] and len(shapes[0]) == 3  # 24 images / 2 ranks / 4: 3 steps per epoch
        seen = [{i for _, targets in rank["steps"][epoch] for i in targets} for rank in ranks]
        assert not seen[0] & seen[1]  # each image on one rank only
    assert len({size for epoch in (0, 1) for size, _ in ranks[0]["steps"][epoch]}) > 1
    assert not set(ranks[0]["shard"]) & set(ranks[1]["shard"])  # the shards are disjoint and cover the data
    assert sorted(ranks[0]["shard"] + ranks[1]["shard"]) == list(range(24))
    for rank in ranks:  # each step takes its shard's order, as one process would
        flat = [i for _, targets in rank["steps"][1] for i in targets]
        assert flat == [rank["shard"][i % 12] for i in range(len(flat))]
    assert ranks[0]["refusal"] == ranks[1]["refusal"] == (
        "the DDP ranks do not agree on train_sizes (rank 0: [16, 32, 48], rank 1: [16, 32, 64]); each rank derives "
        "every step's size, images and checkpoints from these, so launch every rank with the same config, "
        "command-line overrides and data")


@pytest.mark.parametrize("enabled", [False, True])
def test_tf32_is_set_silently_and_stays_readable(monkeypatch, enabled):
    """Torch 2.9-2.11 warn when the allow_tf32 flags are set (train.py would print it on every GPU run); the flags
    must stay readable afterwards, as they do not after torch's newer fp32_precision settings."""
    real = torch._C._set_cublas_allow_tf32

    def deprecated(value: bool) -> None:  # what torch 2.9-2.11 do when the flag is set
        warnings.warn("Please use the new API settings to control TF32 behavior, such as ...", UserWarning,
                      stacklevel=2)
        real(value)

    monkeypatch.setattr(torch._C, "_set_cublas_allow_tf32", deprecated)
    with pytest.warns(UserWarning):  # the stand-in warns
        torch.backends.cuda.matmul.allow_tf32 = enabled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        distributed.set_tf32(enabled)
        distributed.set_tf32(not enabled)
        distributed.set_tf32(enabled)
    assert torch.backends.cuda.matmul.allow_tf32 is enabled and torch.backends.cudnn.allow_tf32 is enabled


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU has no flush-to-zero mode")  # off: default
def test_flushed_subnormals_reads_subnormals_as_zero_inside_the_block_only():
    """Inside the block a subnormal float (1e-39 < 1.2e-38, float32's smallest normal) reads as zero; after it, as
    itself again, so that code after a training or evaluation run computes as before."""
    tiny = torch.tensor([1e-39])
    assert (tiny * 1.0).item() > 0
    with distributed.flushed_subnormals():
        assert (tiny * 1.0).item() == 0.0
        assert (torch.tensor([1e-20]) * 1e-20).item() == 0.0  # a subnormal result is flushed too
    assert (tiny * 1.0).item() > 0
