"""DDP ranks forked from the test process: 2 gloo ranks on the CPU, each with torchrun's environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.distributed import distributed_c10d

WORLD = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, job: Callable[..., Any], args: tuple, out: Path) -> None:
    """One rank: torchrun's environment, then ``job(*args)``; what it returns is saved for the test to read."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    distributed_c10d.default_pg_timeout = timedelta(minutes=4)  # a hung collective fails the test, not gloo's 30 min
    torch.save(job(rank, *args), out / f"rank{rank}.pt")


def run_ranks(job: Callable[..., Any], out: Path, *args: Any) -> list[Any]:
    """``job(rank, *args)`` in ``WORLD`` processes forked from this one (no second import of torch: seconds, not a
    minute), whose loader workers fork in turn, as under ``torchrun``."""
    mp.start_processes(_rank_main, args=(job, args, out), nprocs=WORLD, start_method="fork")
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]
