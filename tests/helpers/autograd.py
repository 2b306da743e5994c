"""What autograd keeps for backward: how tests hold a path to the memory it should save, instead of naming the
private autograd node that saves it."""

from __future__ import annotations

import torch
from torch import Tensor


class SavedForBackward(torch.autograd.graph.saved_tensors_hooks):
    """The tensors autograd saves for backward while the ``with`` block runs.

    ``beyond(*tensors)`` is the number of elements saved in storages other than those of ``tensors`` (the inputs and
    outputs a path may keep), each storage counted once: 0 for a path that keeps nothing of its own, an intermediate's
    size for one that keeps it."""

    def __init__(self) -> None:
        self.saved: list[Tensor] = []
        super().__init__(lambda tensor: self.saved.append(tensor) or tensor, lambda tensor: tensor)

    def __enter__(self) -> SavedForBackward:
        super().__enter__()
        return self

    def beyond(self, *tensors: Tensor) -> int:
        kept = {tensor.untyped_storage().data_ptr() for tensor in tensors}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size()
                    for t in self.saved if t.untyped_storage().data_ptr() not in kept}
        return sum(storages.values())
