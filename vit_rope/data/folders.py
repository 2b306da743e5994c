"""Image folders: the data root, ImageFolder splits scanned with clear errors, class-balanced subsets, and the datasets
timm's per-image pipeline reads. Unreadable images never stop a run: they are replaced by the next readable one
(batches keep their size, which Mixup and DDP rely on), with a warning naming the file. And the decoded-image cache:
every image of a split decoded once, short side shrunk, in one flat uint8 tensor that forked loader workers and a
machine's DDP ranks share (memory-mapped): on a small CPU, decoding full-size JPEGs every epoch costs more than a tiny
ViT's training step."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from vit_rope.data.steps import Item, global_rng_kept, seed_globals
from vit_rope.errors import UserError
from vit_rope.weights import atomic_save

_log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_EXTENSIONS = frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN)
Source = Any  # a file's path (str), or an image in a container (TarMember, DatasetRow) with open() and fingerprint()
Sample = tuple[Source, int]  # an image (a file's path, a shard's member, a dataset's row) and its class index


def file_stat(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


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
        # what changes when an image does: a file's path, size and time; a stored image's own fingerprint
        stamps = [(path, *file_stat(path)) if isinstance(path, str) else path.fingerprint() for path in paths]
        digest = hashlib.sha1(repr((stamps, short_side)).encode()).hexdigest()[:16]
        file = cache_dir / f"decoded-{short_side}px-{digest}.pt"
        if not file.exists():
            images = cls.build(paths, short_side, workers)
            cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_save({"data": images.data, "offsets": images.offsets, "shapes": images.shapes}, file)
        # memory-mapped (a new cache's private copy dropped): the processes of a machine share the page cache's one
        return cls(**torch.load(file, weights_only=True, mmap=True))


def resolve_data_dir(data_dir: str | None, download_size: str = "320px") -> Path:
    """``data_dir``, else the shared Imagenette next to the repo, else Imagenette downloaded (never synthetic data)."""
    if data_dir:
        return Path(data_dir).expanduser()
    shared = REPO_ROOT.parent / "shared" / "data" / "imagenette"
    if shared.is_dir():  # relative to the working directory, so that saved configs name no machine path
        return Path(os.path.relpath(shared))
    from torchvision.datasets import Imagenette

    root = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vit_rope"
    print(f"no --data-dir and no {shared}: downloading Imagenette ({download_size}) to {root}", flush=True)
    try:
        for split in ("train", "val"):
            Imagenette(root, split=split, size=download_size, download=True)
    except (OSError, RuntimeError) as err:
        raise UserError(f"could not download Imagenette to {root} ({err}); pass --data-dir DIR with train/ and "
                        "val/ class folders") from None
    return root / ("imagenette2" if download_size == "full" else f"imagenette2-{download_size.removesuffix('px')}")


def find_images(split_dir: Path, classes: list[str] | None = None, split_key: str | None = None
                ) -> tuple[list[Sample], list[str]]:
    """``(samples, classes)`` of an ImageFolder split, ``classes`` the train split's (None: its own); a missing folder's
    error lists the other folders and tells to set ``split_key`` (CIFAR-10 ships ``test/``)."""
    if not split_dir.is_dir():
        message = f"{split_dir} does not exist; the data dir needs {split_dir.name}/ with one folder per class"
        others = sorted(d.name for d in split_dir.parent.iterdir() if d.is_dir() and d.name != "train"
                        and not d.name.startswith(".")) if split_dir.parent.is_dir() else []
        if split_key and others:
            message += f"; it has {', '.join(f'{name}/' for name in others)}: set {split_key}={others[0]} to use that"
        raise UserError(message)
    found = sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not found:
        raise UserError(f"{split_dir} has no class folders; put each class's images in {split_dir}/<class name>/")
    classes = classes or found
    samples = []
    for name in found:
        folder = split_dir / name
        if name not in classes:
            raise UserError(f"{folder} is a class the train split does not have; rename or remove it")
        files = sorted(str(p) for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise UserError(f"{folder} holds no images; add images (any format PIL reads) or remove the folder")
        samples += [(path, classes.index(name)) for path in files]
    for path, _ in samples:  # up to the first readable image: one decode for a usual split
        with contextlib.suppress(Exception):  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
            decode_image(path)
            break
    else:  # a split of unreadable files would only fail once its loader starts, after a training epoch for val
        raise UserError(f"none of the {len(samples)} images under {split_dir} can be read (e.g. {samples[0][0]}): "
                        "replace the corrupt files, or point the data dir at the data set")
    return samples, classes


def balanced_subset(samples: list[Sample], fraction: float, seed: int) -> list[Sample]:
    """A class-balanced ``fraction`` of ``samples``, in their order, by a seed of its own (``train_subset_seed``): runs
    that differ in seed or model must train on the same images for a data-size comparison to mean anything."""
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[int]] = {}
    for index, (_, target) in enumerate(samples):
        by_class.setdefault(target, []).append(index)
    kept = []
    for target in sorted(by_class):
        indices = by_class[target]
        count = max(1, round(fraction * len(indices)))
        kept += [indices[i] for i in rng.choice(len(indices), count, replace=False)]
    return [samples[index] for index in sorted(kept)]


class Images(Dataset):
    """The images of a split, from their files or from the decoded cache; the subclasses apply ``transform``."""

    def __init__(self, samples: list[Sample], transform: Any = None, *, cache: DecodedImages | None = None) -> None:
        self.samples, self.transform, self.cache = samples, transform, cache

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> tuple[Image.Image, int, int]:
        """``(RGB image, class index, unreadable files skipped)`` of sample ``index`` or the next readable one."""
        for skipped in range(len(self.samples)):
            current = (index + skipped) % len(self.samples)
            path, target = self.samples[current]
            try:
                image = decode_image(path) if self.cache is None else self.cache.image(current)
            except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
                _log.warning("skipping unreadable image %s (%s)", path, err)
                continue
            return image, target, skipped
        raise UserError(f"none of the {len(self.samples)} images of this split can be read any more (the first: "
                        f"{self.samples[0][0]}): were the files changed during the run? Replace the corrupt files, "
                        "or point the data dir at the data set")


class ImageFolderDataset(Images):
    """``(image tensor, class index, number of unreadable files skipped)`` for each sample of a split."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, target, skipped = self.load(index)
        return self.transform(image), target, skipped


class SizedImages(Images):
    """Training samples for ``StepSampler``'s items ``(index, size, seed)``: transformed for ``size`` under ``seed``
    (``transform`` maps each size to its transform)."""

    def __getitem__(self, item: Item) -> tuple[torch.Tensor, int, int]:
        index, size, seed = item
        image, target, skipped = self.load(index)
        seed_globals(seed)
        return self.transform[size](image), target, skipped

    def __getitems__(self, items: list[Item]) -> list[tuple[torch.Tensor, int, int]]:
        with global_rng_kept():
            return [self[item] for item in items]
