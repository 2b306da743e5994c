"""Rotations ``R(p) = exp(p_x A_x + p_y A_y)`` from learned skew-symmetric generators, acting on blocks of ``b``
channels instead of RoPE's 2x2 pairs: what ComRoPE (Yu et al., CVPR 2025, arXiv:2506.03737) and LieRE (Ostmeier et al.,
ICML 2025, arXiv:2406.10322) share."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import register_notrace_module
from torch import Tensor, nn

from vit_rope.encodings.base import BlockInput, GridTables, PositionEncoding, Positions
from vit_rope.encodings.policies import POSITION_POLICIES, ResolutionPolicy

MAX_SQUARINGS = 16  # norms up to 2**15: far past any position range times generator a model meets
# exponentials per chunk of tokens without autograd: a large grid's intermediates stay O(chunk), its tables their size
TABLE_CHUNK = 2**13


def expm(skew: Tensor, captured: bool = False) -> Tensor:
    """``exp(S)``: ``matrix_exp`` without autograd, else ``expm_by_squaring``, which ONNX exports and trains faster."""
    dtype = skew.dtype
    skew = skew if dtype in (torch.float32, torch.float64) else skew.float()
    if captured or (skew.requires_grad and torch.is_grad_enabled() and not skew.is_meta):  # meta: no norms to read
        return expm_by_squaring(skew, captured).to(dtype)
    return torch.linalg.matrix_exp(skew.contiguous()).to(dtype)  # contiguous: it views its input


def expm_by_squaring(skew: Tensor, captured: bool = False) -> Tensor:
    """``exp(S)``: scaled by ``2^s`` to a norm <= 1/2, a Taylor polynomial below the dtype's rounding and ``s``
    squarings, each taking only the matrices that still need it; under a capture all are squared ``MAX_SQUARINGS``
    times, masked past their ``s``: one graph for every position range."""
    flat = skew.reshape(-1, *skew.shape[-2:])  # [n, b, b]
    norm = flat.detach().abs().sum(-1).amax(-1)  # the infinity norm bounds the spectral one
    count = torch.ceil(torch.log2(norm.clamp_min(1e-30) * 2)).clamp(0, MAX_SQUARINGS)  # [n]: s of each matrix
    if not captured:
        count, perm = torch.sort(count)
        flat = flat[perm]
    scaled = flat / torch.exp2(count)[:, None, None]
    order = 8 if skew.dtype == torch.float32 else 14  # remainder 0.5^9 / 9! ~ 5e-9, 0.5^15 / 15! ~ 2e-17
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device)
    power = torch.add(eye, scaled, alpha=1 / order)
    for k in range(order - 1, 0, -1):
        power = torch.baddbmm(eye, scaled, power, alpha=1 / k)  # I + X p / k
    if captured:
        for step in range(MAX_SQUARINGS):
            power = torch.where((step < count)[:, None, None], power @ power, power)
        return power.view(skew.shape)
    done = []
    for size in torch.bincount(count.long()).tolist()[:-1]:  # matrices squared 0, 1, ... times
        finished, power = power.split((size, power.shape[0] - size))
        done.append(finished)
        power = power @ power
    power = torch.cat((*done, power))
    return torch.empty_like(power).index_copy(0, perm, power).view(skew.shape)


def rotate_blocks(x: Tensor, rotation: Tensor) -> Tensor:
    """``x`` ``[B, H, N, D]`` with each block of channels turned by its matrix of ``rotation``: the reference."""
    blocks = x.unflatten(-1, (-1, rotation.shape[-1]))  # [B, H, N, m, b]
    return (rotation.to(x.dtype) @ blocks[..., None])[..., 0].flatten(-2)


def rotate_qk(q: Tensor, k: Tensor, rotation: Tensor) -> tuple[Tensor, Tensor]:
    """``rotate_blocks`` of q and k by a table shared by the batch: one matmul ``x^T R^T`` with the samples as rows,
    whose copies move whole blocks of channels (``R x`` would move single channels)."""
    B, H, N, D = q.shape
    m, b = rotation.shape[-3], rotation.shape[-1]
    rows = torch.stack((q, k)).permute(2, 3, 0, 1, 4).reshape(H, N, 2 * B, m, b).transpose(2, 3)  # [H, N, m, 2B, b]
    # squeeze and unbind, not [0]: an index's backward writes each gradient into zeros of the whole
    turned = rows @ rotation.squeeze(0).transpose(-1, -2).to(q.dtype)  # [H, N, m, 2B, b]
    return turned.view(H, N, m, 2, B, b).permute(3, 4, 0, 1, 2, 5).reshape(2, B, H, N, D).unbind(0)


def check_block(name: str, block: int, head_dim: int) -> int:
    if block < 2 or head_dim % block:
        fits = [d for d in range(2, head_dim + 1) if head_dim % d == 0]
        raise ValueError(f"{name}={block} must divide the head width {head_dim} (and be at least 2): pick one of "
                         f"{fits}.")
    return block


class Rotations(BlockInput):
    """A block's rotations of q and k, after attention's projection and q/k norms."""

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(attn, x)  # [B, nh, N, D] each
        return (*self.rotate(q, k), v)


class BlockRotations(Rotations):
    """One ``b x b`` matrix per token and channel block, ``[1 or B, H or 1, N, D/b, b, b]``."""

    def __init__(self, rotation: Tensor, batched: bool) -> None:
        self.rotation, self.batched = rotation, batched

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.batched:
            return rotate_qk(q, k, self.rotation)
        return rotate_blocks(q, self.rotation), rotate_blocks(k, self.rotation)


@register_notrace_module
class BlockRotation(PositionEncoding):
    """Each block's rotation tables from the kind's ``generators()`` at its ``place``'s positions."""

    CACHE_SIZE = 2
    policies = POSITION_POLICIES
    what = "{kind}, whose rotations come from learned generators"
    uses = {"extrapolate": "positions at the training step",
            "interpolate": "positions scaled to the training extent; docs/models.md has both"}

    def __init__(self, kind: str, depth: int, train_grid: tuple[int, int], policy: str | dict | ResolutionPolicy | None,
                 prefix_position: float | None, per_layer: bool) -> None:
        super().__init__(kind, depth, train_grid, policy)
        self.prefix_position, self.per_layer = prefix_position, per_layer  # per_layer: generators per block
        self._cache = GridTables(self.CACHE_SIZE)

    def generators(self) -> Tensor:
        """The skew-symmetric generators ``[L, H, 2, D/b, b, b]`` (``L``: 1 or one per block) along (x, y)."""
        raise NotImplementedError

    def tables(self, coords: Tensor, num_prefix_tokens: int, captured: bool = False) -> Tensor:
        """``R`` ``[L, 1 or B, H, P + N, D/b, b, b]``: an exponential per token, without autograd a chunk at a time."""
        gens = self.generators().float()  # [L, H, 2, m, b, b]
        pos = coords.float() if coords.dim() == 3 else coords.float()[None]  # [1 or B, N, 2]

        def turn(pos: Tensor) -> Tensor:  # [1 or B, n, 2] -> [L, 1 or B, H, n, m, b, b]
            return expm(torch.einsum("bna,lhamij->lbhnmij", pos, gens), captured)

        prefix = self.prefix_tables(gens, num_prefix_tokens, captured)[:, None]  # [L, 1, H, P, m, b, b]
        if torch.is_grad_enabled() or captured:
            rotation = turn(pos)
            if not num_prefix_tokens:
                return rotation
            return torch.cat((prefix.expand(-1, rotation.shape[1], -1, -1, -1, -1, -1), rotation), 3)
        (L, H, _, m, b, _), P = gens.shape, num_prefix_tokens
        out = gens.new_empty(L, pos.shape[0], H, P + pos.shape[1], m, b, b)
        out[:, :, :, :P] = prefix
        chunk = max(1, TABLE_CHUNK // (L * pos.shape[0] * H * m))
        for start in range(0, pos.shape[1], chunk):
            out[:, :, :, P + start: P + start + chunk] = turn(pos[:, start: start + chunk])
        return out

    def prefix_tables(self, gens: Tensor, num_prefix_tokens: int, captured: bool = False) -> Tensor:
        """The prefix tokens' ``R`` ``[L, H, P, m, b, b]``: at ``prefix_position`` on both axes, or the identity."""
        if self.prefix_position is None or not num_prefix_tokens:
            eye = torch.eye(gens.shape[-1], dtype=gens.dtype, device=gens.device)
            turn = eye.expand(*gens.shape[:2], *gens.shape[3:])
        else:
            turn = expm(gens.sum(2) * self.prefix_position, captured)
        return turn[:, :, None].expand(-1, -1, num_prefix_tokens, -1, -1, -1)

    def cache_key(self, positions: Positions, num_prefix_tokens: int) -> tuple | None:
        """What an image batch's tables in eager evaluation depend on; ``None`` where they are not kept."""
        if not positions.image_batch or torch.is_grad_enabled():
            return None
        params = tuple(x for p in self.parameters() for x in (p._version, p.data_ptr()))
        h, w = positions.grid
        return (int(h), int(w), num_prefix_tokens, str(positions.coords.device), self.policy_name, params)

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> Tensor:
        return self._cache.get(self.cache_key(positions, num_prefix_tokens),
                               lambda: self.tables(positions.coords, num_prefix_tokens, positions.captured))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        tables = self(positions, num_prefix_tokens)  # [L, 1 or B, H, P + N, m, b, b]
        batched = not positions.captured and positions.coords.dim() == 2
        if not self.per_layer:
            return [BlockRotations(tables.squeeze(0), batched)] * self.depth
        # a graph records the tables as one value: indexable, not unpackable; in eager, unbound, not indexed (each
        # index's backward would fill a zero gradient of all L layers' tables)
        layers = [tables[i] for i in range(self.depth)] if positions.captured else tables.unbind(0)
        return [BlockRotations(table, batched) for table in layers]

    def clear_(self) -> None:
        self._cache.clear()

    def train(self, mode: bool = True) -> BlockRotation:
        if mode:
            self.clear_()
        return super().train(mode)
