"""DDP ranks for the tests: 2 gloo ranks on the CPU, each with torchrun's environment, forked from a new interpreter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
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
    """``job(rank, *args)`` in ``WORLD`` processes forked, as under ``torchrun``, from a new interpreter that imports
    ``job``'s module (a module-level function), whose loader workers fork in turn.

    Why not fork this process: once some test has started autograd's worker threads here, a forked child's backward
    fails ("Unable to handle autograd's threading in combination with fork-based multiprocessing"), so whether a DDP
    test passed would depend on which tests the process ran before it."""
    torch.save((job.__module__, job.__name__, args), out / "job.pt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _FORK_RANKS, str(out)], env=env, check=True, timeout=600)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


_FORK_RANKS = """
import importlib, sys
from pathlib import Path
import torch
import torch.multiprocessing as mp
from helpers.ddp import WORLD, _rank_main
out = Path(sys.argv[1])
module, name, args = torch.load(out / "job.pt", weights_only=False)
mp.start_processes(_rank_main, args=(getattr(importlib.import_module(module), name), args, out), nprocs=WORLD,
                   start_method="fork")
"""
