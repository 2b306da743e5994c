"""The models as graphs: TorchScript (script, save, load), FX feature extraction (torchvision's plain tracer and
timm's), FX backward, and timm's ``dynamic_img_pad``. Every graph is held to the eager model at two sizes, one of
them non-square, and with LayerScale at 1 so that the logits are of order 1 (timm's 1e-5 would hide differences)."""

import io
import subprocess
import sys
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import vit_rope  # noqa: F401  (registers the models)

NAMES = ["vit_rope_tiny_patch16_axial_224", "vit_rope_tiny_patch16_mixed_224", "vit_rope_tiny_patch16_mixed_ape_224",
         "vit_rope_tiny_patch16_golden_224", "vit_rope_tiny_patch16_string_mixed_224"]
SIZES = [(64, 64), (48, 80)]


def model(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{"depth": 2, "num_classes": 5, "init_values": 1.0, **kwargs}).eval()


def script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, and still what many users deploy
        return torch.jit.script(module)


def save_and_load(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(module, buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)


@pytest.mark.parametrize("name", NAMES)
def test_torchscript_matches_eager_at_two_sizes_and_survives_save_and_load(name):
    eager = model(name, reg_tokens=1)
    if "string" in name:  # STRING's basis is a BlockInput, which TorchScript does not compile: folded, it scripts
        with torch.no_grad():
            for blk in eager.blocks:
                blk.attn.string.skew.normal_(std=0.1)
        with pytest.raises(RuntimeError, match=r"TorchScript does not support the string models.*fold_encoding_"):
            script(eager)
        eager.fold_encoding_()
    scripted = script(eager)
    loaded = save_and_load(scripted)
    with torch.inference_mode():
        for size in SIZES:
            x = torch.randn(2, 3, *size)
            expected = eager(x)
            assert expected.abs().max() > 0.1
            torch.testing.assert_close(scripted(x), expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(loaded(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", ["interpolate", "yarn", "normalized"])
def test_torchscript_keeps_the_resolution_policy(policy):
    eager = model("vit_rope_tiny_patch16_mixed_224", img_size=64, resolution_policy=policy)
    x = torch.randn(1, 3, 96, 128)  # not the training grid: the policy changes the tables
    with torch.inference_mode():
        torch.testing.assert_close(script(eager)(x), eager(x), atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("name", ["vit_rope_tiny_patch16_axial_224", "vit_rope_tiny_patch16_mixed_224"])
def test_plain_fx_trace_then_torchscript(name):
    """FX records the table functions as calls (``torch.fx.wrap``) that TorchScript compiles: the eager path's
    autograd Function for learned tables must not reach the traced graph."""
    eager = model(name)
    scripted = script(create_feature_extractor(eager, return_nodes={"head": "logits"}))
    with torch.inference_mode():
        for size in SIZES:
            x = torch.randn(1, 3, *size)
            torch.testing.assert_close(scripted(x)["logits"], eager(x), atol=1e-5, rtol=1e-5)


def test_timm_fx_tracer_options_then_torchscript():
    eager = model("vit_rope_tiny_patch16_mixed_ape_224")
    options = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    _, eval_nodes = get_graph_node_names(eager, tracer_kwargs=options)
    extractor = create_feature_extractor(eager, return_nodes=[eval_nodes[-1]], tracer_kwargs=options)
    scripted = script(extractor)
    with torch.inference_mode():
        for size in SIZES:
            x = torch.randn(1, 3, *size)
            torch.testing.assert_close(scripted(x)[eval_nodes[-1]], eager(x), atol=1e-5, rtol=1e-5)


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


def test_torchscript_does_not_depend_on_what_the_process_scripted_before():
    """TorchScript types a module class by the first instance it scripts; an axial or DINOv3 model scripted after a
    mixed one (whose RoPE2D holds a parameter, not a buffer) failed to compile. A fresh process sets that order."""
    code = """
import warnings, timm, torch, vit_rope
warnings.simplefilter("ignore")
x = torch.randn(1, 3, 48, 80)
for name in ["vit_rope_tiny_patch16_mixed_224", "vit_rope_tiny_patch16_axial_224", "vit_rope_small_patch16_dinov3"]:
    torch.manual_seed(0)
    model = timm.create_model(name, depth=2, num_classes=5, init_values=1.0).eval()
    with torch.inference_mode():
        torch.testing.assert_close(torch.jit.script(model)(x), model(x), atol=1e-5, rtol=1e-5)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
