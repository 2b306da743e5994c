"""The oldest timm vit_rope runs on, checked at import to fail with the fix; optional imports naming their extra."""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import timm

from vit_rope.errors import UserError

TIMM_MIN = (1, 0, 31)


def check_timm(version: str) -> None:
    """Raise ImportError, naming the version found and the fix, when ``version`` is older than ``TIMM_MIN``."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if found < TIMM_MIN:
        need = ".".join(map(str, TIMM_MIN))
        raise ImportError(f"vit_rope needs timm >= {need}, found timm {version}: pip install 'timm>={need}' "
                          "(offline: pip install a timm wheel brought along)")


check_timm(timm.__version__)


def require(module: str, extra: str) -> ModuleType:
    """Import an optional package, or raise a ``UserError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise UserError(f"this needs the {module} package, not installed here: pip install 'vit-rope[{extra}]' (or "
                        f"pip install {module})") from None
