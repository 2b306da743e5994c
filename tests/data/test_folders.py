"""Data side (vit_rope.data.folders): folder scanning and its errors, RGB conversion whatever the file's mode, the
decoded cache (the short side shrunk, one flat store, reused until a file changes), skipping unreadable images."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from timm.data import resolve_data_config

from vit_rope.data import folders
from vit_rope.data.pipeline import BatchLoader
from vit_rope.errors import UserError
from vit_rope.train import loaders
from vit_rope.train.command_line import build_config

DATA_CONFIG = resolve_data_config({"input_size": (3, 32, 32), "crop_pct": 0.875, "interpolation": "bilinear"})


def test_find_images_lists_every_image_with_train_class_indices(image_root: Path) -> None:
    train, classes = folders.find_images(image_root / "train")
    val, _ = folders.find_images(image_root / "val", classes)
    assert classes == ["class_0", "class_1", "class_2"]
    assert len(train) == 24 and len(val) == 12
    assert sorted({target for _, target in val}) == [0, 1, 2]


@pytest.mark.parametrize("breakage, message", [
    (lambda root: [(root / "train").rename(root / "gone"), (root / "train").mkdir()], "has no class folders"),
    (lambda root: (root / "val").rename(root / "valid"), "val does not exist"),
    (lambda root: [p.unlink() for p in (root / "train" / "class_2").iterdir()], "class_2 holds no images"),
    (lambda root: [p.rename(p.with_suffix(".txt")) for p in (root / "train" / "class_1").iterdir()],
     "class_1 holds no images"),
    (lambda root: (root / "val" / "class_9").mkdir(), "class_9 is a class the train split does not have"),
    (lambda root: [p.write_bytes(b"not an image") for p in (root / "val").rglob("*.*")],
     r"none of the \d+ images under .*val can be read \(e.g. .*val/class_0/"),
])
def test_bad_layouts_are_user_errors_naming_the_path(image_root: Path, breakage, message: str) -> None:
    breakage(image_root)
    with pytest.raises(UserError, match=message):
        _, classes = folders.find_images(image_root / "train")
        folders.find_images(image_root / "val", classes)


def test_grayscale_and_cmyk_images_come_out_rgb(image_root: Path) -> None:
    for name in ("class_0/0.jpg", "class_1/0.jpg"):
        image = folders.decode_image(str(image_root / "train" / name))
        assert image.mode == "RGB" and image.size == (40, 40)
    assert folders.decode_image(str(image_root / "train" / "class_0" / "0.jpg"), short_side=20).size == (20, 20)


def test_cache_shrinks_large_images_to_the_short_side(image_root: Path) -> None:
    paths = [str(p) for p in sorted((image_root / "val" / "class_0").iterdir())]
    images = folders.DecodedImages.build(paths, short_side=16, workers=0)
    assert images.image(0).size == (16, 16) and images.data.dtype == torch.uint8


def test_the_cache_file_is_reused_until_a_file_changes(image_root: Path, tmp_path: Path) -> None:
    paths = [str(p) for p in sorted((image_root / "val" / "class_0").iterdir())]
    first = folders.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    again = folders.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    assert len(list(tmp_path.glob("decoded-16px-*.pt"))) == 1 and torch.equal(first.data, again.data)
    Path(paths[0]).touch()  # a new modification time: the dataset may have changed, so it is decoded again
    folders.DecodedImages.load_or_build(paths, 16, 0, tmp_path)
    assert len(list(tmp_path.glob("decoded-16px-*.pt"))) == 2


def test_an_unreadable_file_is_kept_as_an_empty_entry_that_raises_on_use(image_root: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    good = str(next((image_root / "val" / "class_0").iterdir()))
    images = folders.DecodedImages.build([str(broken), good], short_side=16, workers=0)
    assert images.shapes[0].tolist() == [0, 0] and images.image(1).size == (16, 16)
    with pytest.raises(OSError, match="could not be decoded"):
        images.image(0)


def _loaders(root: Path, *overrides: str):
    cfg = build_config(None, ["img_size=32", "batch_size=4", "workers=0", *overrides])
    train, classes = folders.find_images(root / "train")
    val, _ = folders.find_images(root / "val", classes)
    return loaders.build_loaders(cfg, train, val, DATA_CONFIG)


def test_decoded_cache_gives_the_same_validation_batches_and_is_reused_from_disk(image_root: Path,
                                                                                   tmp_path: Path) -> None:
    _, plain = _loaders(image_root)
    _, cached = _loaders(image_root, "decoded_cache=true", f"cache_dir={tmp_path / 'cache'}", "cache_size=64")
    for (x, y, _), (xc, yc, _) in zip(plain, cached, strict=True):
        assert torch.equal(y, yc) and torch.allclose(x, xc)  # 40 px images fit the cache: no shrinking
    files = list((tmp_path / "cache").glob("decoded-64px-*.pt"))
    assert len(files) == 2  # train and val
    _, again = _loaders(image_root, "decoded_cache=true", f"cache_dir={tmp_path / 'cache'}", "cache_size=64")
    assert torch.equal(next(iter(again))[0], next(iter(cached))[0])


@pytest.mark.parametrize("overrides", [(), ("decoded_cache=true",), ("decoded_cache=true", "auto_augment=null",
                                                                       "reprob=0")], ids=["files", "cached", "tensor"])
def test_unreadable_image_is_replaced_warned_by_path_and_counted(image_root: Path, caplog,
                                                                 overrides: tuple[str, ...]) -> None:
    bad = image_root / "train" / "class_2" / "3.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    train, _ = _loaders(image_root, *overrides)
    assert isinstance(train, BatchLoader) == ("reprob=0" in overrides)
    with caplog.at_level(logging.WARNING):
        skipped = sum(int(batch[2].sum()) for batch in train)
    assert skipped == 1
    assert str(bad) in caplog.text and "unreadable image" in caplog.text


def test_data_dir_resolution_and_a_failed_download(tmp_path: Path, monkeypatch) -> None:
    assert folders.resolve_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setattr(folders, "REPO_ROOT", tmp_path / "repo")
    shared = tmp_path / "shared" / "data" / "imagenette"
    shared.mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")  # where train.py runs: the saved config names no machine path
    assert folders.resolve_data_dir(None) == Path("../shared/data/imagenette")
    assert folders.resolve_data_dir(None).resolve() == shared.resolve()

    shared.rmdir()
    calls = []

    class FakeImagenette:  # stands in for the download: no network in tests
        def __init__(self, root, split, size, download):
            calls.append((Path(root), split, size, download))

    monkeypatch.setattr("torchvision.datasets.Imagenette", FakeImagenette)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert folders.resolve_data_dir(None, "160px") == tmp_path / "cache" / "vit_rope" / "imagenette2-160"
    assert calls == [(tmp_path / "cache" / "vit_rope", split, "160px", True) for split in ("train", "val")]

    def offline(*args, **kwargs):
        raise RuntimeError("network unreachable")

    monkeypatch.setattr("torchvision.datasets.Imagenette", offline)  # a failed download is a user error
    with pytest.raises(UserError, match="could not download Imagenette.*pass --data-dir"):
        folders.resolve_data_dir(None)


BATCHED = ("decoded_cache=true", "auto_augment=null", "reprob=0")


@pytest.mark.parametrize("overrides, expected", [
    (BATCHED, ("tensor", "every augmentation of the config batches")),
    (BATCHED[1:], ("timm", "decoded_cache is off")),
    ((*BATCHED, "reprob=0.25"), ("timm", "random erasing (reprob=0.25) is per image")),
    ((*BATCHED, "auto_augment=3a"), ("timm", "auto_augment=3a is per image")),
    ((*BATCHED, "train_crop_mode=rkrr"), ("timm", "train_crop_mode=rkrr is timm's only")),
    ((*BATCHED, "pipeline=timm"), ("timm", "pipeline=timm")),
])
def test_auto_pipeline_is_tensor_only_when_every_augmentation_batches(overrides, expected) -> None:
    name, why = loaders.choose_pipeline(build_config(None, list(overrides)))
    assert name == expected[0] and expected[1] in why


def test_tensor_pipeline_refuses_a_per_image_config_naming_the_keys() -> None:
    with pytest.raises(UserError, match=r"pipeline=tensor cannot run this config: .*auto_augment=rand.*reprob=0.25"):
        loaders.choose_pipeline(build_config(None, ["decoded_cache=true", "pipeline=tensor"]))


def test_tensor_loaders_read_the_store_only_and_never_decode_again(image_root: Path, tmp_path: Path,
                                                                   monkeypatch, capsys) -> None:
    cache = f"cache_dir={tmp_path / 'cache'}"
    first_train, first_val = _loaders(image_root, *BATCHED, cache, "cache_size=40")
    assert isinstance(first_train, BatchLoader) and isinstance(first_val, BatchLoader)
    assert "data pipeline: tensor" in capsys.readouterr().out

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded again")

    monkeypatch.setattr(folders.DecodedImages, "build", no_decoding)
    train_loader, val_loader = _loaders(image_root, *BATCHED, cache, "cache_size=40")  # the cache file, memory-mapped
    for epoch in (0, 1):
        loaders.set_epoch(train_loader, epoch)
        batches = list(train_loader)
        assert len(batches) == len(train_loader) == 24 // 4 and all(x.shape == (4, 3, 32, 32) for x, _, _ in batches)
    loaders.set_epoch(first_train, 1)
    assert all(torch.equal(x, y) for (x, _, _), (y, _, _) in zip(batches, first_train, strict=True))
    seen = torch.cat([targets for _, targets, _ in val_loader])
    val_samples, _ = folders.find_images(image_root / "val", ["class_0", "class_1", "class_2"])
    assert sorted(seen.tolist()) == sorted(target for _, target in val_samples)  # every val image once
