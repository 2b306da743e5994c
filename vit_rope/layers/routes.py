"""Whether a forward runs under a graph capture (torch.compile, torch.export, TorchScript tracing, FX), where the eager
fast paths (in-place writes, Python caches) must take the reference path."""

from __future__ import annotations

import torch
from torch import Tensor


def capturing(x: Tensor | None = None) -> bool:
    """torch.compile / torch.export, TorchScript tracing, or FX symbolic tracing (``x`` a ``torch.fx.Proxy``)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or isinstance(x, torch.fx.Proxy)
