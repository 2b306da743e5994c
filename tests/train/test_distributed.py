"""Where a training process runs (``vit_rope.train.distributed``): one process is rank 0 of 1 and its collectives
change nothing; two gloo ranks (forked, as under ``torchrun``) sum over each other and rank 0 goes first; CPU threads
follow the explicit count, ``OMP_NUM_THREADS``, or this process's share of the cores."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers.ddp import free_port, run_ranks
from vit_rope.errors import UserError
from vit_rope.train import distributed

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


def _two_ranks(rank: int, port: int, marker: Path) -> dict[str, Any]:
    os.environ["MASTER_PORT"] = str(port)
    env = distributed.init_distributed("cpu")
    try:
        values = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        total = distributed.reduce_sum(values, env)
        with distributed.main_process_first(env):
            seen = marker.exists()  # rank 0 creates it inside the block, before rank 1 may enter
            if env.is_main:
                marker.write_text("rank 0 was here")
        return {"env": (env.rank, env.world_size, env.is_main), "total": total.tolist(),
                "own": values.tolist(), "seen": seen}
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_over_each_other_and_rank_0_goes_first(tmp_path):
    ranks = run_ranks(_two_ranks, tmp_path, free_port(), tmp_path / "marker")
    assert [rank["env"] for rank in ranks] == [(0, 2, True), (1, 2, False)]
    assert all(rank["total"] == [3.0, 30.0] for rank in ranks)
    assert [rank["own"] for rank in ranks] == [[1.0, 10.0], [2.0, 20.0]]  # the input is not summed in place
    assert [rank["seen"] for rank in ranks] == [False, True]


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
