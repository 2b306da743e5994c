"""WebDataset shards (timm's ``wds/`` layout) read by random access: each sample located once by an index of the shards'
headers, then read with one ``pread``. Unlike timm's streaming reader, an epoch is then a permutation of (seed, epoch),
each sample read once, and a run resumes mid-epoch to the same batches (docs/data.md)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import socket
import tarfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from vit_rope.data.folders import file_stat
from vit_rope.errors import UserError

_log = logging.getLogger(__name__)
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif", "ppm")  # member extensions tried in order
_OPEN_LIMIT = 64  # shards a process keeps open: well under the usual limit of 1,024 descriptors


class TarMember(NamedTuple):
    shard: str
    offset: int  # of the member's data, past its header
    size: int
    key: str

    def open(self) -> io.BytesIO:
        with _open_lock:  # pread moves no file position, so forked workers may share the descriptors
            fd = _open.pop(self.shard, None)
            if fd is None:
                fd = os.open(self.shard, os.O_RDONLY)
                while len(_open) >= _OPEN_LIMIT:
                    os.close(_open.popitem(last=False)[1])
            _open[self.shard] = fd
            data = os.pread(fd, self.size, self.offset)
        if len(data) != self.size:
            raise OSError(f"the shard ends {self.size - len(data)} bytes early (was it rewritten during the run?)")
        return io.BytesIO(data)

    def fingerprint(self) -> tuple[Any, ...]:
        return (self.shard, self.offset, self.size, file_stat(self.shard))

    def __str__(self) -> str:
        return f"{self.shard}:{self.key}"


# the shards this process keeps open, least recently read first (file objects in an lru_cache warn when evicted)
_open: collections.OrderedDict[str, int] = collections.OrderedDict()
_open_lock = threading.Lock()


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's shard patterns expanded: ``{000000..000146}`` ranges and ``{a,b}`` lists, nested or repeated."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    if ends := re.fullmatch(r"(\d+)\.\.(\d+)", body):
        first, last = ends.groups()
        width = len(first) if first.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(first), int(last) + 1)]
    else:
        items = body.split(",")
    return [name for item in items for name in expand_braces(head + item + tail)]


def load_info(root: Path) -> dict[str, Any]:
    """The ``_info.json`` of a shard folder (timm's name; ``info.json`` too), or ``{}`` when there is none."""
    for name in ("_info.json", "info.json"):
        file = root / name
        if file.is_file():
            try:
                info = json.loads(file.read_text())
            except json.JSONDecodeError as err:
                raise UserError(f"{file} is not valid JSON ({err}); rewrite it or remove it") from None
            if not isinstance(info.get("splits", {}), dict):
                raise UserError(f"{file}: 'splits' must map split names to their shards, as timm's readers read it")
            return info
    return {}


def split_shards(root: Path, split: str, info: dict[str, Any], split_key: str) -> tuple[list[Path], list[int] | None]:
    """``(shards, sample counts or None)`` of ``split``: a split of ``_info.json``, or shard files relative to ``root``
    (a brace pattern or a ``::`` list, timm's ``|N`` sample count optional), the only way without ``_info.json``."""
    splits = info.get("splits", {})
    split, _, stated = split.partition("|")  # timm's "pattern|N": N is checked against the shards' count
    if stated and not stated.isdigit():
        raise UserError(f"{split_key} {split}|{stated}: what follows '|' must be the split's sample count")
    if ".tar" in split:
        files = [name for part in split.split("::") for name in expand_braces(part)]
        lengths = {name: count for entry in splits.values()
                   for name, count in zip(entry.get("filenames", ()), entry.get("shard_lengths", ()), strict=False)}
        counts = [lengths[name] for name in files] if all(name in lengths for name in files) else None
    elif info:
        if split not in splits:
            raise UserError(f"{root}/_info.json has no split '{split}' (it has {', '.join(splits) or 'none'}); set "
                            f"{split_key} to one of them, or to a shard pattern such as {split}-{{000000..000009}}.tar")
        entry = splits[split]
        if missing := [field for field in ("filenames", "shard_lengths") if field not in entry]:
            raise UserError(f"{root}/_info.json: split '{split}' lacks {' and '.join(missing)}; rewrite it with "
                            "python -m vit_rope.shards, or name the shards in " + split_key)
        files, counts = list(entry["filenames"]), [int(n) for n in entry["shard_lengths"]]
        if len(files) != len(counts):
            raise UserError(f"{root}/_info.json: split '{split}' lists {len(files)} shards but {len(counts)} "
                            "shard_lengths; rewrite it with python -m vit_rope.shards")
        if "num_samples" in entry and int(entry["num_samples"]) != sum(counts):
            raise UserError(f"{root}/_info.json: split '{split}' says num_samples {entry['num_samples']} but its "
                            f"shard_lengths add up to {sum(counts)}; rewrite it with python -m vit_rope.shards")
    else:  # no _info.json: an unfinished folder of python -m vit_rope.shards, or shards that only have names
        example = sorted(path.name for path in root.glob("*.tar"))[:1] or [f"{split}-000000.tar"]
        raise UserError(f"{root} has no _info.json, which names each split's shards and counts its samples; name "
                        f"the shards in {split_key} instead (e.g. '{split_key}={example[0]}', a brace pattern such as "
                        f"'{split}-{{000000..000009}}.tar' or a '::' list, quoted against the shell), or write them "
                        "again with python -m vit_rope.shards")
    if stated and counts is not None and sum(counts) != int(stated):
        raise UserError(f"{split_key} says {stated} samples, but _info.json gives these shards {sum(counts)}; fix or "
                        "drop the '|' count")
    paths = [root / name for name in files]
    if absent := [str(path) for path in paths if not path.is_file()]:
        fix = ("check the pattern (ranges {000000..000009} and '::' lists; no * globs)" if ".tar" in split else
               "copy them into data_dir, or fix _info.json")
        raise UserError(f"{len(absent)} of the {len(paths)} shards of split '{split}' are missing (e.g. {absent[0]}); "
                        + fix)
    return paths, counts


class ShardIndex(NamedTuple):
    keys: list[str]
    offsets: list[int]
    sizes: list[int]
    labels: list[int]


def _label(path: Path, key: str, entry: dict[str, Any], target_key: str | None) -> int | None:
    """The class index of a sample from its ``.cls`` member (unless ``target_key``), else its ``.json``'s field."""
    try:
        if not target_key and "cls" in entry:
            return int(entry["cls"].decode().strip())
        value = json.loads(entry["json"]).get(target_key or "label") if "json" in entry else None
        return None if value is None else int(value)
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: sample {key} has a label member that holds no class index ({err}); fix or remove "
                        "that sample") from None


