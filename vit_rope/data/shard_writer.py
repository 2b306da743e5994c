"""Writing an image folder as WebDataset shards in timm's layout, for ``dataset: wds/<name>``.

Each split's order is shuffled by ``--seed`` so that every shard mixes the classes (timm's streaming reader needs it);
``_info.json`` is written last: a folder without it was not finished (docs/data.md)."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from vit_rope._requires import require
from vit_rope.data.folders import Sample, find_images
from vit_rope.errors import UserError

KEPT_FORMATS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}  # written as they are; timm's reader decodes these


def image_member(path: str) -> tuple[str, bytes]:
    """``(extension, bytes)`` of an image file for its shard: its own bytes when timm's reader takes the format."""
    with Image.open(path) as image:
        image.verify()  # a truncated or corrupt file fails here, before any shard is written
    with Image.open(path) as image:
        if ext := KEPT_FORMATS.get(image.format or ""):
            return ext, Path(path).read_bytes()
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
        return "png", buffer.getvalue()


def write_split(src: Path, out: Path, split: str, samples: list[Sample], classes: list[str], shard_size: int,
                seed: int) -> dict:
    """Write one split's shards; returns its ``_info.json`` entry."""
    wds = require("webdataset", "wds")
    order = np.random.default_rng(seed).permutation(len(samples))
    # only the count starts a new shard (not webdataset's 3 GB default), so that _info.json's lengths are the shards'
    with wds.ShardWriter(str(out / f"{split}-%06d.tar"), maxcount=shard_size, maxsize=float("inf"), verbose=0) as sink:
        for position, index in enumerate(order):
            path, label = samples[index]
            try:
                ext, data = image_member(path)
            except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
                raise UserError(f"{path} cannot be read ({err}); replace or remove it, then run again") from None
            sink.write({"__key__": f"{position:08d}", ext: data, "cls": int(label),
                        "json": {"label": int(label), "class": classes[label],
                                 "filename": os.path.relpath(path, src / split)}})
    lengths = [min(shard_size, len(samples) - start) for start in range(0, len(samples), shard_size)]
    files = [f"{split}-{i:06d}.tar" for i in range(len(lengths))]
    return {"name": split, "num_samples": len(samples), "filenames": files, "shard_lengths": lengths}


def write_shards(src: Path, out: Path, shard_size: int, splits: list[str], seed: int = 0) -> dict:
    """Every split of ``src`` as shards in ``out``, all scanned first; returns the ``_info.json`` written last."""
    if shard_size < 1:
        raise UserError(f"--shard-size must be at least 1, got {shard_size}")
    if not src.is_dir():
        raise UserError(f"--src {src} does not exist; pass an image folder with train/ and val/ class folders")
    if (out / "_info.json").exists():
        raise UserError(f"{out} already holds shards (_info.json); pass another --out, or remove it first")
    if "train" not in splits:
        raise UserError(f"--splits {' '.join(splits)} lacks train, whose classes the other splits are indexed by")
    scanned = {"train": find_images(src / "train")}
    classes = scanned["train"][1]
    scanned |= {split: find_images(src / split, classes) for split in splits if split != "train"}
    out.mkdir(parents=True, exist_ok=True)
    info = {"name": out.name, "splits": {split: write_split(src, out, split, samples, classes, shard_size, seed)
                                         for split, (samples, _) in scanned.items()}, "classes": classes}
    temporary = out / "_info.json.tmp"
    temporary.write_text(json.dumps(info, indent=1))
    temporary.replace(out / "_info.json")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vit_rope.shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, type=Path, help="image folder: one folder per split, of class folders")
    parser.add_argument("--out", required=True, type=Path, help="folder for the shards and _info.json")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard (default 1000)")
    parser.add_argument("--splits", nargs="+", default=None, metavar="NAME",
                        help="split folders of --src to write (default: train and every other folder of --src)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled order (default 0)")
    args = parser.parse_args(argv)
    splits = args.splits or sorted(d.name for d in args.src.iterdir() if d.is_dir() and not d.name.startswith(".")) \
        if args.src.is_dir() else ["train"]
    start = time.perf_counter()
    try:
        info = write_shards(args.src, args.out, args.shard_size, splits, args.seed)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    written = ", ".join(f"{name}: {entry['num_samples']} samples in {len(entry['filenames'])} shard"
                        + "s" * (len(entry["filenames"]) > 1) for name, entry in info["splits"].items())
    print(f"{args.out}: {written}, {len(info['classes'])} classes, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
