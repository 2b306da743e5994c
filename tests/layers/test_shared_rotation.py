"""One rotation table shared by every block (vit_rope.layers.shared_rotation): the gradient taken once for all blocks
equals autograd's sum of one per block, whatever else uses the table, under gradient checkpointing and for a second
backward of the same graph."""

from __future__ import annotations

import pytest
import timm
import torch

from vit_rope.encodings.generators import block_rotation as lie_rotation
from vit_rope.encodings.generators.block_rotation import rotate_qk
from vit_rope.layers.shared_rotation import share, shared_node


def tables(heads: int) -> torch.Tensor:
    torch.manual_seed(0)
    skew = torch.randn(1, heads, 5, 2, 4, 4, dtype=torch.float64)
    return torch.linalg.matrix_exp(skew - skew.mT).requires_grad_()  # [1, H or 1, N, D/b, b, b]


def blocks_loss(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, depth: int = 3) -> torch.Tensor:
    """What a model does with one table: every block turns its own q and k by it, and the next block's input
    depends on the last's output."""
    loss = 0
    for layer in range(depth):
        q, k = rotate_qk(q * (layer + 1), k - layer, table)
        loss = loss + (q * k.flip(-2)).sum()
    return loss


@pytest.mark.parametrize("heads", [3, 1])  # a table per head, or one for all heads
def test_the_gradient_taken_once_equals_one_per_block(heads: int):
    torch.manual_seed(1)
    q, k = (torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    table = tables(heads)
    shared = share(table)
    assert shared_node(shared) is not None and shared_node(table) is None
    expected = torch.autograd.grad(blocks_loss(q, k, table), (q, k, table))
    got = torch.autograd.grad(blocks_loss(q, k, shared), (q, k, table))
    for one, other in zip(got, expected, strict=True):
        torch.testing.assert_close(one, other, rtol=1e-12, atol=1e-12)


def test_other_uses_of_the_table_add_their_gradient_and_a_second_backward_gives_the_same():
    torch.manual_seed(2)
    q, k = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(2))
    table = tables(3)

    def loss(t: torch.Tensor) -> torch.Tensor:
        return blocks_loss(q, k, t, depth=2) + (t * t.detach().flip(2)).sum()  # and a use outside rotate_qk

    expected = torch.autograd.grad(loss(table), table)[0]
    total = loss(share(table))
    total.backward(retain_graph=True)
    torch.testing.assert_close(table.grad, expected, rtol=1e-12, atol=1e-12)
    total.backward()  # the same graph again: each backward joins its own rows
    torch.testing.assert_close(table.grad, 2 * expected, rtol=1e-12, atol=1e-12)


def test_a_table_autograd_does_not_record_is_left_as_it_is():
    table = tables(3)
    with torch.no_grad():
        assert share(table) is table
    frozen = table.detach()
    assert share(frozen) is frozen


def test_liere_model_gradients_equal_per_block_ones_with_and_without_checkpointing(monkeypatch):
    """A LieRE ViT (one set of generators for every block) trained through the shared table: the same gradients as
    autograd's per-block ones, with timm's gradient checkpointing (which recomputes each block) too."""
    torch.manual_seed(3)
    model = timm.create_model("vit_rope_tiny_patch16_liere_224", img_size=48, depth=3, num_classes=4).double()
    with torch.no_grad():  # generators and weights away from their initial symmetry
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    x = torch.randn(2, 3, 48, 48, dtype=torch.float64)

    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.set_grad_checkpointing(checkpointing)
        model(x).square().sum().backward()
        return {name: param.grad.clone() for name, param in model.named_parameters()}

    shared, checkpointed = gradients(False), gradients(True)
    monkeypatch.setattr(lie_rotation, "share", lambda table: table)  # autograd's gradient per block
    expected = gradients(False)
    assert expected["pos_encoding.generator_raw_params"].abs().max() > 0
    for name, grad in expected.items():  # the tables are fp32 in any model: their sum over blocks rounds as fp32
        fp32 = dict(rtol=1e-5, atol=1e-6 * float(grad.abs().max()))
        tol = fp32 if name.startswith("pos_encoding") else dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(shared[name], grad, **tol, msg=name)
        torch.testing.assert_close(checkpointed[name], grad, **tol, msg=name)