def _check_end(path: Path, end: int) -> None:
    """``tarfile`` takes a damaged header for the end: past ``end``, only a tar's closing zero blocks may follow."""
    with open(path, "rb") as file:
        file.seek(end)
        while chunk := file.read(1 << 20):
            if chunk.strip(b"\0"):
                raise UserError(f"{path} is damaged at byte {end}: the members after it cannot be read; download or "
                                "write the shard again")


def index_shard(path: Path, input_keys: tuple[str, ...], target_key: str | None) -> ShardIndex:
    """Read a shard's headers (not its images): where each sample's image lies and its label, grouped as WebDataset
    groups members (key up to the first dot of the file name, extension the rest; ``__name__`` members are metadata)."""
    samples: dict[str, dict[str, Any]] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile() or re.match(r"__[^/]*__($|/)", member.name):
                    continue
                folder, _, name = member.name.rpartition("/")
                stem, dot, ext = name.partition(".")
                if not dot:
                    continue
                ext = ext.lower()
                read = ext in ("cls", "json") and ext not in input_keys  # labels read, the other members located
                samples.setdefault(f"{folder}/{stem}" if folder else stem, {})[ext] = (
                    tar.extractfile(member).read() if read else (member.offset_data, member.size))
            _check_end(path, tar.offset)
    except (tarfile.TarError, EOFError) as err:
        raise UserError(f"{path} is not a readable uncompressed tar ({err}); download or write it again") from None
    index = ShardIndex([], [], [], [])
    for key, entry in samples.items():
        image = next((entry[ext] for ext in input_keys if ext in entry), None)
        if image is None:
            raise UserError(f"{path}: sample {key} has no image member (looked for .{', .'.join(input_keys)}; it has "
                            f".{', .'.join(entry)}); set input_key to its image extension, or fix the shard")
        label = _label(path, key, entry, target_key)
        if label is None:
            wanted = f"a .json member with a '{target_key}' field" if target_key else "a .cls member or .json 'label'"
            raise UserError(f"{path}: sample {key} has no label ({wanted}); fix the shard, or set target_key")
        for column, value in zip(index, (key, *image, label), strict=True):
            column.append(value)
    return index


