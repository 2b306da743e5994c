"""A split of a data set as ``(source, class index)`` samples sorted by class, whatever holds it: an image folder,
WebDataset shards or a Hugging Face dataset on disk, named with timm's prefixes (docs/data.md)."""

from __future__ import annotations

from pathlib import Path

from vit_rope.data.folders import Sample, find_images
from vit_rope.data.hf_datasets import find_dataset_samples
from vit_rope.data.shard_reader import find_shard_samples
from vit_rope.errors import UserError

KINDS = {"": "an image folder (train/ and val/ of class folders)", "wds": "WebDataset shards with _info.json",
         "hfds": "a Hugging Face dataset on disk"}
WHERE = {"wds": "the shards and _info.json", "hfds": "the saved dataset (DatasetDict.save_to_disk) or its data files"}


def dataset_kind(dataset: str | None) -> str:
    """``""`` (empty, ``folder``, ``imagefolder``), ``"wds"`` or ``"hfds"`` from a setting like ``wds/imagenet-1k``."""
    prefix = (dataset or "").partition("/")[0].lower()
    prefix = "" if prefix in ("folder", "imagefolder") else prefix  # to say "an image folder" explicitly
    if prefix not in KINDS:
        choices = "; ".join(f"{f'{kind}/<name>' if kind else 'empty or folder'}: {what}"
                            for kind, what in KINDS.items())
        raise UserError(f"dataset '{dataset}' is not a kind of data this toolkit reads ({choices})")
    return prefix


def find_split(data_dir: Path, dataset: str | None, split: str, classes: list[str] | None = None,
               split_key: str = "val_split", input_key: str | None = None, target_key: str | None = None,
               cache_dir: Path | None = None) -> tuple[list[Sample], list[str]]:
    """``(samples, classes)`` of ``split``, checked against the train split's ``classes`` (None for it); an error names
    ``split_key``, and says so when ``data_dir`` looks like another kind of data."""
    kind = dataset_kind(dataset)
    if kind and not data_dir.is_dir():  # an image folder's own check names the split folder it misses
        what = "is a file, not a folder" if data_dir.exists() else "does not exist"
        raise UserError(f"{data_dir} {what}; point data_dir at the folder that holds {WHERE[kind]}")
    try:
        if kind == "wds":
            return find_shard_samples(data_dir, split, classes, split_key, input_key, target_key, cache_dir)
        if kind == "hfds":
            return find_dataset_samples(data_dir, split, classes, split_key, input_key, target_key)
        # a missing train folder gets no hint: the other folders are the val split's
        return find_images(data_dir / split, classes, split_key if split_key != "train_split" else None)
    except UserError as err:
        found = looks_like(data_dir)
        if found is None or found == kind:
            raise
        raise UserError(f"{err}; {data_dir} looks like {KINDS[found]}: set dataset to "
                        f"{f'{found}/<name>' if found else 'folder'}") from None


def split_label(data_dir: Path | str, dataset: str | None, split: str) -> str:
    """A split named for the messages: the folder of an image folder's split, else the data and the split's name."""
    return f"{dataset} in {data_dir} [{split}]" if dataset_kind(dataset) else str(Path(data_dir) / split)


def looks_like(data_dir: Path) -> str | None:
    """The kind of data ``data_dir`` seems to hold (shards, a saved or Hub dataset, class folders); None: unsure."""
    if not data_dir.is_dir():
        return None
    names = {path.name for path in data_dir.iterdir()}
    if names & {"_info.json", "info.json"} or any(name.endswith(".tar") for name in names):
        return "wds"
    if names & {"dataset_dict.json", "dataset_info.json", "state.json"} or any(
            path.suffix in (".parquet", ".arrow") for path in data_dir.glob("*/*")):  # data/*.parquet, train/*.arrow
        return "hfds"
    if any(path.is_dir() and any(child.is_dir() for child in path.iterdir()) for path in data_dir.iterdir()):
        return ""
    return None
