"""Hugging Face datasets on disk (``vit_rope.data.hf_datasets``): saved with ``save_to_disk`` or as a folder of data
files, both read as the folder they came from, pixel for pixel; missing columns, labels and splits refused by name;
a corrupt image skipped and counted like a corrupt file."""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import pytest

from helpers.training import pixels
from vit_rope.data.folders import Images, find_images
from vit_rope.data.splits import find_split
from vit_rope.errors import UserError


def dataset_of(root: Path) -> datasets.DatasetDict:
    """The folder as Hugging Face's ``imagefolder`` reads it (its ``val`` becomes the split ``validation``), with the
    image bytes held in the dataset, as a downloaded one holds them."""
    loaded = datasets.load_dataset("imagefolder", data_dir=str(root))
    return loaded.cast_column("image", datasets.Image(decode=False)).map(
        lambda row: {"image": {"bytes": Path(row["image"]["path"]).read_bytes(), "path": None}})


@pytest.fixture
def saved(image_root: Path, tmp_path: Path) -> Path:
    dataset_of(image_root).save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


@pytest.mark.parametrize("layout", ["save_to_disk", "data files"])
def test_a_dataset_holds_the_folders_images_and_labels_pixel_for_pixel(image_root: Path, tmp_path: Path,
                                                                       layout: str) -> None:
    data, root = dataset_of(image_root), tmp_path / "dataset"
    if layout == "save_to_disk":
        data.save_to_disk(str(root))
    else:  # a dataset repository as downloaded from the Hub: the split in each file's name
        for split, table in data.items():
            table.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    for folder_split, split in (("train", "train"), ("val", "validation")):
        folder, classes = find_images(image_root / folder_split)
        stored, stored_classes = find_split(root, "hfds/tiny", split)
        assert stored_classes == classes  # ClassLabel names
        assert pixels(stored) == pixels(folder)


def test_columns_labels_and_splits_are_checked_by_name(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="has no split 'val' \\(it has train, validation\\)"):
        find_split(saved, "hfds", "val")
    with pytest.raises(UserError, match="no column picture \\(it has image, label\\); set input_key"):
        find_split(saved, "hfds", "train", input_key="picture")
    with pytest.raises(UserError, match="no column picture or y .*set input_key and target_key"):
        find_split(saved, "hfds", "train", input_key="picture", target_key="y")
    with pytest.raises(UserError, match="column 'label' holds ClassLabel, not images"):
        find_split(saved, "hfds", "train", input_key="label")
    with pytest.raises(UserError, match="label 2, outside the 2 classes"):
        find_split(saved, "hfds", "validation", ["class_0", "class_1"])
    unlabelled = datasets.load_from_disk(str(saved))
    unlabelled["train"] = unlabelled["train"].cast_column("label", datasets.Value("int64")).map(
        lambda row, index: {"label": None if index == 5 else row["label"]}, with_indices=True)
    unlabelled.save_to_disk(str(tmp_path / "unlabelled"))
    with pytest.raises(UserError, match="row 5 has label None, not a class index"):
        find_split(tmp_path / "unlabelled", "hfds", "train")
    test_split = datasets.load_from_disk(str(saved))  # a test split's labels: -1, left out as timm's readers do
    test_split["validation"] = test_split["validation"].cast_column("label", datasets.Value("int64")).map(
        lambda row, index: {"label": -1 if index < 4 else row["label"]}, with_indices=True)
    test_split.save_to_disk(str(tmp_path / "test_split"))
    assert len(find_split(tmp_path / "test_split", "hfds", "validation", ["class_0", "class_1", "class_2"])[0]) == 8
    datasets.load_from_disk(str(saved))["train"].save_to_disk(str(tmp_path / "one"))
    with pytest.raises(UserError, match="one saved split, without names"):
        find_split(tmp_path / "one", "hfds", "train")
    with pytest.raises(UserError, match="does not exist"):
        find_split(tmp_path / "absent", "hfds", "train")


def test_a_corrupt_image_is_skipped_with_its_row_named(saved: Path, tmp_path: Path, caplog) -> None:
    broken = datasets.load_from_disk(str(saved))
    broken["train"] = broken["train"].cast_column("image", datasets.Image(decode=False)).map(
        lambda row, index: {"image": {"bytes": b"garbage", "path": None}} if index == 2 else row, with_indices=True)
    broken.save_to_disk(str(tmp_path / "broken"))
    samples = find_split(tmp_path / "broken", "hfds", "train")[0]
    position = next(i for i, (source, _) in enumerate(samples) if source.index == 2)
    with caplog.at_level(logging.WARNING):
        _, _, skipped = Images(samples).load(position)
    assert skipped == 1 and f"{tmp_path / 'broken'}/train row 2" in caplog.text
