"""The models as graphs: FX feature extraction (torchvision's plain tracer and timm's), FX backward, timm's
``dynamic_img_pad``, a forward on the meta device, and TorchScript's one refusal. Every graph is held to the eager
model at two sizes, one of them non-square, and with LayerScale at 1 so that the logits are of order 1 (timm's 1e-5
would hide differences)."""

from collections.abc import Callable

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import vit_rope  # noqa: F401  (registers the models)
from helpers.models import assert_fx_features_match_eager
from vit_rope.encodings import KINDS

NAMES = ["vit_rope_tiny_patch16_axial_224", "vit_rope_tiny_patch16_mixed_224", "vit_rope_tiny_patch16_mixed_ape_224",
         "vit_rope_tiny_patch16_golden_224", "vit_rope_tiny_patch16_string_mixed_224"]
SIZES = [(64, 64), (48, 80)]


def model(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{"depth": 2, "num_classes": 5, "init_values": 1.0, **kwargs}).eval()


@pytest.mark.parametrize("name", [*NAMES, "vit_rope_tiny_patch16_lookhere_224", "vit_rope_small_patch16_dinov3",
                                  "swin_rope_mixed_tiny_patch4_window7_224"])
def test_torchscript_is_refused_with_one_error_naming_what_to_use(name):
    with pytest.raises(RuntimeError, match=r"does not support TorchScript.*torch\.export.*vit_rope\.export.*compile"):
        torch.jit.script(timm.create_model(name, depth=2) if "swin" not in name else timm.create_model(name))


@pytest.mark.parametrize("name", NAMES)
def test_torchvision_feature_extractor_without_tracer_options(name):
    eager = model(name)
    extractor = create_feature_extractor(eager, return_nodes={"blocks.0": "block0", "norm": "tokens", "head": "logits"})
    with torch.inference_mode():
        for height, width in SIZES:
            x = torch.randn(2, 3, height, width)
            out = extractor(x)
            torch.testing.assert_close(out["logits"], eager(x), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out["tokens"], eager.forward_features(x), atol=1e-5, rtol=1e-5)
            assert out["block0"].shape == (2, 1 + height // 16 * width // 16, 192)


def timm_traced(eager: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``eager``'s output through torchvision's FX feature extraction with timm's tracer options (its leaf modules
    and wrapped functions)."""
    options = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    last = get_graph_node_names(eager, tracer_kwargs=options)[1][-1]
    extractor = create_feature_extractor(eager, return_nodes=[last], tracer_kwargs=options)
    return lambda x: extractor(x)[last]


def test_timm_fx_tracer_options():
    assert_fx_features_match_eager(model("vit_rope_tiny_patch16_mixed_ape_224"))  # at SIZES, to 1e-5


@pytest.mark.parametrize("name", ["vit_rope_tiny_patch16_axial_ape_224", "vit_rope_tiny_patch16_mixed_224"])
def test_fx_backward_reaches_every_parameter_as_eager(name):
    eager = model(name).train()
    traced = create_feature_extractor(eager, return_nodes={"head": "logits"})
    x = torch.randn(2, 3, 48, 80)
    traced(x)["logits"].square().mean().backward()
    fx_grads = {n: p.grad.clone() for n, p in eager.named_parameters() if p.grad is not None}
    assert set(fx_grads) == {n for n, _ in eager.named_parameters()}
    eager.zero_grad()
    eager(x).square().mean().backward()  # the fused rotation's own backward
    for n, p in eager.named_parameters():
        torch.testing.assert_close(fx_grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_dynamic_img_pad_pads_as_timm_and_the_error_says_so():
    padded = model("vit_rope_tiny_patch16_mixed_ape_224", dynamic_img_pad=True)
    x = torch.randn(2, 3, 50, 70)
    with torch.inference_mode():
        expected = padded(F.pad(x, (0, 80 - 70, 0, 64 - 50)))  # timm pads right and bottom with zeros
        torch.testing.assert_close(padded(x), expected)
        features = padded.forward_intermediates(x, indices=1, intermediates_only=True)
    assert features[0].shape == (2, 192, 4, 5)
    with pytest.raises(ValueError, match=r"50x70 .*dynamic_img_pad=True"):
        model("vit_rope_tiny_patch16_mixed_224")(x)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_runs_a_forward_on_the_meta_device(kind):
    """timm's ``create_model(..., device="meta")`` then a meta input (timm's ``test_model_default_cfgs_non_std``): no
    value is ever read on the host."""
    net = timm.create_model("vit_rope_tiny_patch16_axial_224", encoding=kind, depth=2, device="meta")
    out = net(torch.empty(2, 3, 64, 48, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 1000)


@pytest.mark.parametrize("name, kwargs, side", [
    ("vit_rope_gemma4_vit_167m_enc", dict(position_embedding_size=64), 96),  # clamped linears, soft-token pooler
    ("vit_rope_qwen3_vit_88m_merge", dict(num_classes=3), 64),  # the merger's block check
    ("vit_rope_qwen2_5_vl_vit", dict(window_size=56, fullatt_block_indexes=[1]), 112),  # the window mask
])
def test_vlm_encoder_twins_trace_with_timms_tracer_to_eagers_outputs(name, kwargs, side):
    """timm's tracer options (leaf modules, wrapped functions) reach the VLM encoders' own code, the pooling from
    another family's module too; in float64, so the graph's rotation (the reference) and eager's (in place) agree."""
    eager = model(name, depth=2, embed_dim=64, num_heads=2, **kwargs).double()
    x = torch.randn(2, 3, side, side, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(timm_traced(eager)(x), eager(x), rtol=1e-9, atol=1e-9)
