"""PaPE and PaPE-RI (vit_rope.encodings.pape.parabolas) and PaPE's official folders
(vit_rope.encodings.pape.pape_weights): logits equal the official code's on the same weights at its training grid and
a larger one (reference written by tests/fixtures/pape/make_reference.py from DTU-PAS/parabolic-position-encoding at
21cb390), patch logits that see offsets only, NaFlex samples equal to their image alone, features, position reliance,
diagnostics, ONNX export at other sizes, and errors that say what fits."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import timm
import torch

import vit_rope
from helpers.models import (
    assert_features_and_reliance,
    assert_fx_features_match_eager,
    assert_onnx_matches_eager,
    perturbed,
)
from helpers.naflex import assert_offsets_only, images, pack, samples_equal_images
from vit_rope.encodings.pape.pape_weights import pape_args_from_config
from vit_rope.eval.diagnostics import attention_entropy

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pape"
sys.path.insert(0, str(FIXTURES))
from make_reference import images as reference_images  # noqa: E402  (the script that wrote the reference)

KINDS = ("pape", "pape_ri")
BASE = dict(img_size=80, embed_dim=32, depth=2, num_heads=2, num_classes=7, init_values=0.5)
REFERENCE = torch.load(FIXTURES / "reference.pt", weights_only=True)


def build(kind: str, policy: str = "extrapolate", **kwargs) -> torch.nn.Module:
    options = {"encoding_options": {"parabolas": 3}} if kind == "pape" else {}
    return perturbed(f"vit_rope_tiny_patch16_{kind}_224", policy, **{**BASE, **options, **kwargs})


def test_the_registered_models_have_the_official_defaults():  # registered at three sizes: test_models.py
    model = timm.create_model("vit_rope_small_patch16_pape_224", depth=1)
    assert model.blocks[0].attn.pape.position.weight.shape == (6 * 50, 2)  # 50 parabolas per head
    assert model.blocks[0].attn.pape.ab.weight.shape == (2 * 6 * 50, 384)
    model = timm.create_model("vit_rope_small_patch16_pape_ri_224", depth=1)
    assert model.blocks[0].attn.pape.position_scales.abs().max() <= 2 ** -0.5


@pytest.mark.parametrize("kind", KINDS)
def test_official_folder_logits_equal_the_official_code_at_the_training_grid_and_a_larger_one(kind: str):
    model = vit_rope.create_from_checkpoint(FIXTURES / kind).eval()
    assert not model.load_report.initialised and model.pos_encoding.train_grid == (14, 14)
    policies = ("extrapolate", "normalized") if kind == "pape" else ("extrapolate",)
    for policy in policies:
        model.set_resolution_policy(policy)
        for size in (224, 320):
            with torch.no_grad():
                logits = model(reference_images(size))
            suffix = "_normalized" if policy == "normalized" else ""
            torch.testing.assert_close(logits, REFERENCE[f"{kind}_{size}{suffix}"], atol=1e-4, rtol=1e-4)


def test_load_weights_and_create_from_checkpoint_take_the_folder_into_the_model_its_config_describes():
    """(create_from_checkpoint building the model itself: the first test.)"""
    name, kwargs = pape_args_from_config(json.loads((FIXTURES / "pape" / "config.json").read_text()))
    model = timm.create_model(name, **kwargs).eval()
    assert not vit_rope.load_weights(model, FIXTURES / "pape").initialised
    _, kwargs = pape_args_from_config(json.loads((FIXTURES / "pape_ri" / "config.json").read_text()))
    named = vit_rope.create_from_checkpoint(FIXTURES / "pape_ri", model="vit_rope_tiny_patch16_pape_ri_224",
                                            **kwargs).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(reference_images(224)), REFERENCE["pape_224"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(named(reference_images(224)), REFERENCE["pape_ri_224"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", ["extrapolate", "interpolate", "normalized"])
def test_each_sample_of_a_mixed_batch_equals_its_image_alone(kind: str, policy: str):
    logits, _ = samples_equal_images(build(kind, policy))
    assert logits.abs().max() > 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_patch_logits_see_offsets_only_on_shifted_and_sparse_coordinates(kind: str):
    assert_offsets_only(build(kind, class_token=False, global_pool="avg"))


@pytest.mark.parametrize("kind", KINDS)
def test_intermediates_diagnostics_and_position_reliance(kind: str):
    model, x = build(kind), torch.randn(2, 3, 64, 96)
    assert_features_and_reliance(model, x, pack(images()))
    entropy = attention_entropy(model, x)
    model.blocks[0].attn.pape = None  # the entropy of attention without the parabolas differs
    assert abs(entropy[0] - attention_entropy(model, x)[0]) > 1e-3  # the diagnostics see the parabolas


@pytest.mark.parametrize("kind", KINDS)
def test_training_step_and_compile(kind: str):
    """Every PaPE parameter gets a gradient, and the traced graph (``aot_eager``: what PaPE adds is in it; inductor's
    code generation of its products and concatenations is torch's) gives the eager logits."""
    model = build(kind, depth=1).train()  # one block: the graph of every block is the same
    x = torch.randn(2, 3, 64, 64)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.blocks[0].attn.pape.parameters())
    compiled = torch.compile(model.eval(), dynamic=False, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tracer", ["plain", "timm"])
def test_fx_feature_extraction_matches_eager(tracer: str):
    assert_fx_features_match_eager(build("pape"), timm_tracer=tracer == "timm")


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_export_at_two_sizes_matches_eager(kind: str, tmp_path):
    assert_onnx_matches_eager(build(kind, depth=1), tmp_path)  # a second block would trace the same ops again


def test_bad_options_and_policies_are_errors_that_say_what_fits():
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=rf"parabolas={bad!r} must be a whole number .* at least 1"):
            build("pape", encoding_options={"parabolas": bad})
    with pytest.raises(ValueError, match=r"\['parabolas'\] do not apply to the pape_ri encoding, which takes none"):
        build("pape_ri", encoding_options={"parabolas": 3})
    model = build("pape")
    with pytest.raises(ValueError, match="'yarn' does not apply to pape, a parabolic bias"):
        model.set_resolution_policy("yarn")


def test_official_folders_that_disagree_or_fit_another_kind_are_errors(tmp_path):
    folder = tmp_path / "pape"
    shutil.copytree(FIXTURES / "pape", folder)
    config = json.loads((folder / "config.json").read_text())
    for change, message in [
            ({"pape": {"parabolas": 50}}, r"num_heads x pape.parabolas is 100 in config.json, 6 in the weights"),
            ({"positional": "pape_ri"}, r"model.pt holds the weights of 'pape'.*positional='pape' fits"),
            ({"positional": "rope_mixed"}, r"positional='rope_mixed'; vit_rope builds the official PaPE classifiers")]:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=message):
            vit_rope.create_from_checkpoint(folder)
    ri = vit_rope.create_from_checkpoint(FIXTURES / "pape_ri")
    with pytest.raises(ValueError, match=r"describes an official pape classifier.*encoding='pape_ri'"):
        vit_rope.load_weights(ri, FIXTURES / "pape")
    with pytest.raises(ValueError, match=r"with encoding 'pape'; the model has encoding='pape_ri'.*_pape_224"):
        vit_rope.load_weights(ri, torch.load(FIXTURES / "pape" / "model.pt", weights_only=True))
    name, kwargs = pape_args_from_config(config)
    wider = timm.create_model(name, **{**kwargs, "encoding_options": {"parabolas": 4}})
    with pytest.raises(ValueError, match=r"pape.parabolas is 3 in the file, 4 in the model"):
        vit_rope.load_weights(wider, FIXTURES / "pape")
