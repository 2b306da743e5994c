"""Attention with a bias per offset (``vit_rope.encodings.bias.offset_attention``): the chunked CPU path and
FlexAttention give the dense bias's outputs and gradients (the table's too) at several grids, prefix counts and
chunkings; the bias kinds' models take it on image batches without building the dense matrix, with the dense path's
logits and gradients, and graph captures get the dense bias without caching it."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from vit_rope.encodings.base import BlockInput, image_positions
from vit_rope.encodings.bias import offset_attention as oa
from vit_rope.encodings.bias.offset_attention import _chunks, dense_bias, offset_attention

CASES = [((3, 4), 1, 2), ((5, 5), 0, 1), ((7, 3), 4, 2), ((1, 6), 2, 1)]  # grid, prefix tokens, batch


def inputs(grid: tuple[int, int], prefix: int, batch: int, heads: int = 3, dim: int = 8) -> list[torch.Tensor]:
    torch.manual_seed(sum(grid) + prefix)
    n = prefix + grid[0] * grid[1]
    qkv = [torch.randn(batch, heads, n, dim, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    table = torch.randn(heads, 2 * grid[0] - 1, 2 * grid[1] - 1, dtype=torch.float64, requires_grad=True)
    return [*qkv, table]


@pytest.mark.parametrize("rows_per_chunk", [None, 1, 2])
@pytest.mark.parametrize("grid,prefix,batch", CASES)
def test_chunked_attention_equals_the_dense_bias_with_gradients(monkeypatch, grid, prefix, batch,
                                                                rows_per_chunk) -> None:
    q, k, v, table = inputs(grid, prefix, batch)
    if rows_per_chunk:  # several chunks of whole rows
        for name in ("CHUNK_ELEMENTS", "SCORE_ELEMENTS"):
            monkeypatch.setattr(oa, name, rows_per_chunk * grid[1] * k.shape[2] * batch * 3)
        monkeypatch.setattr(oa, "FLASH_QUERIES", 1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias(table, grid, prefix)[None], scale=0.3)
    for grad in (False, True):  # inference's chunks, then the autograd Function's
        with torch.set_grad_enabled(grad):
            out = offset_attention(q, k, v, table, grid, prefix, 0.3)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, table), grad)
    want = torch.autograd.grad(expected, (q, k, v, table), grad)
    for name, a, b in zip("q k v table".split(), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def test_a_fixed_table_gets_no_gradient_and_masked_keys_stay_masked() -> None:
    q, k, v, table = inputs((4, 4), 1, 2)
    table = table.detach().masked_fill(torch.rand(table.shape) > 0.5, float("-inf"))
    table[:, 3, 3] = 0.0  # every query still sees itself
    out = offset_attention(q, k, v, table, (4, 4), 1, 0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias(table, (4, 4), 1)[None], scale=0.3)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for a, b in zip(grads, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("prefix", [0, 2])
@pytest.mark.parametrize("row_queries", [1, 11, 192])  # 1, 3 (the last entry padded) or all 4 grid rows an entry
def test_inference_without_masks_equals_the_dense_bias_where_queries_see_only_prefix_keys(monkeypatch, prefix,
                                                                                         row_queries) -> None:
    """Above one chunk's mask, inference reads the table in place (groups of query rows as a batch): the dense bias's
    outputs, also for queries that see no patch (bias -inf at every offset above them) but the prefix tokens."""
    monkeypatch.setattr(oa, "CHUNK_ELEMENTS", 100)
    monkeypatch.setattr(oa, "ROW_QUERIES", row_queries)
    q, k, v, table = (t.detach() for t in inputs((4, 5), prefix, 2))
    table[0, :4] = float("-inf")  # head 0: the bottom row's queries see no patch
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias(table, (4, 5), prefix)[None], scale=0.3)
    if not prefix:  # queries that see nothing: SDPA's CPU kernels give 0, the dense matrix NaN
        expected = expected.nan_to_num(0.0)
    torch.testing.assert_close(offset_attention(q, k, v, table, (4, 5), prefix, 0.3), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager: the reference on CPU
@pytest.mark.parametrize("grid,prefix,batch", CASES[1:3])
def test_flex_attention_reads_the_table_in_its_score_mod(grid, prefix, batch) -> None:
    q, k, v, table = (t.detach() for t in inputs(grid, prefix, batch))  # FlexAttention has no CPU backward
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias(table, grid, prefix)[None], scale=0.3)
    torch.testing.assert_close(offset_attention(q, k, v, table, grid, prefix, 0.3, flex=True), expected)


@pytest.mark.parametrize("grid,prefix,width,least", [
    ((84, 84), 1, 6 * 7057, 768), ((128, 128), 5, 6 * 16389, 768), ((56, 56), 1, 4 * 6 * 3137, 1), ((3, 2), 0, 1, 1),
    ((3, 3), 0, 2**30, 1)])
def test_chunks_are_whole_rows_that_cover_every_query_once_within_the_budget(grid, prefix, width, least) -> None:
    chunks = _chunks(grid, prefix, width, least)
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(prefix + grid[0] * grid[1]))
    sizes = [stop - start for start, stop in chunks[1 if prefix else 0:]]
    assert all(size % grid[1] == 0 for size in sizes)
    assert max(sizes) >= min(least, grid[0] * grid[1])  # SDPA's fast query blocks where the grid has them
    assert max(sizes) * width <= max(oa.CHUNK_ELEMENTS, -(-least // grid[1]) * grid[1] * width)


MODELS = {"lookhere": {"encoding_options": {"config": "lh90"}, "reg_tokens": 2}, "alibi": {}, "fire": {"reg_tokens": 1}}


@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_models_take_the_offset_path_with_the_dense_logits_and_gradients(monkeypatch, kind, policy) -> None:
    """Image batches at several sizes (two chunks of rows at the largest) give the dense path's logits and gradients
    to 1e-5 relative, and the offset path never builds the dense bias; a capture's positions get dense ones, kept
    nowhere."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", img_size=64, depth=2, num_classes=5,
                              dynamic_img_size=True, **MODELS[kind])
    model.set_resolution_policy(policy)
    monkeypatch.setattr(oa, "CHUNK_ELEMENTS", 3 * 200 * 6)  # a 6 x 8 grid's queries in chunks
    monkeypatch.setattr(oa, "FLASH_QUERIES", 1)
    for shape in [(64, 64), (48, 80), (96, 128)]:
        x = torch.randn(2, 3, *shape)
        results = []
        for fused in (True, False):
            for blk in model.blocks:
                blk.attn.fused_attn = fused
            with monkeypatch.context() as m:
                if fused:  # the offset path: the dense bias is never built
                    m.setattr(oa, "dense_bias", lambda *a: pytest.fail("dense bias built"))
                logits = model(x)
            grads = torch.autograd.grad(logits.square().sum(), [p for p in model.parameters() if p.requires_grad])
            results.append((logits, grads))
        (a, ga), (b, gb) = results
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for x_grad, y_grad in zip(ga, gb, strict=True):
            torch.testing.assert_close(x_grad, y_grad, rtol=1e-5, atol=1e-5 * y_grad.abs().max().item() + 1e-8)
    encoding, cached = model.pos_encoding, len(getattr(model.pos_encoding, "_cache", ()))
    inputs = encoding.block_inputs(image_positions(encoding, 3, 5)._replace(captured=True), model.num_prefix_tokens)
    assert all(type(i) is BlockInput and i.bias is not None for i in inputs)  # a capture's: dense biases
    assert len(getattr(encoding, "_cache", ())) == cached
