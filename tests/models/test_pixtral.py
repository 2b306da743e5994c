"""Twins of Pixtral's vision encoder (vit_rope_pixtral_vit_*) against transformers' PixtralVisionModel and its Llava,
built from tiny configs here with random weights: tokens (and the projector's) at a square and a non-square size
through vit_rope.from_timm, create_from_checkpoint and load_weights of the folders transformers writes (read with
transformers blocked); a NaFlex batch sample by sample against Pixtral's own packed sequence of mixed sizes; tools;
bad inputs refused by name. transformers is a test extra: the module skips without it."""

from __future__ import annotations

import json
import sys

import pytest
import timm
import torch

import vit_rope
from helpers.models import onnx_sizes, randomize_, rel
from helpers.naflex import pack
from vit_rope.eval.loading import create_from_checkpoint
from vit_rope.models import pixtral

transformers = pytest.importorskip("transformers")

SIZES = [(64, 64), (96, 48)]  # square, and 6x3 patches (height != width: the axes' frequencies differ)
TOL = 1e-4
VISION = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, hidden_act="silu",
              image_size=128)


def hf_pixtral(**overrides) -> torch.nn.Module:
    model = transformers.PixtralVisionModel(transformers.PixtralVisionConfig(**{**VISION, **overrides}))
    randomize_(model)
    return model.eval()


def hf_llava(layers: int = 2) -> torch.nn.Module:
    config = transformers.LlavaConfig(
        vision_config=dict(VISION, model_type="pixtral", num_hidden_layers=layers), vision_feature_layer=-1,
        vision_feature_select_strategy="full", image_token_index=10,
        text_config=dict(model_type="mistral", hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=24, vocab_size=64))
    model = transformers.LlavaForConditionalGeneration(config)
    randomize_(model)
    return model.eval()


@torch.no_grad()
def projected(llava: torch.nn.Module, x: torch.Tensor, sizes: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """What the language model reads: the projector's tokens of each image."""
    return llava.model.get_image_features(pixel_values=x, image_sizes=torch.tensor(sizes), vision_feature_layer=-1,
                                          vision_feature_select_strategy="full").pooler_output


@torch.no_grad()
def assert_parity(theirs: torch.nn.Module, ours: torch.nn.Module, size: tuple[int, int]) -> None:
    """Pixtral's last_hidden_state against forward_features; a Llava's projector tokens against forward."""
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    tower = getattr(getattr(theirs, "model", None), "vision_tower", theirs)
    assert rel(tower(x).last_hidden_state, ours.forward_features(x)) < TOL, size
    if tower is not theirs:
        assert rel(projected(theirs, x, [size])[0], ours(x)[0]) < TOL, size


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_twin_equals_pixtral_through_from_timm_and_the_folder(act, tmp_path, monkeypatch):
    theirs = hf_pixtral(hidden_act=act)
    twin = vit_rope.from_timm(theirs)
    assert type(twin).__name__ == "PixtralVisionTransformer" and twin.projector is None
    assert any("rotate-half" in line for line in twin.load_report.converted)
    theirs.save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # the loader runs without transformers
    loaded = create_from_checkpoint(tmp_path).eval()
    assert loaded.default_cfg["architecture"] == "vit_rope_pixtral_vit_12b" and len(loaded.blocks) == 2
    assert not loaded.load_report.initialised, loaded.load_report.summary()
    for size in SIZES:
        assert_parity(theirs, twin, size)
        assert_parity(theirs, loaded, size)


def test_llava_folder_keeps_the_projector_and_drops_the_language_model(tmp_path, monkeypatch):
    theirs = hf_llava()
    twin = vit_rope.from_timm(theirs)
    assert twin.default_cfg["architecture"] == "vit_rope_pixtral_vit_12b_llava"
    theirs.save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)
    loaded = create_from_checkpoint(tmp_path).eval()
    assert loaded.projector.fc2.out_features == 48
    assert any("language model's" in line and "dropped" in line for line in loaded.load_report.converted)
    args = pixtral.pixtral_args_from_config(json.loads((tmp_path / "config.json").read_text()))[1]
    ours = timm.create_model("vit_rope_pixtral_vit_12b_llava", **args).eval()
    assert not vit_rope.load_weights(ours, tmp_path).initialised
    for size in SIZES:
        assert_parity(theirs, twin, size)
        assert_parity(theirs, loaded, size)
    assert_parity(theirs, ours, SIZES[1])
    encoder = timm.create_model("vit_rope_pixtral_vit_12b", **{k: v for k, v in args.items() if "projector" not in k})
    report = vit_rope.load_weights(encoder, theirs.state_dict())  # the encoder alone: the projector said dropped
    assert any("multi_modal_projector.linear_1.weight" in line for line in report.converted)