def cached_index(path: Path, input_keys: tuple[str, ...], target_key: str | None, cache: Path) -> ShardIndex:
    """``index_shard``, kept in ``cache`` under a hash of the shard's path, size, time and the keys, for later runs."""
    identity = (str(path.resolve()), file_stat(str(path)), input_keys, target_key)
    file = cache / f"{hashlib.sha1(repr(identity).encode()).hexdigest()[:20]}.json"
    if file.is_file():
        with contextlib.suppress(ValueError, TypeError):  # a damaged cache file: index again
            return ShardIndex(**json.loads(file.read_text()))
    index = index_shard(path, input_keys, target_key)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        temporary = file.with_suffix(f".{socket.gethostname()}.{os.getpid()}.tmp")  # a cache_dir machines share
        temporary.write_text(json.dumps(index._asdict()))
        temporary.replace(file)
    except OSError as err:  # a read-only home: index again next time
        _log.warning("could not keep the index of %s in %s (%s)", path, cache, err)
    return index


def find_shard_samples(root: Path, split: str, classes: list[str] | None, split_key: str, input_key: str | None,
                       target_key: str | None, cache_dir: Path | None = None
                       ) -> tuple[list[tuple[TarMember, int]], list[str]]:
    """``(samples, classes)`` of a split of shards, sorted by class, every shard indexed and checked first;
    ``input_key``: image extensions joined by ``;``, ``target_key``: the ``.json`` field of the label."""
    info = load_info(root)
    paths, counts = split_shards(root, split, info, split_key)
    input_keys = tuple(ext.strip().lstrip(".").lower() for ext in input_key.split(";")) if input_key else IMAGE_KEYS
    cache = (cache_dir or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vit_rope") / "shard-index"
    with ThreadPoolExecutor(8) as pool:  # reading headers waits on the disk: threads overlap it
        indices = list(pool.map(lambda path: cached_index(path, input_keys, target_key, cache), paths))
    for path, index, expected in zip(paths, indices, counts or [None] * len(paths), strict=True):
        if expected is not None and len(index.keys) != expected:
            raise UserError(f"{path} holds {len(index.keys)} samples but _info.json says {expected}; the shard is "
                            "incomplete or _info.json is stale: download the shard again or rewrite _info.json")
    samples = [(TarMember(str(path), offset, size, key), label) for path, index in zip(paths, indices, strict=True)
               for key, offset, size, label in zip(index.keys, index.offsets, index.sizes, index.labels, strict=True)]
    return labelled_samples(samples, info.get("classes"), classes, f"split '{split}' of {root}", split_key)


def labelled_samples(samples: list[tuple[Any, int]], names: Sequence[str] | None, classes: list[str] | None,
                     where: str, split_key: str) -> tuple[list[tuple[Any, int]], list[str]]:
    """``(samples, classes)`` of a split whose labels are class indices, sorted by class as a folder's are; samples of a
    negative label (Hugging Face's -1) are left out with a warning, as timm's readers skip them."""
    kept = [sample for sample in samples if sample[1] >= 0]
    if not kept:
        raise UserError(f"{where} has no labelled samples ({len(samples)} in all); check {split_key}")
    if len(kept) < len(samples):
        _log.warning("%s: %d of %d samples have no label (a negative one) and are left out", where,
                     len(samples) - len(kept), len(samples))
    largest = max(label for _, label in kept)
    if classes is None:
        classes = list(names) if names else [str(i) for i in range(largest + 1)]
    if largest >= len(classes):
        raise UserError(f"{where} has label {largest}, outside the {len(classes)} classes of the train split (0 to "
                        f"{len(classes) - 1}): a split of another data set, or a train split without some classes")
    return sorted(kept, key=lambda sample: sample[1]), classes
