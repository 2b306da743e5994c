"""Twins of timm's Gemma 4 ViTs (vit_rope_gemma4_vit_*): timm's tokens, soft tokens and logits at a square and a
non-square size through from_timm, load_weights and create_from_checkpoint (safetensors written from timm's
state_dict), with finite clamp bounds (167m) and standardisation (570m); a NaFlex batch sample by sample against timm
on each image alone; transformers' Gemma4VisionModel folders (config.json + model.safetensors) against transformers;
bad inputs refused by name. Depth 2, width 64, random weights, 6x6 and 9x6 patch grids."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import vit_rope
from helpers.models import assert_maps_then_policy, assert_naflex_as_timm, encoder, onnx_sizes, randomize_, rel, twins
from vit_rope.eval.loading import create_from_checkpoint
from vit_rope.models.gemma4_vit import GEMMA4

SIZES = [(96, 96), (144, 96)]  # square, and 9x6 patches (height != width: row / column order shows)
TOL = 1e-4
TINY = dict(depth=2, embed_dim=64, num_heads=2, head_dim=32, intermediate_size=96, position_embedding_size=64)
OURS = dict(depth=2, embed_dim=64, num_heads=2, mlp_ratio=1.5, position_embedding_size=64)  # TINY as twin arguments


def bounds_(model: torch.nn.Module) -> None:
    """Finite clamp bounds (some cut the activations) and a random standardisation, as the real files have."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith(("_min", "_max")):
                buffer.fill_((1.0 + float(torch.rand((), generator=g))) * (-1 if name.endswith("_min") else 1))
            elif "std_" in name:
                buffer.copy_(torch.randn(buffer.shape, generator=g))


def timm_gemma4(name: str, **kwargs) -> torch.nn.Module:
    classes = {} if name.endswith("_enc") else {"num_classes": 5}
    model = timm.create_model(name, **TINY, **classes, **kwargs)
    randomize_(model)
    bounds_(model)
    return model.eval()


@torch.no_grad()
def assert_parity(theirs: torch.nn.Module, ours: torch.nn.Module, size: tuple[int, int]) -> None:
    """Tokens before the pooler (timm's encoder ``forward_features``) and the output (soft tokens or logits)."""
    x = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(1))
    assert rel(encoder(theirs).forward_features(x), ours.forward_features(x)) < TOL
    out = theirs(x)
    assert out.shape == ours(x).shape and rel(out, ours(x)) < TOL, size


@pytest.mark.parametrize("name", list(GEMMA4))
def test_twin_equals_timm_through_from_timm_and_the_loader(name, tmp_path):
    theirs = timm_gemma4(name)  # the loaded model's sizes read from the file's keys
    twin, loaded = twins(theirs, name, tmp_path, "axis halves", "Gemma4VisionTransformer")
    for size in SIZES:
        assert_parity(theirs, twin, size)
    assert_parity(theirs, loaded, SIZES[1])


def test_clamps_and_standardisation_shape_the_output():
    """The bounds the parity runs under are not idle: without them timm's outputs move."""
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        clipped = timm_gemma4("gemma4_vit_167m_enc")
        ref = clipped(x)
        clipped.set_clamp_enabled(False)
        assert rel(ref, clipped(x)) > 1e-2
        std = timm_gemma4("gemma4_vit_570m_enc")
        ref = std(x)
        std.std_scale.fill_(1.0), std.std_bias.zero_()
        assert rel(ref, std(x)) > 1e-2


# the encoder, the classifier, and timm's classifier over the soft tokens (encoder_pool="soft")
@pytest.mark.parametrize("name, kwargs", [("gemma4_vit_167m_enc", {}), ("gemma4_vit_570m", {}),
                                          ("gemma4_vit_570m", dict(encoder_pool="soft"))])
def test_naflex_batch_sample_by_sample_equals_timm_on_each_image(name, kwargs):
    theirs = timm_gemma4(name, **kwargs)
    torch.manual_seed(1)
    images = [torch.rand(3, 16 * h, 16 * w) for h, w in ((6, 9), (9, 3), (3, 3))]
    assert_naflex_as_timm(theirs, vit_rope.from_timm(theirs), images, length=54)


def test_forward_intermediates_and_resolution_policy():
    theirs = timm_gemma4("gemma4_vit_570m_enc")  # interpolate: RoPE positions scaled to the 48x48 grid
    assert_maps_then_policy(theirs, vit_rope.from_timm(theirs), torch.rand(1, 3, 144, 96), (1, 64, 9, 6))


