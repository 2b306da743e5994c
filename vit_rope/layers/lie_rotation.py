"""Rotations ``R(p) = exp(sum_i p_i A_i)`` from learned skew-symmetric generators, acting on blocks of channels.

ComRoPE (``vit_rope.layers.comrope``) and LieRE (``vit_rope.layers.liere``) both rotate each query and key by such an
``R`` instead of RoPE's 2x2 pairs: the head's ``D`` channels are cut into ``D / b`` contiguous blocks of ``b``, and
each block gets its own ``b x b`` orthogonal matrix per token (and per head, per layer where the kind learns them).
What differs between them is how the generators ``A_x, A_y`` are parametrised (commuting or not) and where a patch
sits; this module holds what they share:

- ``expm``: the matrix exponential. Eager runs take ``torch.linalg.matrix_exp``; graph captures (torch.compile,
  export, ONNX, FX) take scaling and squaring with a Taylor polynomial written in matmuls (every ONNX runtime has
  them; ``matrix_exp`` has no ONNX op), with the squarings counted from the norm and masked, so one graph serves
  every position range.
- ``rotate_blocks``: ``R`` applied to q or k ``[B, H, N, D]``. A table shared by the batch (an image batch) is one
  batched matmul with the batch as the last dimension (``[H, N, m, b, b] @ [H, N, m, b, B]``), 2.5x faster on CPU
  than the per-token matrix-vector product it replaces, which per-sample tables (NaFlex) take.
- ``BlockRotation``: the ``PositionEncoding`` of both kinds: tables ``[1 or B, H, P + N, D/b, b, b]`` per block
  (prefix tokens at a kind's own position, or the identity), built once per forward and, for an image batch in
  evaluation, kept per grid until the generators change.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import register_notrace_module
from torch import Tensor

from vit_rope.layers.capture import capturing
from vit_rope.layers.encoding import GridTables, PositionEncoding, Positions
from vit_rope.layers.policies import ResolutionPolicy

TAYLOR_ORDER = 12  # after scaling to a norm <= 1/2: remainder below 0.5**13 / 13! ~ 1e-14
MAX_SQUARINGS = 16  # norms up to 2**15: far past any position range times generator a model meets


def expm(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` matrices, in fp32 at least: ``torch.linalg.matrix_exp`` in eager, scaling and
    squaring of a Taylor polynomial (matmuls only) under a graph capture, equal to 1e-6."""
    dtype = skew.dtype
    if dtype not in (torch.float32, torch.float64):
        skew = skew.float()
    if not capturing(skew):
        return torch.linalg.matrix_exp(skew.contiguous()).to(dtype)
    return expm_by_squaring(skew).to(dtype)


def expm_by_squaring(skew: Tensor) -> Tensor:
    """``exp(S)`` of ``[..., b, b]`` by scaling, a Taylor polynomial and squaring: matmuls and ``where`` only, so that
    ONNX exports it; the squarings follow each matrix's norm, masked past its own count."""
    norm = skew.abs().sum(-1).amax(-1)  # [...] the infinity norm bounds the spectral one
    squarings = torch.ceil(torch.log2(norm.clamp_min(1e-30) * 2)).clamp(0, MAX_SQUARINGS)  # [...] so |S / 2^s| <= 1/2
    scaled = skew / torch.exp2(squarings)[..., None, None]
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device).expand_as(skew)
    out, term = eye, eye
    for k in range(1, TAYLOR_ORDER + 1):
        term = term @ scaled / k
        out = out + term
    for step in range(MAX_SQUARINGS):
        out = torch.where((step < squarings)[..., None, None], out @ out, out)
    return out


def rotate_blocks(x: Tensor, rotation: Tensor) -> Tensor:
    """``x`` ``[B, H, N, D]`` with each block of ``b`` channels turned by its matrix of ``rotation``
    ``[1 or B, H or 1, N, D/b, b, b]``; channels past the last whole block (LieRE's) stay as they are."""
    m, b = rotation.shape[-3], rotation.shape[-1]
    rotation = rotation.to(x.dtype)
    blocks = x[..., : m * b].unflatten(-1, (m, b))  # [B, H, N, m, b]
    if not capturing(x) and rotation.shape[0] == 1:  # one table for the batch: the batch as the matmul's columns
        # [B, H, N, m, b], made contiguous: SDPA's CPU flash kernel takes only channels of stride 1 (else its
        # unfused fallback runs, twice as slow)
        turned = (rotation[0] @ blocks.permute(1, 2, 3, 4, 0)).permute(4, 0, 1, 2, 3).contiguous()
    else:
        turned = (rotation @ blocks[..., None])[..., 0]
    turned = turned.flatten(-2)
    if capturing(x) or m * b != x.shape[-1]:  # FX sees shapes as proxies: no test on them
        return torch.cat((turned, x[..., m * b:]), -1)
    return turned


