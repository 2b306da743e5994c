"""Whether a forward runs under a graph capture rather than on real eager tensors.

The eager fast paths (in-place rotations, RMSNorm's three passes, STRING's and the biases' caches) write into tensors or
keep Python state that a graph cannot hold: torch.compile and torch.export would trace a cache lookup or an in-place
write, TorchScript's tracer records one call's values, and FX symbolic tracing passes proxies without data. Each takes
the reference path when ``capturing`` says so.
"""

from __future__ import annotations

import torch
from torch import Tensor


def capturing(x: Tensor | None = None) -> bool:
    """torch.compile / torch.export, TorchScript tracing, or FX symbolic tracing (``x`` a ``torch.fx.Proxy``)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or isinstance(x, torch.fx.Proxy)
