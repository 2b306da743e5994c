"""One interface for every position encoding of the ViT: the positions of a batch in, what each block needs out.

As PaPE's ``pape/nn/positions/base.py`` and timm's NaFlexViT (one embedding path for both kinds of batch), each block
gets one ``encoding`` argument: RoPE tables ``(cos, sin)``, a ``BlockInput`` or None. Adding a kind: docs/layout.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from vit_rope.encodings.policies import PolicyChoice, ResolutionPolicy
from vit_rope.layers.attention import BlockInput  # noqa: F401  (attention's side of the interface, re-exported)
from vit_rope.layers.lattice import Lattice
from vit_rope.layers.rotary import grid_positions

T = TypeVar("T")


class Positions(NamedTuple):
    """The patch positions of a batch, built once per forward: ``coords`` ``[N, 2]`` if shared, else ``[B, N, 2]``;
    ``grid`` an image batch's in Python ints (the key of cached tables); ``lattice`` a NaFlex batch's bounding grid (a
    host sync, only RoPE takes it); ``captured``: under a graph capture (no Python caches, no in-place writes)."""

    coords: Tensor
    grids: Tensor
    grid: tuple[int, int] | None = None
    valid: Tensor | None = None
    lattice: Callable[[], Lattice | None] | None = None
    captured: bool = False

    @property
    def image_batch(self) -> bool:
        """An eager image batch: one grid for every sample outside a capture, what cached tables per grid serve."""
        return not self.captured and self.grid is not None and self.coords.dim() == 2


def image_coords(height: int, width: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """The row-major patch coordinates ``[h * w, 2]`` (y, x) and the grid ``[1, 2]``: an image batch as NaFlex."""
    coord = grid_positions(height, width, device, torch.long).flip(-1)  # [N, 2] (y, x)
    return coord, coord[-1:] + 1  # the last patch is (h - 1, w - 1): the grid without a Python number in a tensor


def image_positions(encoding: nn.Module, height: int, width: int, device: torch.device | None = None) -> Positions:
    """The unaugmented ``Positions`` of an image batch on a ``height x width`` grid, as ``encoding`` places them."""
    coord, grids = image_coords(height, width, device)
    return Positions(encoding.place(coord, grids), grids, (height, width))


class LazyBlockInputs(Sequence):
    """Each block's input built on demand (inference holds one block's tables, not ``[depth, H, N, D/2]``), uncached."""

    def __init__(self, build: Callable[[int], Any], depth: int) -> None:
        self.build, self.depth = build, depth

    def __len__(self) -> int:
        return self.depth

    def __getitem__(self, index: Any) -> Any:
        blocks = range(self.depth)[index]  # a list's indexing: negative, slices, IndexError past the end
        return [self.build(i) for i in blocks] if isinstance(index, slice) else self.build(blocks)


class GridTables:
    """The tables of the last few image-batch grids (LRU), for tables costlier than a rotation's."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._tables: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, key: Hashable | None, build: Callable[[], T]) -> T:
        """``build()``, kept under ``key`` (``None``: built every time, as tables that must not be kept)."""
        if key is None:
            return build()
        if key in self._tables:
            self._tables.move_to_end(key)
        else:
            self._tables[key] = build()
            while len(self._tables) > self.size:
                self._tables.popitem(last=False)
        return self._tables[key]

    def clear(self) -> None:
        self._tables.clear()


class Kept:
    """One value (a basis folded into a projection) kept while its source tensors stay the same objects (held, so no
    other takes their id) at the same versions (where tracked: inference tensors have none)."""

    def __init__(self) -> None:
        self._kept: tuple[Any, ...] | None = None

    def get(self, build: Callable[[], T], *sources: Tensor | None) -> T:
        key = tuple((id(t), t.data_ptr(), None if t.is_inference() else t._version) for t in sources if t is not None)
        if self._kept is None or self._kept[0] != key:
            self._kept = (key, sources, build())
        return self._kept[2]

    def clear(self) -> None:
        self._kept = None


class PositionEncoding(PolicyChoice, nn.Module):
    """What every position encoding implements; ``policies``: those that apply to the kind, its default first."""

    def __init__(self, kind: str, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None) -> None:
        super().__init__()
        self.kind, self.depth = kind, depth
        self.train_grid = None if train_grid is None else (int(train_grid[0]), int(train_grid[1]))
        self.policy = policy

    def attach_(self, blocks: nn.ModuleList, dim: int, num_heads: int) -> None:
        """Give each block's attention the kind's own weights there (PaPE's layers, STRING's bases); none by default."""

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        """Positions (x, y) of the patches at ``coord`` (y, x) of ``grids``; the integer coordinates by default."""
        return coord.flip(-1).float()

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        """Each block's ``encoding`` argument; a plain method, which FX traces through (it never unpacks)."""
        raise NotImplementedError

    def prune_(self, depth: int) -> None:
        """Keep what the first ``depth`` blocks need (timm's ``prune_intermediate_layers``)."""
        self.depth = depth

    def no_weight_decay(self) -> set[str]:
        """Parameter names (relative to this module) to train without weight decay."""
        return set()

    def fold_(self, blocks: nn.ModuleList) -> None:
        """Fold attention state into the blocks' weights where cheaper (STRING's basis; ONNX export calls it)."""

    def extra_repr(self) -> str:
        return f"kind={self.kind}, depth={self.depth}, train_grid={self.train_grid}, policy={self.policy_name}"


class NoEncoding(PositionEncoding):
    """No position encoding: attention sees content only (the control of the encodings study)."""

    def __init__(self, depth: int, train_grid: tuple[int, int] | None = None) -> None:
        super().__init__("none", depth, train_grid)  # every policy is taken, and changes nothing

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        return [None] * self.depth


@dataclass(frozen=True)
class EncodingSpec:
    """What every kind is built from. ``train_grid`` is ``ref_grid`` where policies scale against another (RoPE kinds
    only); ``rope_options``: the ``rope_*`` arguments unprefixed; ``options``: the model's ``encoding_options``."""

    kind: str
    depth: int
    num_heads: int
    head_dim: int
    train_grid: tuple[int, int]
    policy: str | dict | ResolutionPolicy | None = None
    rope_options: dict[str, Any] = field(default_factory=dict)
    ref_grid: tuple[int, int] | None = None
    options: dict[str, Any] = field(default_factory=dict)


class Kind(NamedTuple):
    """A registered kind: its builder, the ``encoding_options`` it takes, and whether it takes RoPE's options."""

    build: Callable[[EncodingSpec], PositionEncoding]
    options: tuple[str, ...] = ()
    rope: bool = False


REGISTRY: dict[str, Kind] = {}


def register(*kinds: str, options: tuple[str, ...] = (), rope: bool = False
             ) -> Callable[[Callable[[EncodingSpec], PositionEncoding]], Callable[[EncodingSpec], PositionEncoding]]:
    """Register the decorated builder for ``kinds`` (each kind's module calls it; vit_rope.encodings imports them)."""
    def decorate(build: Callable[[EncodingSpec], PositionEncoding]) -> Callable[[EncodingSpec], PositionEncoding]:
        for kind in kinds:
            if kind in REGISTRY:
                raise ValueError(f"Position encoding {kind!r} is registered twice.")
            REGISTRY[kind] = Kind(build, options, rope)
        return build
    return decorate


@register("none")
def _none(spec: EncodingSpec) -> PositionEncoding:
    return NoEncoding(spec.depth, spec.train_grid)