def test_naflex_batch_sample_by_sample_equals_pixtrals_packed_sequence():
    theirs = hf_llava()
    twin = vit_rope.from_timm(theirs)
    torch.manual_seed(1)
    grids = [(4, 6), (6, 2), (2, 2)]
    images = [torch.randn(3, 16 * h, 16 * w) for h, w in grids]
    padded = torch.zeros(len(images), 3, 96, 96)
    for b, image in enumerate(images):
        padded[b, :, :image.shape[1], :image.shape[2]] = image
    sizes = [tuple(image.shape[1:]) for image in images]
    batch = pack(images, length=24)
    with torch.no_grad():  # Pixtral: one sequence of every image's patches, attention block-diagonal
        packed = theirs.model.vision_tower(padded, image_sizes=torch.tensor(sizes)).last_hidden_state[0]
        tokens, out = twin.forward_features(batch), twin(batch)
    refs = zip(packed.split([h * w for h, w in grids]), projected(theirs, padded, sizes), strict=True)
    for b, (ref, proj) in enumerate(refs):
        assert rel(ref, tokens[b, :len(ref)]) < TOL, b
        assert rel(proj, out[b, :len(proj)]) < TOL, b


def test_forward_intermediates_and_resolution_policies():
    theirs = hf_pixtral()
    twin = vit_rope.from_timm(theirs)
    x = torch.randn(1, 3, 48, 160)  # 3x10 patches: wider than the 8x8 grid of image_size, which policies scale to
    with torch.no_grad():
        hidden = theirs(x, output_hidden_states=True).hidden_states
        _, ours = twin.forward_intermediates(x, indices=2)
        assert ours[0].shape == (1, 64, 3, 10)
        assert rel(hidden[1], ours[0].flatten(2).transpose(1, 2)) < TOL
        ref = hidden[-1]
        for policy in ("interpolate", "ntk", "yarn"):
            twin.set_resolution_policy(policy)
            assert rel(ref, twin.forward_features(x)) > 1e-3, policy


def test_axes_take_alternate_rungs_of_one_ladder():
    rope = vit_rope.RoPE2D(16, 1, theta=1e4, alternate_axes=True)
    ladder = 1e4 ** (-torch.arange(0, 16, 2) / 16)
    torch.testing.assert_close(rope.freqs[0, 0, :4], ladder[1::2])  # x: the odd rungs
    torch.testing.assert_close(rope.freqs[1, 0, 4:], ladder[0::2])  # y: the even ones, RoPE-ViT's
    with pytest.raises(ValueError, match="alternate_axes=True.*'mixed'"):
        vit_rope.RoPE2D(16, 2, kind="mixed", alternate_axes=True)


