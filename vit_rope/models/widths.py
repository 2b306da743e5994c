"""The widths of the model sizes, one table for every family so that a size means one width in all of them."""

from __future__ import annotations

# size -> (embed_dim, depth, num_heads); head_dim 64 but for huge (80), gigantic (96) and 5b (76)
_TABLE: dict[str, tuple[int, int, int]] = {
    "tiny": (192, 12, 3), "small": (384, 12, 6), "medium": (512, 12, 8), "mediumd": (512, 20, 8),
    "betwixt": (640, 12, 10), "base": (768, 12, 12), "large": (1024, 24, 16), "huge": (1280, 32, 16),
    "giant": (1536, 40, 24), "gigantic": (1536, 50, 16), "5b": (2432, 56, 32),
}  # fmt: skip


def width(size: str) -> dict[str, int]:
    """``embed_dim``, ``depth`` and ``num_heads`` of ``size`` as model keyword arguments (a fresh dict)."""
    if size not in _TABLE:
        raise KeyError(f"Unknown model size {size!r}: the sizes are {', '.join(_TABLE)}.")
    return dict(zip(("embed_dim", "depth", "num_heads"), _TABLE[size], strict=True))


def size_of(embed_dim: int, sizes: tuple[str, ...]) -> str | None:
    """The one of ``sizes`` whose width is ``embed_dim``, or ``None``; a ``_plus`` size has the width it extends."""
    return next((size for size in sizes if _TABLE[size.removesuffix("_plus")][0] == embed_dim), None)
