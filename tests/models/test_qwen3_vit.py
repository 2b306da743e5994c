"""Twins of timm's Qwen3-VL ViTs (vit_rope_qwen3_vit_*): timm's features, merger tokens and logits at a square and a
non-square size through from_timm, load_weights and create_from_checkpoint (safetensors written from timm's
state_dict); a NaFlex batch sample by sample against timm on each image alone; bad inputs refused by name. Depth 1,
random weights, 4x4 to 6x4 patch grids (the 48x48 APE table resampled down). The heads DeepSeek's and Gemma 4's twins
share (vit_rope.models.twins) are held here for the three families: an encoder file into a classifier, classes asked
of an encoder; and DeepSeek's encoder twin's ONNX export beside Qwen3-VL's."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.models import assert_maps_then_policy, assert_naflex_as_timm, encoder, onnx_sizes, randomize_, rel, twins
from vit_rope.models import qwen3_vit
from vit_rope.models.qwen3_vit import QWEN3

SIZES = [(64, 64), (96, 64)]  # square, and 6x4 patches (height != width: row / column order shows)
TOL = 1e-4


def timm_qwen3(name: str, **kwargs) -> torch.nn.Module:
    classes = {} if name.endswith("_enc") else {"num_classes": 5}
    model = timm.create_model(name, depth=1, **classes, **kwargs)
    randomize_(model)
    return model.eval()


@torch.no_grad()
def assert_parity(theirs: torch.nn.Module, ours: torch.nn.Module, size: tuple[int, int]) -> None:
    """Tokens before the merger (timm's encoder ``forward_features``, NHWC), the merger's tokens and the output."""
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    tokens = encoder(theirs).forward_features(x).flatten(1, 2)
    assert rel(tokens, ours.forward_features(x)) < TOL
    if encoder(theirs).merger is not None:
        h, w = size[0] // 16, size[1] // 16
        assert rel(encoder(theirs).merger(tokens.unflatten(1, (h, w))), ours.patch_merger(tokens, (h, w))[0]) < TOL
    out = theirs(x)
    assert rel(out, ours(x)) < TOL, size


# one per head (classifier, classifier over the merger, encoder); 416m: an MLP ratio of no whole number
@pytest.mark.parametrize("name", ["qwen3_vit_416m", "qwen3_vit_88m_merge", "qwen3_vit_88m_enc"])
def test_twin_equals_timm_through_from_timm_and_the_loader(name, tmp_path):
    theirs = timm_qwen3(name)
    twin, loaded = twins(theirs, name, tmp_path, "rotate-half", "Qwen3VisionTransformer")
    for size in SIZES:
        assert_parity(theirs, twin, size)
    assert_parity(theirs, loaded, SIZES[1])


def test_every_twins_arguments_are_its_timm_models():
    """The table's sizes and heads, which the parity above runs at three of the nine: timm's model of each name as
    from_timm reads it (on the meta device). The merger's width is a tag's (timm's follows the tag it is built for)."""
    for name, args in QWEN3.items():
        twin, read = qwen3_vit.architecture(timm.create_model(name, device="meta"))
        keys = args.keys() & read.keys() - {"img_size", "norm_layer", "merger_out_features"}
        assert twin == f"vit_rope_{name}" and read["img_size"] == (args["img_size"],) * 2, name
        assert {key: read[key] for key in keys} == {key: args[key] for key in keys}, name


def test_a_mergers_width_is_the_weights_tags_as_timms():
    """One name serves the towers of several language models: the merger's width follows the tag built (meta)."""
    for name in ("qwen3_vit_306m_merge", "qwen3_vit_416m_enc"):
        for tag in timm.list_pretrained(f"{name}.*"):
            ours, theirs = (timm.create_model(n, depth=1, device="meta") for n in (f"vit_rope_{tag}", tag))
            assert ours.patch_merger.out_features == getattr(theirs, "encoder", theirs).out_features, tag
    ours, theirs = (timm.create_model(n, depth=1, encoder_pool="merge", device="meta") for n in (
        "vit_rope_qwen3_vit_88m", "qwen3_vit_88m"))  # the classifier asked for a merger: the tag's width, as timm's
    assert ours.patch_merger.out_features == theirs.encoder.out_features == 1024
    with pytest.raises(ValueError, match="pass merger_out_features"):
        timm.create_model("vit_rope_qwen3_vit_306m_merge", device="meta", pretrained_cfg=dict(tag="other"))


@pytest.mark.parametrize("family, sizes, key", [("qwen3_vit_88m", dict(depth=1), "merger.fc1.weight"), (
    "deepseek_vit_412m", dict(depth=1, embed_dim=128, num_heads=2, out_features=48), "aligner.fc1.weight")])
def test_an_encoder_file_into_a_classifier_reports_its_projector_dropped(family, sizes, key):
    theirs = timm.create_model(f"{family}_enc", **sizes).eval()
    randomize_(theirs)
    ours = timm.create_model(f"vit_rope_{family}", **{k: v for k, v in sizes.items() if k != "out_features"}).eval()
    report = vit_rope.load_weights(ours, theirs.state_dict())
    assert any(key in line and "dropped" in line for line in report.converted)
    x = torch.randn(1, 3, 112, 224)  # whole patches of 16 and of 14 px
    with torch.no_grad():
        assert rel(theirs.forward_features(x).flatten(1, 2), ours.forward_features(x)) < TOL


@pytest.mark.parametrize("name", ["qwen3_vit_88m_merge", "qwen3_vit_88m_enc"])
def test_naflex_batch_sample_by_sample_equals_timm_on_each_image(name):
    theirs = timm_qwen3(name)
    torch.manual_seed(1)
    images = [torch.randn(3, 16 * h, 16 * w) for h, w in ((4, 6), (6, 2), (2, 2))]
    assert_naflex_as_timm(theirs, vit_rope.from_timm(theirs), images, length=24)


def test_forward_intermediates_and_resolution_policy():
    theirs = timm_qwen3("qwen3_vit_88m_enc")  # interpolate: positions scaled to the 48x48 grid
    assert_maps_then_policy(theirs, vit_rope.from_timm(theirs), torch.randn(1, 3, 96, 64), (1, 768, 6, 4))


def test_refused_inputs_name_what_and_where(tmp_path):
    qwen = timm_qwen3("qwen3_vit_88m_enc").state_dict()
    save_file(qwen, tmp_path / "qwen3.safetensors")
    with pytest.raises(ValueError, match=r"qwen3\.safetensors: The checkpoint is .*Qwen3-VL.*vit_rope_qwen3_vit_"):
        vit_rope.load_weights(timm.create_model("vit_rope_medium_patch16_reg1_gap_256", depth=1),
                              tmp_path / "qwen3.safetensors")
    eva = timm.create_model("vit_medium_patch16_rope_reg1_gap_256", depth=1, device="meta").state_dict()
    with pytest.raises(ValueError, match="timm's Eva.*Qwen3-VL twin"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1, device="meta"), eva)
    with pytest.raises(ValueError, match="rotate_half.*qk_layout='interleaved'"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1, qk_layout="interleaved"), qwen)
    with pytest.raises(ValueError, match="act_layer=SiLU.*vit_rope_qwen3_vit_88m"):
        vit_rope.from_timm(timm.create_model("qwen3_vit_88m", depth=1, act_layer=torch.nn.SiLU))
    with pytest.raises(ValueError, match="2x2 patches.*5x4"):
        timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1)(torch.randn(1, 3, 80, 64))


