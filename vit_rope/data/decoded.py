"""The decoded-image cache: every image of a split decoded once, short side shrunk, in one flat uint8 tensor that
forked loader workers and a machine's DDP ranks share (memory-mapped): on a small CPU, decoding full-size JPEGs every
epoch costs more than a tiny ViT's training step."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vit_rope.weights import atomic_save

Source = Any  # a file's path (str), or an image in a container (TarMember, DatasetRow) with open() and fingerprint()


def file_stat(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def fingerprint(source: Source) -> tuple[Any, ...]:
    """What changes when the image does: a file's path, size and time; a stored image's own."""
    return (source, *file_stat(source)) if isinstance(source, str) else source.fingerprint()


def decode_image(source: Source, short_side: int | None = None) -> Image.Image:
    """Read an image as RGB, optionally with its short side shrunk (``draft``: the JPEG decoder downscales 2-8x)."""
    with Image.open(source if isinstance(source, str | Path) else source.open()) as img:
        if short_side:
            img.draft("RGB", (short_side, short_side))
        img = img.convert("RGB")
    if short_side and min(img.size) > short_side:
        scale = short_side / min(img.size)
        img = img.resize([max(1, round(side * scale)) for side in img.size], Image.Resampling.BICUBIC)
    return img


def _decode_batch(short_side: int, sources: list[Source]) -> list[torch.Tensor]:
    """Decodes for the cache in loader workers; a file that fails becomes an empty array, warned of each time drawn."""
    arrays = []
    for source in sources:
        try:
            arrays.append(torch.from_numpy(np.array(decode_image(source, short_side))))
        except Exception:
            arrays.append(torch.zeros((0, 0, 3), dtype=torch.uint8))
    return arrays


class DecodedImages:
    """A split decoded once, short side shrunk to a fixed size, in one flat uint8 tensor (HWC per image)."""

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor, shapes: torch.Tensor) -> None:
        self.data, self.offsets, self.shapes = data, offsets, shapes

    def image(self, index: int) -> Image.Image:
        height, width = self.shapes[index].tolist()
        if height == 0:
            raise OSError("it could not be decoded when the cache was built")
        start = int(self.offsets[index])
        return Image.fromarray(self.data[start:start + height * width * 3].view(height, width, 3).numpy())

    @classmethod
    def build(cls, paths: list[Source], short_side: int, workers: int) -> DecodedImages:
        decode = functools.partial(_decode_batch, short_side)
        loader = DataLoader(paths, batch_size=32, num_workers=workers, collate_fn=decode)
        arrays = [array for batch in loader for array in batch]
        shapes = torch.tensor([array.shape[:2] for array in arrays], dtype=torch.long).reshape(-1, 2)
        sizes = shapes.prod(1) * 3
        return cls(torch.cat([array.reshape(-1) for array in arrays]), sizes.cumsum(0) - sizes, shapes)

    @classmethod
    def load_or_build(cls, paths: list[Source], short_side: int, workers: int, cache_dir: Path | None
                      ) -> DecodedImages:
        """Build the cache, or reuse ``cache_dir``'s file of the same images (fingerprints hashed) and size."""
        if cache_dir is None:
            return cls.build(paths, short_side, workers)
        digest = hashlib.sha1(repr(([fingerprint(path) for path in paths], short_side)).encode()).hexdigest()[:16]
        file = cache_dir / f"decoded-{short_side}px-{digest}.pt"
        if not file.exists():
            images = cls.build(paths, short_side, workers)
            cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_save({"data": images.data, "offsets": images.offsets, "shapes": images.shapes}, file)
        # memory-mapped (a new cache's private copy dropped): the processes of a machine share the page cache's one
        return cls(**torch.load(file, weights_only=True, mmap=True))
