"""Tensor stores of random images for the batched pipeline's tests, and whether two loaders gave the same batches."""

from __future__ import annotations

import numpy as np
import torch

from vit_rope.data.pipeline import TensorStore


def make_store(n: int = 40, unreadable: tuple[int, ...] = (), seed: int = 0, value: int | None = None) -> TensorStore:
    """``n`` random images of 20-50 px per side (HWC uint8), targets = indices; ``unreadable`` have height 0."""
    rng = np.random.default_rng(seed)
    arrays = []
    for index in range(n):
        h, w = (0, 0) if index in unreadable else rng.integers(20, 51, 2)
        arrays.append(np.full((h, w, 3), value, np.uint8) if value is not None
                      else rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    shapes = torch.tensor([a.shape[:2] for a in arrays], dtype=torch.long)
    sizes = shapes.prod(1) * 3
    data = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
    return TensorStore(data, sizes.cumsum(0) - sizes, shapes, torch.arange(n))


def same(a: list, b: list) -> bool:
    """Whether two lists of batches hold equal tensors, batch by batch."""
    return len(a) == len(b) and all(torch.equal(x, y) for batch_a, batch_b in zip(a, b, strict=True)
                                    for x, y in zip(batch_a, batch_b, strict=True))
