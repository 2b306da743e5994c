"""The decoded-image cache (vit_rope.data.decoded): RGB whatever the file's mode, the short side shrunk, one flat
store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vit_rope.data import decoded


def test_grayscale_and_cmyk_images_come_out_rgb(image_root: Path) -> None:
    for name in ("class_0/0.jpg", "class_1/0.jpg"):
        image = decoded.decode_image(str(image_root / "train" / name))
        assert image.mode == "RGB" and image.size == (40, 40)
    assert decoded.decode_image(str(image_root / "train" / "class_0" / "0.jpg"), short_side=20).size == (20, 20)


def test_cache_shrinks_large_images_to_the_short_side(image_root: Path) -> None:
    paths = [str(p) for p in sorted((image_root / "val" / "class_0").iterdir())]
    images = decoded.DecodedImages.build(paths, short_side=16, workers=0)
    assert images.image(0).size == (16, 16) and images.data.dtype == torch.uint8


def test_the_cache_file_is_reused_until_a_file_changes(image_root: Path, tmp_path: Path) -> None:
    paths = [str(p) for p in sorted((image_root / "val" / "class_0").iterdir())]
    first = decoded.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    again = decoded.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    assert len(list(tmp_path.glob("decoded-16px-*.pt"))) == 1 and torch.equal(first.data, again.data)
    Path(paths[0]).touch()  # a new modification time: the dataset may have changed, so it is decoded again
    decoded.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    assert len(list(tmp_path.glob("decoded-16px-*.pt"))) == 2


def test_an_unreadable_file_is_kept_as_an_empty_entry_that_raises_on_use(image_root: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    good = str(next((image_root / "val" / "class_0").iterdir()))
    images = decoded.DecodedImages.build([str(broken), good], short_side=16, workers=0)
    assert images.shapes[0].tolist() == [0, 0] and images.image(1).size == (16, 16)
    with pytest.raises(OSError, match="could not be decoded"):
        images.image(0)