def test_keys_alone_name_the_twin_where_the_width_is_pixtrals():
    meta = dict(device="meta")
    state = {"vision_tower.patch_conv.weight": torch.empty(1024, 3, 16, 16, **meta),
             "vision_tower.transformer.layers.1.ffn_norm.weight": torch.empty(1024, **meta),
             "multi_modal_projector.linear_1.weight": torch.empty(5120, 1024, **meta)}
    assert pixtral.describe_pixtral(state) == ("vit_rope_pixtral_vit_12b_llava",
                                               dict(depth=2, projector_dim=5120, projector_bias=False))
    state["vision_tower.patch_conv.weight"] = torch.empty(64, 3, 16, 16, **meta)  # heads unknown: no name
    assert pixtral.describe_pixtral(state)[0] is None


def test_refused_inputs_name_the_field_and_the_model(tmp_path):
    theirs = hf_pixtral().state_dict()
    with pytest.raises(ValueError, match="PixtralVisionModel.*vit_rope_pixtral_vit_"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1, device="meta"), theirs)
    qwen = timm.create_model("qwen3_vit_88m_enc", depth=1, device="meta").state_dict()
    with pytest.raises(ValueError, match="Qwen3-VL.*PixtralVisionTransformer"):
        vit_rope.load_weights(timm.create_model("vit_rope_pixtral_vit_12b", depth=1, device="meta"), qwen)
    args = pixtral.pixtral_args_from_config(VISION)[1]
    with pytest.raises(ValueError, match="rotate-half.*qk_layout='interleaved'"):
        vit_rope.load_weights(timm.create_model("vit_rope_pixtral_vit_12b", **args, qk_layout="interleaved"), theirs)
    for field, value, message in (("hidden_act", "relu", "hidden_act='relu', which the vit_rope_pixtral_vit_"),
                                  ("head_dim", 32, "head_dim=32.*num_attention_heads = 16"),
                                  ("rope_parameters", {"rope_theta": 1e4, "rope_type": "yarn"},
                                   "rope_parameters.rope_type='yarn'")):
        with pytest.raises(ValueError, match=f"config.json has {message}"):
            pixtral.pixtral_args_from_config({**VISION, "model_type": "pixtral", field: value})
    llava = hf_llava().config.to_dict()
    with pytest.raises(ValueError, match="vision_feature_select_strategy='default'.*class token"):
        pixtral.pixtral_args_from_config({**llava, "vision_feature_select_strategy": "default"})
    with pytest.raises(ValueError, match="mistral3.*vit_rope_pixtral_vit_mistral_small_3_1"):
        pixtral.pixtral_args_from_config({"model_type": "mistral3", "vision_config": VISION})
    hf_pixtral().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_hidden_layers is 2 in the file, 1 in the model"):
        vit_rope.load_weights(timm.create_model("vit_rope_pixtral_vit_12b", **{**args, "depth": 1}), tmp_path)


def test_classes_asked_of_the_llava_twin_classify_the_projectors_tokens():
    """timm's contract (``reset_classifier(n)`` gives a classifier): the mean of the projector's tokens into a head;
    without classes the tokens themselves; the head keeps the model's mode."""
    model = timm.create_model("vit_rope_pixtral_vit_12b_llava", depth=1, embed_dim=64, num_heads=2, projector_dim=24,
                              img_size=64).eval()
    randomize_(model)
    x = torch.randn(2, 3, 64, 32)
    with torch.no_grad():
        tokens = model(x)
        assert tokens.shape == (2, 8, 24)
        model.reset_classifier(3)
        assert not model.head.training and model.head.in_features == 24
        torch.testing.assert_close(model(x), model.head(tokens.mean(1)))
        torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True), tokens.mean(1))


@pytest.mark.slow  # ONNX export and two ORT sessions
def test_llava_twin_exports_to_onnx_at_two_sizes(tmp_path):
    twin = timm.create_model("vit_rope_pixtral_vit_12b_llava", depth=1, embed_dim=64, num_heads=4, projector_dim=24,
                             img_size=64)  # a second block would trace the same ops again
    randomize_(twin)
    onnx_sizes(twin, tmp_path / "pixtral.onnx", (64, 32))
