"""WebDataset shards (``vit_rope.shards`` writes them, ``vit_rope.data.shard_reader`` reads them): the same images and
labels as the folder they came from, pixel for pixel; timm's own reader reads them; shard patterns; the index cache;
each kind of bad shard refused by name before training, and a corrupt image during an epoch skipped and counted."""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_dataset
from torch.utils.data import DataLoader

from helpers.training import pixels
from vit_rope.data import shard_reader
from vit_rope.data import shard_writer as shards
from vit_rope.data.folders import ImageFolderDataset, Images, decode_image, find_images
from vit_rope.data.splits import find_split
from vit_rope.errors import UserError


@pytest.fixture
def written(image_root: Path, tmp_path: Path) -> Path:
    """The tiny folder (24 train, 12 val images) as shards of 5 samples."""
    shards.write_shards(image_root, tmp_path / "shards", 5, ["train", "val"])
    return tmp_path / "shards"


@pytest.fixture(autouse=True)
def index_cache(tmp_path: Path, monkeypatch) -> Path:
    """Every test's shard index in its own cache, not the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "vit_rope" / "shard-index"


def add_member(shard: Path, name: str, data: bytes) -> None:
    with tarfile.open(shard, "a") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_shards_hold_the_folders_images_and_labels_pixel_for_pixel(image_root: Path, written: Path) -> None:
    info = json.loads((written / "_info.json").read_text())
    assert info["splits"]["train"]["filenames"] == [f"train-{i:06d}.tar" for i in range(5)]
    assert info["splits"]["train"]["shard_lengths"] == [5, 5, 5, 5, 4]
    assert info["splits"]["val"]["num_samples"] == 12
    for split in ("train", "val"):
        folder, classes = find_images(image_root / split)
        stored, stored_classes = find_split(written, "wds/tiny", split)
        assert stored_classes == classes == info["classes"]
        assert pixels(stored) == pixels(folder)  # JPEG, PNG, grayscale and CMYK files kept as they were
        assert [label for _, label in stored] == sorted(label for _, label in stored)  # sorted by class, as a folder


def test_timm_reads_the_shards_written_here(written: Path) -> None:
    dataset = create_dataset("wds/tiny", root=str(written), split="train", is_training=False, batch_size=1)
    labels = sorted(int(target) for _, target in dataset)
    assert labels == [label for _, label in find_split(written, "wds/tiny", "train")[0]]


def test_splits_can_be_shard_patterns_and_lists_timms_count_is_checked_and_names_need_the_info_file(written) -> None:
    every = find_split(written, "wds", "train")[0]
    assert find_split(written, "wds", "train-{000000..000004}.tar")[0] == every
    assert len(find_split(written, "wds", "train-{000000..000004}.tar|24")[0]) == 24  # timm's sample count suffix
    with pytest.raises(UserError, match="says 25 samples, but _info.json gives these shards 24"):
        find_split(written, "wds", "train-{000000..000004}.tar|25")
    two = find_split(written, "wds", "train-000000.tar::train-000003.tar")[0]
    assert len(two) == 10 and {str(s).split(":")[0] for s, _ in two} == {str(written / "train-000000.tar"),
                                                                          str(written / "train-000003.tar")}
    (written / "_info.json").unlink()  # an unfinished folder, or shards that have only names
    with pytest.raises(UserError, match="has no _info.json, .*name the shards in val_split instead \\(e.g. "
                                        "'val_split=train-000000.tar'"):
        find_split(written, "wds", "train")
    assert find_split(written, "wds", "train-{000000..000004}.tar")[0] == every
    with pytest.raises(UserError, match="check the pattern"):
        find_split(written, "wds", "train-*.tar")


def test_brace_patterns_expand_as_webdataset_does() -> None:
    assert shard_reader.expand_braces("a-{008..010}.tar") == ["a-008.tar", "a-009.tar", "a-010.tar"]
    assert shard_reader.expand_braces("{x,y}-{1..2}") == ["x-1", "x-2", "y-1", "y-2"]
    assert shard_reader.expand_braces("plain.tar") == ["plain.tar"]


def test_the_index_is_kept_and_read_again_until_the_shard_changes_or_it_is_damaged(written: Path, index_cache: Path,
                                                                                    monkeypatch) -> None:
    first = find_split(written, "wds", "train")[0]
    assert len(list(index_cache.glob("*.json"))) == 5

    def unread(*args):
        raise AssertionError("a shard's headers were read again")

    with monkeypatch.context() as patch:
        patch.setattr(shard_reader, "index_shard", unread)
        assert find_split(written, "wds", "train")[0] == first
    os.utime(written / "train-000000.tar", ns=(1, 1))  # a shard replaced: its index is built anew
    assert find_split(written, "wds", "train")[0] == first
    assert len(list(index_cache.glob("*.json"))) == 6
    for file in index_cache.glob("*.json"):
        file.write_text("{")  # damaged index files: the shards are indexed again
    assert find_split(written, "wds", "train")[0] == first


def test_loader_workers_read_the_same_images_as_the_main_process(written: Path) -> None:
    samples = find_split(written, "wds", "train")[0]
    dataset = ImageFolderDataset(samples, lambda image: torch.from_numpy(np.asarray(image).copy()))
    Images(samples).load(0)  # the parent opens a shard before forking: the workers share its descriptor
    batches = [torch.cat([images.flatten() for images, _, _ in DataLoader(dataset, 4, num_workers=workers)])
               for workers in (0, 2)]
    assert torch.equal(*batches)


def test_a_corrupt_image_is_skipped_with_its_shard_and_key_named_and_counted(written: Path, caplog) -> None:
    samples = find_split(written, "wds", "train")[0]
    member = samples[3][0]
    with open(member.shard, "r+b") as f:  # the member's bytes become garbage; the tar itself stays whole
        f.seek(member.offset)
        f.write(b"\0" * member.size)
    with caplog.at_level(logging.WARNING):
        image, label, skipped = Images(samples).load(3)
    assert skipped == 1 and label == samples[4][1] and image.size == (40, 40)  # the next sample instead
    assert f"{member.shard}:{member.key}" in caplog.text


@pytest.mark.parametrize("damage, message", [
    (lambda root: (root / "train-000002.tar").unlink(), "1 of the 5 shards of split 'train' are missing"),
    (lambda root: (root / "train-000004.tar").write_bytes((root / "train-000004.tar").read_bytes()[:5000]),
     "train-000004.tar is not a readable uncompressed tar"),
    (lambda root: add_member(root / "train-000001.tar", "extra.cls", b"1"), "sample extra has no image member"),
    (lambda root: add_member(root / "train-000001.tar", "extra.jpg", b"x"), "sample extra has no label"),
    (lambda root: (add_member(root / "train-000001.tar", "extra.jpg", b"x"),
                   add_member(root / "train-000001.tar", "extra.cls", b"cat")), "sample extra has a label member"),
    (lambda root: (add_member(root / "train-000001.tar", "extra.jpg", b"x"),
                   add_member(root / "train-000001.tar", "extra.cls", b"1")),
     "train-000001.tar holds 6 samples but _info.json says 5"),
    (lambda root: (root / "_info.json").write_text(json.dumps({"splits": {"train": {"filenames": ["train-000000.tar"],
                                                                                    "shard_lengths": [5, 5]}}})),
     "lists 1 shards but 2 shard_lengths"),
    (lambda root: (root / "_info.json").write_text("{"), "is not valid JSON"),
], ids=["missing shard", "truncated", "no image", "no label", "bad label", "count", "info lengths", "info json"])
def test_bad_shards_are_refused_before_training_by_name(written: Path, damage, message: str) -> None:
    damage(written)
    with pytest.raises(UserError, match=message):
        find_split(written, "wds", "train")


def test_a_damaged_header_inside_a_shard_is_refused_not_read_as_its_end(written: Path) -> None:
    shard = written / "train-000002.tar"
    with tarfile.open(shard) as tar:
        third = tar.getmembers()[6]  # three members a sample: the third sample's first header
    with open(shard, "r+b") as f:
        f.seek(third.offset + 148)  # its checksum: tarfile would stop here as at the archive's end
        f.write(b"garbage!")
    with pytest.raises(UserError, match=f"train-000002.tar is damaged at byte {third.offset}"):
        find_split(written, "wds", "train-000002.tar")


def test_members_group_and_choose_as_webdataset_and_timm_do(written: Path, caplog) -> None:
    shard = written / "train-000000.tar"
    jpeg = find_split(written, "wds", "train-000001.tar")[0][0][0].open().read()
    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png, format="PNG")
    for name, data in (("__meta__", b"x"), ("_under.JPG", jpeg), ("_under.png", png.getvalue()), ("_under.cls", b"1"),
                       ("unlabelled.jpg", jpeg), ("unlabelled.cls", b"-1")):
        add_member(shard, name, data)
    (written / "_info.json").unlink()  # the shard no longer holds the count it says
    with caplog.at_level(logging.WARNING):
        samples = {source.key: (source, label) for source, label in find_split(written, "wds", "train-000000.tar")[0]}
    assert "unlabelled" not in samples and "1 of 7 samples have no label" in caplog.text  # -1: timm skips them too
    assert "__meta__" not in samples and samples["_under"][1] == 1  # only top-level __name__ members are metadata
    assert decode_image(samples["_under"][0]).size == (40, 40)  # the first of the usual extensions, .jpg (any case)
    preferred = find_split(written, "wds", "train-000000.tar", input_key="png;jpg")[0]
    chosen = {source.key: source for source, _ in preferred}
    assert decode_image(chosen["_under"]).size == (8, 8)  # input_key's order, not the tar's


def test_split_names_labels_and_image_extensions_are_checked(written: Path) -> None:
    with pytest.raises(UserError, match="has no split 'validation' \\(it has train, val\\); set val_split"):
        find_split(written, "wds", "validation")
    with pytest.raises(UserError, match="label 2, outside the 2 classes"):
        find_split(written, "wds", "val", ["class_0", "class_1"])
    with pytest.raises(UserError, match="no image member \\(looked for .webp; it has [^)]*\\.cls[^)]*\\); set "
                                        "input_key"):
        find_split(written, "wds", "train", input_key="webp")
    with pytest.raises(UserError, match="no label \\(a .json member with a 'target' field\\)"):
        find_split(written, "wds", "train", target_key="target")
    assert find_split(written, "wds", "train", target_key="label")[0] == find_split(written, "wds", "train")[0]
    with pytest.raises(UserError, match="not a kind of data.*wds/<name>"):
        find_split(written, "tfds/tiny", "train")
    with pytest.raises(UserError, match="_info.json is a file, not a folder"):
        find_split(written / "_info.json", "wds", "train")
    with pytest.raises(UserError, match="looks like WebDataset shards with _info.json: set dataset to wds/<name>"):
        find_split(written, None, "train", split_key="train_split")  # an image folder's settings on shards


def test_the_writer_refuses_bad_input_by_name(image_root: Path, written: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="already holds shards"):
        shards.write_shards(image_root, written, 5, ["train", "val"])
    with pytest.raises(UserError, match="--shard-size must be at least 1"):
        shards.write_shards(image_root, tmp_path / "other", 0, ["train"])
    broken = next((image_root / "val" / "class_2").glob("*.png"))
    broken.write_bytes(b"not an image")
    with pytest.raises(UserError, match=f"{broken.name} cannot be read"):
        shards.write_shards(image_root, tmp_path / "other", 5, ["train", "val"])
    assert not (tmp_path / "other" / "_info.json").exists()  # an unfinished folder has no _info.json
    with pytest.raises(UserError, match="test does not exist"):  # every split is scanned before any is written
        shards.write_shards(image_root, tmp_path / "third", 5, ["train", "test"])
    assert not list((tmp_path / "third").glob("*.tar"))
    assert shards.main(["--src", str(tmp_path / "absent"), "--out", str(tmp_path / "x")]) == 2


def test_reading_more_shards_than_the_limit_keeps_the_limit_open_and_closes_the_rest(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(shard_reader, "_OPEN_LIMIT", 2)
    monkeypatch.setattr(shard_reader, "_open", type(shard_reader._open)())
    paths = [tmp_path / f"{i}.tar" for i in range(4)]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i]) * 8)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        for i, path in enumerate(paths):
            assert shard_reader.TarMember(str(path), 2, 3, "k").open().read() == bytes([i]) * 3
    assert list(shard_reader._open) == [str(p) for p in paths[-2:]]  # the last two read
    assert len(os.listdir("/proc/self/fd")) == before + 2  # the evicted ones closed
    for fd in shard_reader._open.values():
        os.close(fd)