def hf_tower(tmp_path, **config):
    """A random transformers Gemma4VisionModel of TINY's sizes saved as a folder, and the model."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    cfg = transformers.Gemma4VisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                          position_embedding_size=64, **config)
    torch.manual_seed(0)
    model = Gemma4VisionModel(cfg)
    randomize_(model)
    bounds_(model)
    model.save_pretrained(tmp_path)
    return model.eval()


@pytest.mark.parametrize("config", [dict(use_clipped_linears=True), dict(standardize=True)])
def test_transformers_folder_loads_without_transformers_and_equals_it(tmp_path, config):
    hf = hf_tower(tmp_path, **config)
    twin = create_from_checkpoint(tmp_path).eval()
    assert type(twin).__name__ == "Gemma4VisionTransformer" and twin.global_pool == "soft"
    assert not twin.load_report.initialised and any("(y, x, channel)" in n for n in twin.load_report.converted)
    for h, w in ((6, 6), (9, 6)):  # the processor's patches: (y, x, channel) flattened, (x, y) positions
        x = torch.rand(1, 3, 16 * h, 16 * w)
        patches = x.reshape(1, 3, h, 16, w, 16).permute(0, 2, 4, 3, 5, 1).reshape(1, h * w, -1)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        with torch.no_grad():
            ref = hf(pixel_values=patches, pixel_position_ids=torch.stack([xs, ys], -1).reshape(1, -1, 2))
            assert rel(ref.last_hidden_state, twin(x)[0]) < TOL


def test_whole_gemma4_keys_keep_the_tower_and_say_what_was_dropped(tmp_path):
    hf = hf_tower(tmp_path)
    state = {f"model.vision_tower.{k}": v for k, v in hf.state_dict().items()}
    state["model.embed_vision.embedding_projection.weight"] = torch.zeros(8, 64)
    twin = timm.create_model("vit_rope_gemma4_vit_167m_enc", **OURS,
                             use_clipped_linears=False).eval()
    report = vit_rope.load_weights(twin, state)
    assert any("model.embed_vision" in line and "dropped" in line for line in report.converted)
    reference = create_from_checkpoint(tmp_path).eval()
    x = torch.rand(1, 3, 96, 144)
    with torch.no_grad():
        assert rel(reference(x), twin(x)) < 1e-6


def test_refused_inputs_name_what_and_where(tmp_path):
    gemma = timm_gemma4("gemma4_vit_570m_enc").state_dict()
    with pytest.raises(ValueError, match="Gemma 4 ViT.*vit_rope_gemma4_vit_"):
        vit_rope.load_weights(timm.create_model("vit_rope_medium_patch16_reg1_gap_256", depth=1), gemma)
    with pytest.raises(ValueError, match="Gemma 4's layout.*qk_layout='rotate_half'"):
        vit_rope.load_weights(timm.create_model("vit_rope_gemma4_vit_570m_enc", **OURS, qk_layout="rotate_half"),
                              gemma)
    clipped = timm_gemma4("gemma4_vit_167m_enc").state_dict()
    with pytest.raises(ValueError, match="use_clipped_linears=True"):
        vit_rope.load_weights(timm.create_model("vit_rope_gemma4_vit_570m_enc", **OURS), clipped)
    with pytest.raises(ValueError, match="act_layer.*vit_rope_gemma4_vit_167m"):
        vit_rope.from_timm(timm.create_model("gemma4_vit_167m", **TINY, act_layer=torch.nn.SiLU))
    with pytest.raises(ValueError, match="3x3 patches.*5x6"):
        timm.create_model("vit_rope_gemma4_vit_570m_enc", **OURS)(torch.rand(1, 3, 80, 96))
    hf_tower(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_activation": "silu"}))
    with pytest.raises(ValueError, match="hidden_activation='silu'.*vit_rope_gemma4_vit_"):
        create_from_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    with pytest.raises(ValueError, match="rms_norm_eps is 1e-05 in the file, 1e-06 in the model"):
        vit_rope.load_weights(timm.create_model("vit_rope_gemma4_vit_167m_enc", **OURS, use_clipped_linears=False),
                              tmp_path)


@pytest.mark.slow  # ONNX export and two ORT sessions
def test_encoder_twin_exports_to_onnx_at_two_sizes(tmp_path):
    model = timm.create_model("vit_rope_gemma4_vit_167m_enc", **{**OURS, "depth": 1})  # a block: the same ops again
    randomize_(model)
    bounds_(model)
    assert onnx_sizes(model, tmp_path / "gemma4.onnx", (96, 48)) == [(2, 96, 48), (3, 144, 48)]  # the pooler's too
