"""A training process's device, ``torchrun`` rank, CPU threads and float modes, and collectives (no-op on one rank)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from timm.utils.distributed import init_distributed_device_so

from vit_rope.checks import resolve_device


@dataclass(frozen=True)
class DistEnv:
    device: torch.device
    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistEnv:
    """Pick the device (``auto``: CUDA when available) and, under ``torchrun``, join the process group."""
    info = init_distributed_device_so(resolve_device(device))  # timm: reads torchrun/SLURM env, sets the local GPU
    return DistEnv(torch.device(info["device"]), info["global_rank"], info["world_size"])


def set_cpu_threads(threads: int, workers: int) -> int:
    """Set PyTorch's CPU threads: ``threads``, else ``OMP_NUM_THREADS``, else the cores less the ``workers``."""
    if threads or "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(threads or max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)) - workers))
    return torch.get_num_threads()


@contextlib.contextmanager
def main_process_first(env: DistEnv) -> Iterator[None]:
    """Let rank 0 run the block (download, write a cache) before the other ranks, which then reuse its result."""
    if env.distributed and not env.is_main:
        dist.barrier()
    yield
    if env.distributed and env.is_main:
        dist.barrier()


def reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a tensor over all ranks (identity on one process)."""
    if env.distributed:
        values = values.clone()
        dist.all_reduce(values)
    return values


@contextlib.contextmanager
def flushed_subnormals() -> Iterator[None]:
    """Treat subnormal floats as zero in CPU arithmetic while the block runs (x86's FTZ / DAZ), off again after: tiny
    softmax probabilities make x86 matmuls many times slower (PaPE, docs/performance.md) and change no result."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def set_tf32(enabled: bool) -> None:
    """CUDA's TF32 for fp32 products by ``allow_tf32`` (not ``fp32_precision``: once set, reading allow_tf32 fails)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Please use the new API settings to control TF32")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