@pytest.mark.slow  # ONNX export and two ORT sessions: about 10 s each on 2 cores
@pytest.mark.parametrize("family, widths, size, sizes", [
    ("qwen3_vit_88m", dict(num_heads=2, merger_out_features=32), (64, 32), [(2, 64, 32), (3, 96, 32)]),
    ("deepseek_vit_412m", dict(num_heads=1, aligner_out_features=32), (56, 42), [(2, 56, 42), (3, 84, 42)]),
])
def test_encoder_twins_of_qwen3_and_deepseek_export_to_onnx_at_two_sizes(family, widths, size, sizes, tmp_path):
    model = timm.create_model(f"vit_rope_{family}_enc", depth=1, embed_dim=64, **widths)
    randomize_(model)
    assert onnx_sizes(model, tmp_path / f"{family}.onnx", size) == sizes  # the merger's, aligner's too (56x42 pads)


@pytest.mark.parametrize("family, pool, sizes, size, tokens", [
    ("qwen3_vit_88m", "merge", dict(merger_out_features=48), (64, 96), (6, 48)),
    ("deepseek_vit_412m", "align", dict(embed_dim=128, aligner_out_features=48), (56, 42), (2, 48)),
    ("gemma4_vit_570m", "soft", dict(mlp_ratio=1.5, position_embedding_size=64), (96, 144), (6, 64)),
])
def test_classes_asked_of_an_encoder_make_it_the_classifier_over_its_tokens(family, pool, sizes, size, tokens):
    """timm's contract (``reset_classifier(n)`` gives a classifier): an ``*_enc`` twin (Qwen3-VL's heads, which
    DeepSeek's and Gemma 4's share) with classes pools its projector's tokens (4x6 patches: 2x3 merged; 4x3: 2x1 padded
    aligner cells; 6x9: 2x3 soft tokens) as the classifier over them does, to the same logits with the same weights;
    the head keeps the model's mode."""
    sizes = dict(dict(depth=1, embed_dim=64, num_heads=2), **sizes)
    over_tokens = timm.create_model(f"vit_rope_{family}", **sizes, encoder_pool=pool, num_classes=3)
    randomize_(over_tokens)
    enc = timm.create_model(f"vit_rope_{family}_enc", **sizes).eval()
    x = torch.randn(2, 3, *size)
    assert enc(x).shape == (2, *tokens)
    enc.reset_classifier(3)
    assert not enc.head.training
    enc.load_state_dict(over_tokens.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(enc(x), over_tokens.eval()(x), rtol=0, atol=0)
