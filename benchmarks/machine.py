"""Where figures come from: the record of the machine that every benchmark and study saves beside its numbers.

Outside the library, as a measurement's provenance is: the benchmarks save it in their JSON files and
``scripts/imagenette_study.py`` in each study's ``machine.json`` (both put the repository root on the path).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from pathlib import Path
from typing import Any

import timm
import torch


def describe_machine() -> dict[str, Any]:
    """CPU model, cores, GPU, library versions (triton and CUDA: None where absent) and the date."""
    triton = importlib.import_module("triton").__version__ if importlib.util.find_spec("triton") else None
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return {"cpu": names[0] if names else platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "triton": triton, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d")}
