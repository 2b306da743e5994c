"""Rotations ``R(p) = exp(sum_i p_i A_i)`` from learned skew-symmetric generators, acting on blocks of channels.

ComRoPE (``vit_rope.encodings.generators.comrope``) and LieRE (``vit_rope.encodings.generators.liere``) both rotate each
query and key by such an ``R`` instead of RoPE's 2x2 pairs: the head's ``D`` channels are cut into ``D / b`` contiguous
blocks of ``b``, and each block gets its own ``b x b`` orthogonal matrix per token (and per head, per layer where the
kind learns them). What differs between them is how the generators ``A_x, A_y`` are parametrised (commuting or not) and
where a patch sits; this module holds what they share:

- ``rotate_blocks``: ``R`` applied to q or k ``[B, H, N, D]``, a matrix-vector product per token (per-sample tables:
  NaFlex; graph captures); ``rotate_qk`` turns q and k of an image batch by the batch's one table in one batched
  matmul, every sample of both as its rows (``[H, N, m, 2B, b] @ [H, N, m, b, b]``), output in the layout SDPA's CPU
  flash kernel takes (channels of stride 1; else its unfused fallback runs).
- ``BlockRotations``: what a block's attention gets (``BlockInput``), ``rotate_qk``'s tables; where the generators
  commute (ComRoPE), an image batch's blocks get ``vit_rope.encodings.generators.axis_rotation.AxisRotations`` instead.
- ``BlockRotation``: the ``PositionEncoding`` of both kinds: tables ``[1 or B, H, P + N, D/b, b, b]`` per block
  (prefix tokens at a kind's own position, or the identity), or per axis (``axis_tables``), built once per forward
  and, for an image batch in evaluation, kept per grid until the generators change.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import register_notrace_module
from torch import Tensor, nn

from vit_rope.encodings.base import BlockInput, GridTables, PositionEncoding, Positions
from vit_rope.encodings.generators.axis_rotation import AxisRotations, axis_turns
from vit_rope.encodings.policies import POSITION_POLICIES, ResolutionPolicy
from vit_rope.layers.capture import capturing
from vit_rope.layers.expm import expm
from vit_rope.layers.shared_rotation import rotate_shared, share, shared_node

# exponentials per chunk of tokens where nothing is saved for backward: the series' terms and squares (``s + 2``
# matrices per exponential) stay O(chunk), so a high-resolution grid's tables cost their own size
TABLE_CHUNK = 2**13


def rotate_blocks(x: Tensor, rotation: Tensor) -> Tensor:
    """``x`` ``[B, H, N, D]`` with each block of ``b`` channels turned by its matrix of ``rotation``
    ``[1 or B, H or 1, N, D/b, b, b]``; channels past the last whole block (LieRE's) stay as they are."""
    m, b = rotation.shape[-3], rotation.shape[-1]
    rotation = rotation.to(x.dtype)
    blocks = x[..., : m * b].unflatten(-1, (m, b))  # [B, H, N, m, b]
    turned = (rotation @ blocks[..., None])[..., 0].flatten(-2)
    if capturing(x) or m * b != x.shape[-1]:  # FX sees shapes as proxies: no test on them
        return torch.cat((turned, x[..., m * b:]), -1)
    return turned


def rotate_qk(q: Tensor, k: Tensor, rotation: Tensor) -> tuple[Tensor, Tensor]:
    """``rotate_blocks`` of q and k ``[B, H, N, D]`` by one table: for a table shared by the batch that covers every
    channel, one matmul ``x^T R^T`` with q's and k's samples together as its rows, whose copies in and out move whole
    blocks of ``b`` channels (``R x`` with the samples as columns would move single channels)."""
    B, H, N, D = q.shape
    m, b = rotation.shape[-3], rotation.shape[-1]
    if capturing(q) or rotation.shape[0] != 1 or q.shape != k.shape or m * b != D:
        return rotate_blocks(q, rotation), rotate_blocks(k, rotation)
    node = shared_node(rotation)
    if node is not None:  # training, one table for every block
        return rotate_shared(q, k, rotation, node)
    rows = torch.stack((q, k)).permute(2, 3, 0, 1, 4).reshape(H, N, 2 * B, m, b).transpose(2, 3)  # [H, N, m, 2B, b]
    # squeeze and unbind, not [0]: an index's backward writes each gradient into zeros of the whole
    turned = rows @ rotation.squeeze(0).transpose(-1, -2).to(q.dtype)  # [H, N, m, 2B, b]
    q, k = turned.view(H, N, m, 2, B, b).permute(3, 4, 0, 1, 2, 5).reshape(2, B, H, N, D).unbind(0)  # flash layout
    return q, k


def check_block(name: str, block: int, head_dim: int) -> int:
    """``block`` if it cuts ``head_dim`` channels into whole blocks of at least 2; else a ``ValueError`` naming the
    sizes that would."""
    if block < 2 or head_dim % block:
        fits = [d for d in range(2, head_dim + 1) if head_dim % d == 0]
        raise ValueError(f"{name}={block} must divide the head width {head_dim} (and be at least 2): pick one of "
                         f"{fits}.")
    return block


class BlockRotations(BlockInput):
    """A block's rotations of q and k, one ``b x b`` matrix per token and channel block: ``rotation`` ``[1 or B, nh or
    1, N, D/b, b, b]`` (``rotate_qk``)."""

    def __init__(self, rotation: Tensor) -> None:
        self.rotation = rotation

    def transform(self, attn: nn.Module, x: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k = rotate_qk(q, k, self.rotation)
        return q, k, v


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
    policies = POSITION_POLICIES

    def __init__(self, depth: int, train_grid: tuple[int, int], policy: str | dict | ResolutionPolicy | None,
                 prefix_position: float | None) -> None:
        super().__init__()
        self.depth, self.train_grid = depth, (int(train_grid[0]), int(train_grid[1]))
        self.prefix_position = prefix_position
        self.policy = policy
        self._cache = GridTables(self.CACHE_SIZE)

    def refusal(self, policy: str) -> str:
        return (f"Policy {policy!r} does not apply to {self.kind}: ntk, yarn and normalized rescale RoPE frequencies, "
                "and its rotations come from learned generators instead. Use 'extrapolate' (positions at the training "
                "step) or 'interpolate' (positions scaled to the training extent); docs/models.md says what each "
                "means for it.")

    def generators(self) -> Tensor:
        """The skew-symmetric generators ``[L, H, 2, D/b, b, b]`` (``L``: 1, shared by every block, or one per block),
        along the axes (x, y) of the positions ``place`` gives."""
        raise NotImplementedError

    def tables(self, positions: Tensor, num_prefix_tokens: int) -> Tensor:
        """``R`` ``[L, 1 or B, H, P + N, D/b, b, b]`` for positions ``[N, 2]`` or ``[B, N, 2]`` (x, y): an exponential
        per token."""
        gens = self.generators().float()  # [L, H, 2, m, b, b]
        pos = positions.float() if positions.dim() == 3 else positions.float()[None]  # [1 or B, N, 2]

        def turn(pos: Tensor) -> Tensor:  # [1 or B, n, 2] -> [L, 1 or B, H, n, m, b, b]
            return expm(torch.einsum("bna,lhamij->lbhnmij", pos, gens))

        prefix = self.prefix_tables(gens, num_prefix_tokens)[:, None]  # [L, 1, H, P, m, b, b]
        if torch.is_grad_enabled() or capturing(positions):
            rotation = turn(pos)
            if not num_prefix_tokens:
                return rotation
            return torch.cat((prefix.expand(-1, rotation.shape[1], -1, -1, -1, -1, -1).to(rotation.dtype), rotation), 3)
        # without autograd, tokens a chunk at a time into the tables: a high-resolution grid's memory is theirs alone
        (L, H, _, m, b, _), P = gens.shape, num_prefix_tokens
        out = gens.new_empty(L, pos.shape[0], H, P + pos.shape[1], m, b, b)
        out[:, :, :, :P] = prefix
        chunk = max(1, TABLE_CHUNK // (L * pos.shape[0] * H * m))
        for start in range(0, pos.shape[1], chunk):
            out[:, :, :, P + start: P + start + chunk] = turn(pos[:, start: start + chunk])
        return out

    def prefix_tables(self, gens: Tensor, num_prefix_tokens: int) -> Tensor:
        """The prefix tokens' ``R`` ``[L, H, P, m, b, b]``: at the kind's ``prefix_position`` on both axes, or exactly
        the identity."""
        if self.prefix_position is None:  # exactly the identity, whatever the rounding
            eye = torch.eye(gens.shape[-1], device=gens.device)
            return eye.expand(*gens.shape[:2], num_prefix_tokens, *gens.shape[3:])
        return expm(gens.sum(2) * self.prefix_position)[:, :, None].expand(-1, -1, num_prefix_tokens, -1, -1, -1)

    def axis_tables(self, positions: Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> tuple[Tensor, ...]:
        """``rotate_axes``' tables of an image batch's positions ``[N, 2]`` (its ``(h, w)`` grid's cells in row-major
        order) when the generators commute: the prefix tokens' ``[L, H, P, m, b, b]``, the columns' ``[L, H, w, m_x,
        b, b]`` and the rows' ``[L, H, h, m_y, b, b]`` (the blocks ``axis_blocks`` names). Along an axis the
        positions are evenly spaced, ``x_c = x_0 + c d``, so ``exp(x_c A) = exp(x_0 A) exp(d A)^c``: two exponentials
        per axis instead of one (and its costlier backward) per cell."""
        gens = self.generators().float()  # [L, H, 2, m, b, b]
        h, w = grid
        cells = positions.float().view(h, w, 2)
        x_blocks, y_blocks = self.axis_blocks
        axes = (cells[0, :, 0], cells[:, 0, 1]), (gens[:, :, 0, x_blocks], gens[:, :, 1, y_blocks])
        if self.prefix_position is None or not num_prefix_tokens:  # the identity, or no prefix token
            return self.prefix_tables(gens, num_prefix_tokens), *axis_turns(*axes)
        turn_x, turn_y, prefix = axis_turns(*axes, gens.sum(2) * self.prefix_position)  # in the same exponential call
        return prefix[:, :, None].expand(-1, -1, num_prefix_tokens, -1, -1, -1), turn_x, turn_y

    @property
    def commuting(self) -> bool:
        """Whether the kind's ``A_x`` and ``A_y`` commute by construction (ComRoPE), which ``axis_tables`` needs (with
        a ``place`` that spaces a grid's columns and rows evenly, as every policy of these kinds does)."""
        return False

    @property
    def axis_blocks(self) -> tuple[slice, slice]:
        """The blocks that x and y turn, in one of ``rotate_axes``' layouts: every block by both axes by default."""
        return slice(None), slice(None)

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> Tensor:
        """Every block's tables per token (``tables``); an image batch's in evaluation kept per grid until the
        generators, the policy or the device change."""
        key = self.cache_key(positions, num_prefix_tokens)
        if key is None:
            return self.tables(positions.coords, num_prefix_tokens)
        return self._cache.get(key, lambda: self.tables(positions.coords, num_prefix_tokens))

    def cache_key(self, positions: Positions, num_prefix_tokens: int) -> tuple | None:
        """What an image batch's tables in eager evaluation depend on (grid, prefix count, device, policy, the
        parameters' versions); ``None`` where they are not kept: NaFlex batches, autograd, graph captures."""
        grid = positions.grid
        if (grid is None or capturing(positions.coords) or positions.coords.dim() != 2 or torch.is_grad_enabled()
                or torch.jit.is_scripting()):
            return None
        params = tuple(x for p in self.parameters() for x in (p._version, p.data_ptr()))
        return (int(grid[0]), int(grid[1]), num_prefix_tokens, str(positions.coords.device), self.policy_name, params)

    def by_axes(self, positions: Positions) -> bool:
        """Whether the blocks get their rotations per axis (``rotate_axes``): an image batch of a kind whose
        generators commute, outside exports (which keep the grid's size dynamic, and a view to ``h x w`` would fix
        it) and FX tracing (whose proxies have no grid)."""
        return (self.commuting and positions.grid is not None and not isinstance(positions.coords, torch.fx.Proxy)
                and positions.coords.dim() == 2 and not (torch.compiler.is_exporting() or torch.jit.is_tracing()
                                                         or torch.jit.is_scripting()))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        if self.by_axes(positions):
            grid = (int(positions.grid[0]), int(positions.grid[1]))

            def build() -> tuple[Tensor, ...]:
                return self.axis_tables(positions.coords, num_prefix_tokens, grid)

            key = self.cache_key(positions, num_prefix_tokens)
            turns = build() if key is None else self._cache.get((*key, "axes"), build)
            layers = list(zip(*(t.unbind(0) for t in turns), strict=True))  # one per block, or one for all
            return [AxisRotations(layer)
                    for layer in (layers * self.depth if len(layers) == 1 else layers)]
        tables = self(positions, num_prefix_tokens)  # [L, 1 or B, H, P + N, m, b, b]
        if not self.per_layer:  # one table: its gradient one product
            return [BlockRotations(share(tables.squeeze(0)))] * self.depth
        if isinstance(tables, torch.fx.Proxy):  # FX records the tables as one call: indexable, not unpackable
            return [BlockRotations(tables[i]) for i in range(self.depth)]
        # unbound, not indexed: each index's backward would fill a zero gradient of all L layers' tables
        return [BlockRotations(table) for table in tables.unbind(0)]

    @property
    def per_layer(self) -> bool:
        """Whether each block has its own generators."""
        return False

    def clear_(self) -> None:
        """Drop the kept tables: when training starts (the generators move at every step) and when blocks are
        pruned."""
        self._cache.clear()

    def train(self, mode: bool = True) -> BlockRotation:
        if mode:
            self.clear_()
        return super().train(mode)
