"""Small models whose every weight shows in the output, and checks that two models (or two paths through one) give
the same outputs and gradients."""

from __future__ import annotations

from typing import Any

import timm
import torch

import vit_rope  # noqa: F401  (registers the vit_rope_* models)


def tiny(name: str, depth: int = 2, **kwargs) -> torch.nn.Module:
    """A ``depth``-block, 5-class model with LayerScale at 1 (1e-5 by default would make every block nearly the
    identity)."""
    torch.manual_seed(0)
    model = timm.create_model(name, depth=depth, num_classes=5, **kwargs)
    for key, param in model.named_parameters():
        if key.endswith(".gamma"):
            param.data.fill_(1.0)
    return model


def encoder(model: torch.nn.Module) -> torch.nn.Module:
    """A timm VLM tower's encoder: under ``.encoder`` in its classifiers, the model itself otherwise."""
    return getattr(model, "encoder", model)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference of ``b`` from ``a``, relative to ``a``'s largest magnitude."""
    return float((a - b).abs().max() / a.abs().max())


def randomize_(model: torch.nn.Module) -> None:
    """Every parameter away from its init (LayerScale 1e-5 would hide attention), norm scales around 1."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.1
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + noise)
            elif "gamma" in name:
                p.copy_(0.5 + noise)
            else:
                p.copy_(noise * 2)


def twins(theirs: torch.nn.Module, name: str, folder, converted: str,
          architecture: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's model ``name`` (``theirs``) as our twin through ``vit_rope.from_timm``, whose report says ``converted``,
    and through ``create_from_checkpoint`` of a safetensors file of its weights: the ``architecture`` the keys name,
    ``vit_rope_<name>`` of as many blocks, nothing initialised."""
    from safetensors.torch import save_file

    file = folder / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(file))
    twin = vit_rope.from_timm(theirs)
    assert any(converted in line for line in twin.load_report.converted)
    loaded = vit_rope.create_from_checkpoint(file).eval()
    assert type(loaded).__name__ == architecture and loaded.default_cfg["architecture"] == f"vit_rope_{name}"
    assert len(loaded.blocks) == len(twin.blocks) and not loaded.load_report.initialised, loaded.load_report.summary()
    return twin, loaded


@torch.no_grad()
def assert_naflex_as_timm(theirs: torch.nn.Module, twin: torch.nn.Module, images: list[torch.Tensor], length: int,
                          patch: int = 16) -> torch.Tensor:
    """Each sample of a NaFlex batch of ``images`` through ``twin`` gives what timm's ``theirs`` gives on that image
    alone: the tokens before the pooling (its encoder's ``forward_features``) and the output, to 1e-4 of their scale.
    The batch's output."""
    from helpers.naflex import pack

    batch = pack(images, length=length, patch=patch)
    tokens, out = twin.forward_features(batch), twin(batch)
    for b, image in enumerate(images):
        ref = encoder(theirs).forward_features(image[None]).flatten(1, -2)[0]  # [1, h, w, C] or [1, N, C]: [N, C]
        assert rel(ref, tokens[b, :len(ref)]) < 1e-4, b
        ref_out = theirs(image[None])[0]
        assert rel(ref_out, out[b, :len(ref_out)]) < 1e-4, b
    return out


@torch.no_grad()
def assert_maps_then_policy(theirs: torch.nn.Module, twin: torch.nn.Module, x: torch.Tensor,
                            shape: tuple[int, ...]) -> None:
    """``twin``'s last intermediate map on ``x`` is timm's ``theirs``' (to 1e-4, of ``shape``); under ``interpolate``
    (positions scaled to the trained grid) its output is no longer timm's."""
    _, ref = theirs.forward_intermediates(x, indices=1)
    _, ours = twin.forward_intermediates(x, indices=1)
    assert rel(ref[0], ours[0]) < 1e-4 and ours[0].shape == shape
    twin.set_resolution_policy("interpolate")
    assert rel(theirs(x), twin(x)) > 1e-3


def perturbed(name: str, policy: str | None = "extrapolate", **kwargs) -> torch.nn.Module:
    """Model ``name`` in eval mode with every parameter moved off its initialisation (a zero head or class token would
    hide paths from the logits), under resolution ``policy`` (None: the model's own, or a model without policies)."""
    torch.manual_seed(0)
    model = timm.create_model(name, **kwargs).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    if policy is not None:
        model.set_resolution_policy(policy)
    return model


