"""Where a training process runs: its device, its rank among ``torchrun``'s processes, its CPU threads, and the
collectives training needs (a barrier for work rank 0 does first, a sum of metrics over ranks).

The process group comes from timm's ``init_distributed_device_so`` (torchrun / SLURM environment), so one command
runs on one CPU process or N GPUs; on one process the collectives do nothing.
"""

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
    """Where this process runs: its device, its rank and the number of processes."""

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
    """Pick the device and, when launched by ``torchrun``, join the process group (NCCL on CUDA, gloo on CPU).

    Args:
        device: ``auto``, ``cuda`` or ``cpu``; ``auto`` takes CUDA when it is available.
    """
    info = init_distributed_device_so(resolve_device(device))  # timm: reads torchrun/SLURM env, sets the local GPU
    return DistEnv(torch.device(info["device"]), info["global_rank"], info["world_size"])


def set_cpu_threads(threads: int, workers: int) -> int:
    """Set PyTorch's intra-op CPU threads and return the number.

    Args:
        threads: explicit count, or 0 for automatic: ``OMP_NUM_THREADS`` when set (torchrun sets 1), else this
            process's share of the cores minus the loader ``workers``, which need cores of their own.
    """
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
    """Treat subnormal floats as zero in CPU arithmetic while the block runs (x86's flush-to-zero and
    denormals-are-zero; a no-op where the CPU has no such mode).

    A softmax over logits more than ~87 below its row's maximum gives probabilities under float32's smallest normal
    number (1.2e-38). x86 cores take many times longer on such subnormal operands, and every matmul of a backward that
    carries them slows down with them: PaPE, whose parabolas put distant keys a hundred or more below the nearest,
    trains several times slower on CPU without this (``docs/performance.md``). Values this small change no result.
    Torch cannot report the flag's state, so the block leaves it off, torch's default, for the code that follows.
    """
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def set_tf32(enabled: bool) -> None:
    """Let CUDA matmuls and convolutions run fp32 products in TF32 (``tf32: true``), or keep them fp32.

    Through the ``allow_tf32`` flags, the only settings torch keeps readable both ways: after the newer
    ``fp32_precision`` ones, any code that reads ``allow_tf32`` fails ("a mix of the legacy and new APIs", torch 2.14).
    Torch 2.9 to 2.11 warn once that the flags will be deprecated; that warning is silenced here, as train.py prints
    every warning to the user.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Please use the new API settings to control TF32")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