def axis_turns(values: Tensor, gen: Tensor) -> Tensor:
    """``exp(v_c A)`` ``[L, H, n, m, b, b]`` for evenly spaced ``values`` ``[n]`` and generators ``gen`` ``[L, H, m,
    b, b]``: the first and the step exponentiated, the rest as the step's powers (one product each)."""
    turns = [expm(values[0] * gen)]
    if values.shape[0] > 1:
        step = expm((values[1] - values[0]) * gen)
        for _ in range(values.shape[0] - 1):
            turns.append(turns[-1] @ step)
    return torch.stack(turns, 2)


def check_block(name: str, block: int, head_dim: int) -> int:
    """``block`` if it cuts ``head_dim`` channels into whole blocks of at least 2; else a ``ValueError`` naming the
    sizes that would."""
    if block < 2 or head_dim % block:
        fits = [d for d in range(2, head_dim + 1) if head_dim % d == 0]
        raise ValueError(f"{name}={block} must divide the head width {head_dim} (and be at least 2): pick one of "
                         f"{fits}.")
    return block


@register_notrace_module
class BlockRotation(PositionEncoding):
    """What ComRoPE and LieRE share: the rotation tables of each block from the kind's ``generators()`` and the
    positions its ``place`` gives. Resolution policies: ``extrapolate`` and ``interpolate`` (what each means is the
    kind's ``place``); ``ntk``, ``yarn`` and ``normalized`` rescale RoPE frequencies, which these kinds do not have.

    Args:
        depth: blocks of the model.
        train_grid: the ``(h, w)`` training grid, which the policies scale against.
        policy: ``extrapolate`` (default) or ``interpolate``.
        prefix_position: the position of every prefix token (class, registers) in the kind's units, or ``None`` for
            the identity (prefix tokens not rotated).
    """

    CACHE_SIZE = 2

    def __init__(self, depth: int, train_grid: tuple[int, int], policy: str | dict | ResolutionPolicy | None,
                 prefix_position: float | None) -> None:
        super().__init__()
        self.depth, self.train_grid = depth, (int(train_grid[0]), int(train_grid[1]))
        self.prefix_position = prefix_position
        self.policy = policy
        self._cache = GridTables(self.CACHE_SIZE)

    def generators(self) -> Tensor:
        """The skew-symmetric generators ``[L, H, 2, D/b, b, b]`` (``L``: 1, shared by every block, or one per block),
        along the axes (x, y) of the positions ``place`` gives."""
        raise NotImplementedError

    def tables(self, positions: Tensor, num_prefix_tokens: int, grid: tuple[int, int] | None = None) -> Tensor:
        """``R`` ``[L, 1 or B, H, P + N, D/b, b, b]`` for positions ``[N, 2]`` or ``[B, N, 2]`` (x, y); ``grid`` the
        ``(h, w)`` of an image batch, whose positions are its cells in row-major order."""
        gens = self.generators().float()  # [L, H, 2, m, b, b]
        pos = positions.float() if positions.dim() == 3 else positions.float()[None]  # [1 or B, N, 2]
        if grid is not None and self.commuting and pos.shape[0] == 1:
            rotation = self.grid_tables(pos[0], gens, grid)
        else:
            rotation = expm(torch.einsum("bna,lhamij->lbhnmij", pos, gens))  # [L, 1 or B, H, N, m, b, b]
        if not num_prefix_tokens:
            return rotation
        if self.prefix_position is None:  # exactly the identity, whatever the rounding
            prefix = torch.eye(gens.shape[-1], device=gens.device).expand(*gens.shape[:2], num_prefix_tokens,
                                                                           *gens.shape[3:])  # [L, H, P, m, b, b]
        else:
            prefix = expm(gens.sum(2) * self.prefix_position)[:, :, None].expand(-1, -1, num_prefix_tokens,
                                                                                   -1, -1, -1)
        prefix = prefix[:, None].expand(-1, rotation.shape[1], -1, -1, -1, -1, -1)
        return torch.cat((prefix.to(rotation.dtype), rotation), 3)

    @staticmethod
    def grid_tables(pos: Tensor, gens: Tensor, grid: tuple[int, int]) -> Tensor:
        """``R`` ``[L, 1, H, N, m, b, b]`` of a grid's positions ``[N, 2]`` when the generators commute:
        ``exp(x A_x + y A_y) = exp(y A_y) exp(x A_x)``, and along an axis the positions are evenly spaced, ``x_c = x_0
        + c d``, so ``exp(x_c A) = exp(x_0 A) exp(d A)^c``: two exponentials per axis and a product per column, row
        and cell, instead of an exponential (and its costlier backward) per cell."""
        h, w = grid
        cells = pos.view(h, w, 2)
        turn_x = axis_turns(cells[0, :, 0], gens[:, :, 0])  # [L, H, w, m, b, b]
        turn_y = axis_turns(cells[:, 0, 1], gens[:, :, 1])  # [L, H, h, m, b, b]
        return (turn_y[:, :, :, None] @ turn_x[:, :, None]).flatten(2, 3)[:, None]

    @property
    def commuting(self) -> bool:
        """Whether the kind's ``A_x`` and ``A_y`` commute by construction (ComRoPE), which ``grid_tables`` needs (with
        a ``place`` that spaces a grid's columns and rows evenly, as every policy of these kinds does)."""
        return False

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> Tensor:
        """Every block's tables (``tables``); an image batch's in evaluation kept per grid until the generators,
        the policy or the device change."""
        grid = positions.grid
        if grid is None or positions.coords.dim() != 2:
            return self.tables(positions.coords, num_prefix_tokens)
        key = self.cache_key(positions, num_prefix_tokens)
        if key is None:
            # an export keeps the grid's size dynamic, which the per-axis tables would fix (a view to h x w)
            exporting = torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.jit.is_scripting()
            return self.tables(positions.coords, num_prefix_tokens, None if exporting else (int(grid[0]), int(grid[1])))
        return self._cache.get(key, lambda: self.tables(positions.coords, num_prefix_tokens, key[:2]))

    def cache_key(self, positions: Positions, num_prefix_tokens: int) -> tuple | None:
        """What an image batch's tables in eager evaluation depend on (grid, prefix count, device, policy, the
        parameters' versions); ``None`` where they are not kept: NaFlex batches, autograd, graph captures."""
        grid = positions.grid
        if (grid is None or positions.coords.dim() != 2 or torch.is_grad_enabled() or capturing()
                or torch.jit.is_scripting()):
            return None
        params = tuple(x for p in self.parameters() for x in (p._version, p.data_ptr()))
        return (int(grid[0]), int(grid[1]), num_prefix_tokens, str(positions.coords.device), self.policy_name, params)

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[dict[str, Any]]:
        tables = self(positions, num_prefix_tokens)  # [L, 1 or B, H, P + N, m, b, b]
        if not self.per_layer:
            return [{"rotation": tables[0]}] * self.depth  # one tensor for every block: one gradient to sum into
        if isinstance(tables, torch.fx.Proxy):  # FX records the tables as one call: indexable, not unpackable
            return [{"rotation": tables[i]} for i in range(self.depth)]
        # unbound, not indexed: each index's backward would fill a zero gradient of all L layers' tables
        return [{"rotation": table} for table in tables.unbind(0)]

    @property
    def per_layer(self) -> bool:
        """Whether each block has its own generators."""
        return False

    def train(self, mode: bool = True) -> BlockRotation:
        """Also drop the kept tables when training starts: the generators move at every step."""
        if mode:
            self._cache.clear()
        return super().train(mode)


def unit_positions(coord: Tensor, grids: Tensor, train_grid: tuple[int, int], kind: str, policy: str) -> Tensor:
    """Positions ``[..., N, 2]`` (x, y) of the patches at ``coord`` ``[..., N, 2]`` (y, x) of the grids ``grids``
    ``[1 or B, 2]`` (h, w), in units of a grid, as ComRoPE (``(i + 0.5) / n``) or LieRE (``i / (m - 1)``, times
    ``m / n`` under ``extrapolate``) places them; ``n`` the training grid, or under ``interpolate`` (ComRoPE) the
    input's. One function for an image's grid and a NaFlex batch's, so that a sample's positions equal those of its
    image alone to the bit."""
    xy = coord.flip(-1).float()
    size = grids.flip(-1).float()  # [1 or B, 2] (w, h)
    train = torch.tensor([float(train_grid[1]), float(train_grid[0])], device=size.device)
    if kind == "liere":
        offset, scale = 0.0, (size - 1).clamp_min(1) * (1.0 if policy == "interpolate" else train / size)
    else:
        offset, scale = 0.5, size if policy == "interpolate" else train.expand_as(size)
    return (xy + offset) / (scale[0] if coord.dim() == 2 else scale[:, None, :])
