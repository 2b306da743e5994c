"""vit_rope.layers.rms_norm: timm's RmsNorm with a three-pass inference path, which must equal timm's everywhere."""

import pytest
import torch
from timm.layers import RmsNorm as TimmRmsNorm

from vit_rope.layers.rms_norm import RmsNorm


def pair(channels: int = 64, **kwargs) -> tuple[RmsNorm, TimmRmsNorm]:
    torch.manual_seed(0)
    theirs = TimmRmsNorm(channels, **kwargs)
    ours = RmsNorm(channels, **kwargs)
    if theirs.weight is not None:
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
    ours.load_state_dict(theirs.state_dict())  # same parameter and key
    return ours, theirs


@pytest.mark.parametrize("layout", ["tokens", "heads-of-a-qkv-view"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_inference_path_equals_timm(layout, dtype, affine):
    ours, theirs = pair(64, eps=1e-6, affine=affine)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = torch.randn(2, 50, 3 * 4 * 64, dtype=dtype) * 3
    x = x[..., :64] if layout == "tokens" else x[..., 256:512].unflatten(-1, (4, 64)).transpose(1, 2)
    with torch.no_grad():
        assert ours.inference_path(x)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)


def test_training_and_other_dtypes_take_timms_path_with_timms_gradients():
    ours, theirs = pair(32)
    x = torch.randn(3, 5, 32, requires_grad=True)
    assert not ours.inference_path(x)
    with torch.no_grad():
        assert not ours.inference_path(x.bfloat16())
    grads = []
    for norm in (ours, theirs):
        x.grad = None
        norm(x).pow(3).sum().backward()
        grads.append((x.grad.clone(), norm.weight.grad.clone()))
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def test_fx_traces_timms_path_even_without_autograd():
    ours, _ = pair(16)
    with torch.no_grad():
        traced = torch.fx.symbolic_trace(ours)  # proxies have no data: the three passes are not recorded
        assert "vector_norm" not in traced.code
        x = torch.randn(4, 16)
        torch.testing.assert_close(traced(x), ours(x), atol=1e-6, rtol=1e-6)
