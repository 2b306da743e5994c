"""Hugging Face datasets on disk (timm's ``hfds/``) as loader samples, a row read (undecoded) when its image is drawn:
``save_to_disk``'s layout, which timm's reader refuses, or data files named by split (docs/data.md)."""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from vit_rope._requires import require
from vit_rope.data.shard_reader import labelled_samples
from vit_rope.errors import UserError


class DatasetRow(NamedTuple):
    root: str
    split: str
    column: str
    index: int

    def open(self) -> BinaryIO:
        value = _images(self.root, self.split, self.column)[self.index][self.column]
        if value.get("bytes"):
            return io.BytesIO(value["bytes"])
        if value.get("path"):  # a dataset that refers to image files rather than holding them
            return open(value["path"], "rb")
        raise OSError("the row holds no image")

    def fingerprint(self) -> tuple[Any, ...]:
        return (self.root, self.split, self.index, _load(self.root, self.split)._fingerprint)

    def __str__(self) -> str:
        return f"{self.root}/{self.split} row {self.index}"


class NoSplit(Exception):
    """The dataset has no split of that name; the caller names the setting to change."""


@functools.lru_cache(maxsize=8)
def _load(root: str, split: str) -> Any:
    """Split ``split`` of the dataset at ``root``, memory-mapped (each loader worker opens its own on first use)."""
    datasets = require("datasets", "hf")
    try:
        saved = datasets.load_from_disk(root)
    except FileNotFoundError:  # not save_to_disk's layout: a folder of data files
        try:
            return datasets.load_dataset(root, split=split)
        except ValueError as err:  # an unknown split, in datasets' words
            raise NoSplit(str(err).rstrip(".")) from None
        except FileNotFoundError as err:
            raise UserError(f"{root} holds no dataset that Hugging Face datasets can read ({err}); save one with "
                            "DatasetDict.save_to_disk, or point data_dir at a folder of its data files") from None
    if not isinstance(saved, datasets.DatasetDict):
        raise UserError(f"{root} holds one saved split, without names; save a DatasetDict with train and validation "
                        "splits (DatasetDict({'train': ..., 'validation': ...}).save_to_disk(...))")
    if split not in saved:
        raise NoSplit(f"it has {', '.join(saved)}")
    return saved[split]


@functools.lru_cache(maxsize=8)
def _images(root: str, split: str, column: str) -> Any:
    datasets = require("datasets", "hf")
    return _load(root, split).select_columns([column]).cast_column(column, datasets.Image(decode=False))


def find_dataset_samples(root: Path, split: str, classes: list[str] | None, split_key: str, input_key: str | None,
                         target_key: str | None) -> tuple[list[tuple[DatasetRow, int]], list[str]]:
    """``(samples, classes)`` of a split of a dataset on disk, sorted by class, every label checked first."""
    datasets = require("datasets", "hf")
    try:
        table = _load(str(root), split)
    except NoSplit as err:
        raise UserError(f"{root} has no split '{split}' ({err}); set {split_key} to one of them") from None
    image, label = input_key or "image", target_key or "label"
    if absent := [name for name in (image, label) if name not in table.column_names]:
        keys = {image: "input_key", label: "target_key"}
        raise UserError(f"{root} [{split}] has no column {' or '.join(absent)} (it has "
                        f"{', '.join(table.column_names)}); set {' and '.join(keys[name] for name in absent)} to the "
                        "columns that hold them")
    feature = table.features[image]
    if not isinstance(feature, datasets.Image):
        raise UserError(f"{root} [{split}]: column '{image}' holds {type(feature).__name__}, not images; set "
                        "input_key to the image column")
    labels = table.with_format("arrow")[label].to_pylist()  # one Arrow read, indices mapping applied
    missing = next((row for row, value in enumerate(labels) if not isinstance(value, int)), None)
    if missing is not None:
        text = " (class names: dataset.class_encode_column turns them into indices)" if isinstance(
            labels[missing], str) else ""
        raise UserError(f"{root} [{split}] row {missing} has label {labels[missing]!r}, not a class index{text}; fill "
                        "in or drop rows without one, or set target_key to the column of class indices")
    samples = [(DatasetRow(str(root), split, image, row), value) for row, value in enumerate(labels)]
    return labelled_samples(samples, getattr(table.features[label], "names", None), classes, f"{root} [{split}]",
                            split_key)
