"""What ``make gpu-check`` refuses before any step, each as one line naming the problem and the fix: no CUDA GPU (unless
``--device cpu``), a GPU without bf16, a timm older than vit_rope's floor, a missing or wrong data folder.

Only torch is imported here: the timm check imports vit_rope, whose import is what fails on an old timm.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

TARBALL = "imagenette-160.tar.gz"


class Refused(Exception):
    """A reason the checks cannot start, already worded for the user (one line)."""


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    bf16: bool


def find_gpu() -> Gpu | None:
    """The GPU PyTorch would use, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return Gpu(torch.cuda.get_device_name(), torch.cuda.get_device_capability(), torch.cuda.is_bf16_supported())


def check_device(device: str, gpu: Gpu | None) -> None:
    """``cuda`` needs a GPU that runs bf16, which every step measures in."""
    if device == "cpu":
        return
    if gpu is None:
        raise Refused(f"no CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none; run it on a "
                      "machine with an NVIDIA GPU, or DEVICE=cpu for the tiny CPU run of every step")
    if not gpu.bf16:
        major, minor = gpu.capability
        raise Refused(f"the GPU {gpu.name} (compute capability {major}.{minor}) has no bf16, which every step runs "
                      "in; use an Ampere or newer GPU (compute capability 8.0 or more: A100, H100, H200, L4, ...)")


def check_timm() -> None:
    """vit_rope's own import check (``vit_rope._requires``): its message names the version found and the fix."""
    try:
        import vit_rope  # noqa: F401
    except ImportError as err:
        raise Refused(f"{err}; e.g. ../shared/wheels/timm-*.whl, as docs/gpu.md shows") from None


def find_data(data_dir: str | None) -> Path:
    """The Imagenette folder holding ``train/`` and ``val/``: ``data_dir`` itself, or the ``imagenette-160/`` that
    the 160 px tarball unpacks into it."""
    unpack = f"unpack the 160 px copy with tar -xzf {TARBALL} -C DIR and pass DATA_DIR=DIR/imagenette-160"
    if not data_dir:
        raise Refused(f"no data folder: pass DATA_DIR=DIR, an Imagenette with train/ and val/ class folders; {unpack}")
    root = Path(data_dir).expanduser()
    for folder in (root, root / "imagenette-160"):
        if (folder / "train").is_dir() and (folder / "val").is_dir():
            return folder
    if root.is_file():
        problem = "is a file, not a folder"
    elif not root.exists():
        problem = "does not exist"
    else:
        problem = "has no train/ and val/ class folders (nor imagenette-160/ holding them)"
    raise Refused(f"DATA_DIR={data_dir} {problem}; {unpack}")