def timm_eva(name: str, **kwargs) -> torch.nn.Module:
    """timm model ``name`` with LayerScale at 1 and random biases and tokens, so that every weight moves the output."""
    torch.manual_seed(0)
    model = timm.create_model(name, init_values=1.0, **kwargs)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias") or "token" in param_name:
                param.normal_(0, 0.2)
    return model.eval()


def assert_same_outputs(ours: torch.nn.Module, theirs: torch.nn.Module, sizes: list[tuple[int, int]],
                        batch: int = 2) -> None:
    """``ours`` gives the features and outputs of timm's model ``theirs`` to 1e-4 at every (height, width). timm's
    logits are its head over the features already computed (what its ``forward`` does); ours come from ``ours(x)``."""
    with torch.inference_mode():
        for height, width in sizes:
            x = torch.randn(batch, 3, height, width)
            features = theirs.forward_features(x)
            assert features.std() > 0.5
            torch.testing.assert_close(ours.forward_features(x), features, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours(x), theirs.forward_head(features), atol=1e-4, rtol=1e-4)


def assert_same_gradients(model: torch.nn.Module, first, second, x: torch.Tensor) -> None:
    """The gradients of ``model``'s parameters through ``first(x)`` and ``second(x)`` (callables over the same
    parameters, e.g. the compiled and the eager model) agree to 1e-4."""
    grads = []
    for forward in (first, second):
        model.zero_grad(set_to_none=True)
        forward(x).square().sum().backward()
        grads.append({name: param.grad for name, param in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-5, msg=name)


def assert_fx_features_match_eager(model: torch.nn.Module, timm_tracer: bool = True) -> None:
    """torchvision's FX feature extraction of ``model`` gives its eager logits at two grids; with timm's tracer options
    (its leaf modules and wrapped functions: the encodings it keeps whole build their tables at each input's grid) or
    with the plain tracer."""
    from timm.models import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor

    options = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    extractor = create_feature_extractor(model, return_nodes={"blocks.0": "b0", "head": "logits"},
                                         tracer_kwargs=options if timm_tracer else None)
    with torch.no_grad():
        for size in ((64, 64), (48, 80)):
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(extractor(x)["logits"], model(x), rtol=1e-5, atol=1e-5)


def onnx_session(path) -> Any:
    """An ONNX Runtime CPU session on one thread, as the tests' torch runs (conftest): its default, a spinning thread
    per core, would take the other core from a second test process (``make test`` runs two)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def assert_onnx_matches_eager(model: torch.nn.Module, folder) -> Any:
    """``model`` exported to ONNX at 64x48 (dynamic sizes) gives its eager logits at 80x80 and 96x128 (ONNX Runtime;
    skipped without it); the export's result."""
    import pytest

    pytest.importorskip("onnxruntime")
    from vit_rope.eval import onnx as export

    result = export.export_onnx(model, folder / "model.onnx", img_size=(64, 48))
    sess = onnx_session(result.path)
    for size in ((80, 80), (96, 128)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = model(x)
        got = torch.from_numpy(sess.run(None, {"images": x.numpy()})[0])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    return result


def onnx_sizes(model: torch.nn.Module, path, img_size: tuple[int, int]) -> list[tuple[int, int, int]]:
    """``model`` exported to ONNX at ``img_size`` gives its eager outputs (to 1e-4) at the three (batch, height, width)
    the export checks, with one file (the last a batch of one, the other way round); the first two."""
    from vit_rope.eval.onnx import export_onnx

    result = export_onnx(model.eval(), path, img_size=img_size)
    assert len(result.diffs) == 3 and all(diff < 1e-4 for diff in result.diffs.values()), result.diffs
    *sizes, turned = result.diffs
    assert turned == (1, *img_size[::-1])
    return sizes


def assert_features_and_reliance(model: torch.nn.Module, x: torch.Tensor, naflex: dict) -> None:
    """``forward_intermediates`` of a 2-block, 32-wide ``model`` on images ``x`` ``[2, 3, 64, 96]`` and a NaFlex batch
    ``naflex``, and the position ablation: the model uses its positions."""
    from vit_rope.eval.diagnostics import position_reliance

    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=2)
        torch.testing.assert_close(final, model.forward_features(x))
        flex = model.forward_intermediates(naflex, indices=1)
        reliance = position_reliance(model, x)
    assert len(inter) == 2 and inter[0].shape == (2, 32, 4, 6) and len(flex[1]) == 1
    assert reliance["output_change"] > 1e-3  # without its encoding the model computes something else
