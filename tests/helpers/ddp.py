"""DDP ranks for the tests: 2 gloo ranks on the CPU, each with torchrun's environment, forked by a command of the GPU
check's fork server (``gpucheck.prestarted``: an interpreter that imported torch, timm and train.py once for this
pytest process and runs nothing itself), the one that the GPU check's own tests use too."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import gpu_check
import torch
from gpucheck import steps
from gpucheck.prestarted import execute, start  # bound here: the GPU check's tests patch prestarted.start
from torch.distributed import distributed_c10d

WORLD = 2
TIMEOUT_S = 600  # a rank stuck outside a collective fails the test after this, not never

_server: subprocess.Popen | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fork_server() -> subprocess.Popen:
    """This pytest process's fork server, started on the first call: the environment the GPU check gives its CPU run
    (torch.compile only traced, read when the server imports torch) with the tests' path, in the checkout."""
    global _server
    if _server is None or _server.poll() is not None:
        env = gpu_check.child_env(steps.TRACE_ONLY)
        env.pop("PYTEST_CURRENT_TEST", None)  # it names one test: not the server's
        _server = start({**env, "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], *sys.path])}, gpu_check.REPO)
    return _server


def close_fork_server() -> int | None:
    """The exit code of this process's fork server once its stdin is closed, as the GPU check closes it; None: none."""
    if _server is None or _server.poll() is not None:
        return None if _server is None else _server.returncode
    _server.stdin.close()
    return _server.wait(timeout=60)


def _rank_main(rank: int, job: Callable[..., Any], args: tuple, out: Path) -> None:
    """One rank: torchrun's environment, its output in ``out/rank{rank}.log`` (quoted if a rank fails), then
    ``job(*args)``; what it returns is saved for the test to read."""
    log = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    distributed_c10d.default_pg_timeout = timedelta(minutes=4)  # a hung collective fails the test, not gloo's 30 min
    torch.save(job(rank, *args), out / f"rank{rank}.pt")


def run_ranks(job: Callable[..., Any], out: Path, *args: Any) -> list[Any]:
    """``job(rank, *args)`` in ``WORLD`` processes forked, as under ``torchrun``, by ``python -m helpers.ddp OUT``
    run in the fork server, which imports ``job``'s module (a module-level function); their loader workers fork in
    turn. What rank r printed is in ``out/rank{r}.log``.

    Why not fork this process: once some test has started autograd's worker threads here, a forked child's backward
    fails ("Unable to handle autograd's threading in combination with fork-based multiprocessing"), so whether a DDP
    test passed would depend on which tests the process ran before it. Why not a new interpreter per call: importing
    torch, timm and train.py again took seconds a test."""
    torch.save((job.__module__, job.__name__, args), out / "job.pt")
    with (out / "ranks.log").open("w") as log:
        code = execute(fork_server(), [sys.executable, "-m", "helpers.ddp", str(out)], log, TIMEOUT_S)
    if code is None:
        raise AssertionError(f"the DDP ranks of {job.__name__} did not finish in {TIMEOUT_S} s; what they printed "
                             f"is in {out}/rank*.log")
    if code != 0:
        logs = "".join(f"\n--- rank {r} ---\n{(out / f'rank{r}.log').read_text()[-3000:]}" for r in range(WORLD)
                       if (out / f"rank{r}.log").exists())
        raise AssertionError(f"a DDP rank of {job.__name__} failed:\n{(out / 'ranks.log').read_text()}{logs}")
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


if __name__ == "__main__":  # in the fork server: the ranks of the job saved in the folder named
    import torch.multiprocessing as mp

    out = Path(sys.argv[1])
    module, name, args = torch.load(out / "job.pt", weights_only=False)
    job = getattr(importlib.import_module(module), name)
    mp.start_processes(_rank_main, args=(job, args, out), nprocs=WORLD, start_method="fork")
