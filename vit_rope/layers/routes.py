"""Whether a forward runs under a graph capture rather than on real eager tensors.

The eager fast paths of this package (the in-place rotations, RMSNorm's three passes, STRING's folded-weight cache,
the bias tables' cache) write into tensors or keep Python state that a captured graph cannot hold: torch.compile and
torch.export (TorchDynamo) would trace a cache lookup or an in-place write as part of the graph, TorchScript's tracer
records only the values of one call, and FX symbolic tracing (torchvision's ``create_feature_extractor``, timm's FX
feature wrapper) passes proxies that have no data. Each takes the reference path when ``capturing`` says so.
"""

from __future__ import annotations

import torch
from torch import Tensor


def capturing(x: Tensor | None = None) -> bool:
    """torch.compile / torch.export, TorchScript tracing, or FX symbolic tracing (``x`` is then a ``torch.fx.Proxy``).
    """
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or isinstance(x, torch.fx.Proxy)
