"""One checked ``Config`` from defaults, a YAML chain and the command line (apart from ``config`` to avoid an import
circle with ``config_checks``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vit_rope.train.config import CLI_FLAGS, Config, load_yaml, parse_override
from vit_rope.train.config_checks import check_config
from vit_rope.train.resume import saved_settings


def build_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                 base: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the YAML chain of ``path`` (or the typed values ``base``), then the overrides, validated."""
    values = load_yaml(path) if path else dict(base or {})
    for item in overrides:
        key, entry, value = parse_override(item)
        values[key] = {**values.get(key, {}), entry: value} if entry else value
    cfg = Config(**values)
    check_config(cfg)
    return cfg


def parse_args(argv: list[str] | None = None) -> Config:
    """The ``train.py`` command line as a validated ``Config``: named flags (``--epochs 3``) are ``key=value``
    shorthands; ``--resume`` without ``-c`` starts from the settings of the run that wrote the checkpoint."""
    parser = argparse.ArgumentParser(
        description="Train a timm image classifier (RoPE ViTs included) from a YAML config.",
        epilog="Any config key can be set as key=value, e.g. lr=4e-3 model_kwargs.depth=6 auto_augment=null.")
    parser.add_argument("-c", "--config", help="YAML config file (see configs/)")
    for key, metavar in CLI_FLAGS.items():
        parser.add_argument("--" + key.replace("_", "-"), dest=key, metavar=metavar, help=f"same as {key}={metavar}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_intermixed_args(argv)
    flags = [f"{key}={getattr(args, key)}" for key in CLI_FLAGS if getattr(args, key) is not None]
    resume = [parse_override(item)[2] for item in flags + args.overrides if item.startswith("resume=")]
    base = saved_settings(resume[-1]) if resume and resume[-1] and not args.config else None
    return build_config(args.config, flags + args.overrides, base)
