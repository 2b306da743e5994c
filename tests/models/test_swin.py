"""RoPE-Swin (vit_rope.models.swin): the official model's logits from its own code (tests/helpers/rope_swin_official.py,
naver-ai/rope-vit at a pinned commit; MIT and Llama 2 Community License, stated there), window-local positions under
each resolution policy, and timm's Swin features."""

from __future__ import annotations

import math

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from helpers import rope_swin_official as official
from helpers.models import randomize_
from vit_rope import create_from_checkpoint, load_weights
from vit_rope.layers.rotary import grid_positions, rope_angles, rope_tables
from vit_rope.models.checkpoint import ROPE_FREQS
from vit_rope.models.formats import describe
from vit_rope.models.pos_encoding import resolution_encoding
from vit_rope.models.swin import SWIN_SIZES, SWIN_THETA, RoPESwinTransformer, from_official, swin_name

SMALL = dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))  # head_dim 32 in every stage


def official_swin(kind: str, **kwargs) -> torch.nn.Module:
    """The official RoPE-Swin of ``kind`` (random weights, its official theta), SMALL but for ``kwargs``."""
    return official.RoPESwinTransformer(**{"rope_theta": SWIN_THETA[kind], "rope_mixed": kind == "mixed", **SMALL,
                                           **kwargs})


def pair(kind: str, use_rpb: bool) -> tuple[torch.nn.Module, RoPESwinTransformer]:
    """The official model (random weights) and ours with its weights converted."""
    torch.manual_seed(0)
    theirs = official_swin(kind, use_rpb=use_rpb).eval()
    ours = RoPESwinTransformer(encoding=kind, use_rpb=use_rpb, **SMALL).eval()
    report = load_weights(ours, {"model": theirs.state_dict()})  # with RoPE-ViT's wrapper, as it saves them
    assert report.initialised == {}
    return theirs, ours


@pytest.mark.parametrize("kind,use_rpb", [("mixed", False), ("axial", False), ("mixed", True), ("axial", True)])
def test_the_official_models_logits_at_224_px(kind: str, use_rpb: bool) -> None:
    theirs, ours = pair(kind, use_rpb)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["mixed", "axial"])
def test_window_12_at_384_px_is_the_official_evaluation_and_extrapolates(kind: str) -> None:
    """RoPE-ViT evaluates at 384 px by building the model with window 12 (positions 0..11 in a window): ours, trained
    with window 7 and given window 12 by timm's ``set_input_size``, is that model under ``extrapolate``."""
    theirs, ours = pair(kind, False)
    at_384 = official_swin(kind, img_size=384, window_size=12)
    rebuilt = ("rope_t_", "attn_mask")  # what the official loader drops: the windows' positions and masks
    at_384.load_state_dict({k: v for k, v in theirs.state_dict().items() if not any(r in k for r in rebuilt)},
                           strict=False)
    ours.set_input_size(img_size=(384, 384), window_size=12)
    images = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        expected = at_384.eval()(images)
        torch.testing.assert_close(ours(images), expected, rtol=1e-4, atol=1e-5)
        ours.set_resolution_policy("interpolate")  # positions scaled into the trained window: another model
        assert (ours(images) - expected).abs().max() > 1e-4  # random weights: small, but 1000x parity's


def test_policies_scale_window_positions_against_the_trained_window() -> None:
    """Every policy is the identity at the trained window; on a window of 14, ``interpolate`` is extrapolation of
    positions halved (7 / 14)."""
    model = RoPESwinTransformer(encoding="mixed", **SMALL)
    rope = model.layers[0].blocks[0].attn.rope
    assert rope.train_grid == (7, 7)

    def tables(window: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(grid_positions(window, window), 0, torch.tensor([[window, window]]))

    for policy in ("interpolate", "ntk", "yarn"):
        model.set_resolution_policy(policy)
        torch.testing.assert_close(tables(7), rope_tables(rope_angles(grid_positions(7, 7), rope.freqs)))
    model.set_resolution_policy("interpolate")
    torch.testing.assert_close(tables(14), rope_tables(rope_angles(grid_positions(14, 14) / 2, rope.freqs)))
    assert model.resolution_policy.name == "interpolate"
    with pytest.raises(ValueError, match="normalized"):
        RoPESwinTransformer(encoding="axial", resolution_policy="bogus", **SMALL)


def test_the_attention_places_window_positions_by_the_policy() -> None:
    """The attention takes its positions from the policy as a ViT does: integer window positions for every policy
    but ``normalized`` (the window's cell centres in 2 pi [-1, 1], for models trained that way), whose logits differ."""
    torch.manual_seed(0)
    model, x = RoPESwinTransformer(encoding="axial", **SMALL).eval(), torch.randn(1, 3, 224, 224)
    seen = []
    model.layers[0].blocks[0].attn.rope.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    with torch.no_grad():
        reference = model(x)
        for policy in ("interpolate", "ntk", "yarn"):
            model.set_resolution_policy(policy)
            torch.testing.assert_close(model(x), reference)
        model.set_resolution_policy("normalized")
        normalized = model(x)
    assert all(torch.equal(positions, grid_positions(7, 7)) for positions in seen[:-1])
    torch.testing.assert_close(seen[-1], 2 * math.pi * ((grid_positions(7, 7) + 0.5) / 7 * 2 - 1))
    assert not torch.allclose(normalized, reference)


def test_axial_frequencies_of_another_theta_are_refused_and_kinds_are_checked() -> None:
    theirs = official_swin("axial", rope_theta=100.0)
    with pytest.raises(ValueError, match="another theta than this model's 50: create the model with the checkpoint"):
        from_official(theirs.state_dict(), RoPESwinTransformer(encoding="axial", **SMALL))
    with pytest.raises(ValueError, match="load it into a swin_rope_"):
        from_official(theirs.state_dict(), timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1))
    with pytest.raises(ValueError, match=r"RoPE-Swin encoding \(RoPE-ViT's\) 'golden': choose one of axial, mixed\."):
        RoPESwinTransformer(encoding="golden", **SMALL)
    naflex = {"patches": torch.randn(1, 16, 48), "patch_coord": torch.zeros(1, 16, 2, dtype=torch.long),
              "patch_valid": torch.ones(1, 16, dtype=torch.bool)}
    with pytest.raises(TypeError, match="not NaFlex batches"):
        RoPESwinTransformer(encoding="mixed", **SMALL)(naflex)


def test_registered_models_have_timms_swin_features() -> None:
    """Names, the four strides of ``features_only``, ``forward_intermediates``, any size with ``dynamic_img_size``,
    the learned frequencies without weight decay (RoPE-ViT), no bias table unless asked."""
    assert len(timm.list_models("swin_rope_*")) == 6
    model = timm.create_model("swin_rope_axial_tiny_patch4_window7_224", **SMALL)
    assert resolution_encoding(model) is model.layers[0].blocks[0].attn.rope  # what the harness checks policies on
    model = timm.create_model("swin_rope_mixed_tiny_patch4_window7_224", features_only=True, **SMALL).eval()
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert [tuple(f.shape[1:3]) for f in model(images)] == [(56, 56), (28, 28), (14, 14), (7, 7)]
    model = timm.create_model("swin_rope_mixed_tiny_patch4_window7_224", dynamic_img_size=True, **SMALL).eval()
    with torch.no_grad():
        final, stages = model.forward_intermediates(torch.randn(1, 3, 160, 256))
        assert [tuple(s.shape[2:]) for s in stages] == [(40, 64), (20, 32), (10, 16), (5, 8)]
        assert model(torch.randn(2, 3, 96, 128)).shape == (2, 1000)
    assert {n for n in model.no_weight_decay() if n.endswith("rope.freqs")} == {
        n for n, _ in model.named_parameters() if n.endswith("rope.freqs")} != set()
    axial = timm.create_model("swin_rope_axial_tiny_patch4_window7_224", **SMALL)
    assert not any("relative_position" in n or "freqs" in n for n, _ in axial.named_parameters())
    biased = timm.create_model("swin_rope_axial_tiny_patch4_window7_224", use_rpb=True, **SMALL)
    assert sum("relative_position_bias_table" in n for n, _ in biased.named_parameters()) == 8


def test_timm_and_microsoft_swin_weights_fine_tune_with_rope_the_frequencies_new_and_reported(tmp_path) -> None:
    """timm's Swin state dict (and Microsoft's layout, the official code's plain Swin) into RoPE-Swin: every weight
    but RoPE's loads; the learned frequencies are listed as initialised, the bias tables dropped unless kept."""
    torch.manual_seed(0)
    timm_swin = timm.create_model("swin_tiny_patch4_window7_224", **SMALL)
    microsoft = official.SwinTransformer(**SMALL)
    for source in (timm_swin.state_dict(), {"model": microsoft.state_dict()}):
        model = RoPESwinTransformer(encoding="mixed", **SMALL)
        with pytest.warns(UserWarning, match="learned RoPE frequencies"):
            report = load_weights(model, source)
        assert set(report.initialised) == {ROPE_FREQS} and len(report.initialised[ROPE_FREQS]) == 8
        assert any("bias tables dropped" in note for note in report.converted)
        biased = RoPESwinTransformer(encoding="axial", use_rpb=True, **SMALL)
        assert load_weights(biased, source).initialised == {}  # axial: nothing learned is missing
        table = "layers.2.blocks.1.attn.relative_position_bias_table"
        torch.testing.assert_close(biased.state_dict()[table], source.get("model", source)[table])  # same key in both
    torch.save(timm_swin.state_dict(), tmp_path / "swin.pth")
    with pytest.raises(ValueError, match="load it into a swin_rope_"):
        load_weights(timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1), tmp_path / "swin.pth")


def test_create_from_checkpoint_names_an_official_file_by_its_widths_and_kind(tmp_path) -> None:
    """Either kind is named by the file (axial by its fixed frequencies' zeros); the mixed one is built and loaded."""
    torch.manual_seed(0)
    for kind in ("axial", "mixed"):
        theirs = official_swin(kind, num_classes=10, **SWIN_SIZES["tiny"]).eval()
        torch.save({"model": theirs.state_dict()}, tmp_path / f"{kind}.pth")
        assert describe(tmp_path / f"{kind}.pth") == (swin_name(kind, "tiny"), {"num_classes": 10})
    model = create_from_checkpoint(tmp_path / "mixed.pth").eval()
    assert model.pretrained_cfg["architecture"] == "swin_rope_mixed_tiny_patch4_window7_224"
    assert model.num_classes == 10 and model.load_report.initialised == {}
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(images), theirs(images), rtol=1e-4, atol=1e-5)


def test_compile_without_graph_breaks_and_gradient_checkpointing_give_eagers_gradients() -> None:
    """torch.compile traces the reference rotation (no graph break), gradient checkpointing recomputes the blocks:
    both give eager's logits and frequency gradients."""
    torch.manual_seed(0)
    # two stages (a patch merging between), the second with a plain and a shifted-window block
    model = timm.create_model("swin_rope_mixed_tiny_patch4_window7_224", embed_dim=32, depths=(1, 2), num_heads=(1, 2),
                              window_size=4, img_size=64, num_classes=3, drop_path_rate=0.0)
    images = torch.randn(2, 3, 64, 64)

    def step(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = module(images)
        logits.square().sum().backward()
        return logits.detach(), model.layers[1].blocks[1].attn.rope.freqs.grad.clone()

    expected = step(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # a graph break raises
    torch.testing.assert_close(step(compiled), expected, rtol=1e-4, atol=1e-6)
    model.set_grad_checkpointing(True)
    assert all(stage.grad_checkpointing for stage in model.layers)
    torch.testing.assert_close(step(model), expected, rtol=1e-5, atol=1e-7)


def test_onnx_export_serves_sizes_with_whole_and_padded_windows(tmp_path) -> None:
    """One export (dynamic batch, height, width) runs at the export size, at more windows and at sizes whose windows
    are padded (dynamic_img_size), like eager. One stage of a window block and a shifted one: the later stages repeat
    them. ``RoPESwinBlock`` counts windows by ceiling division, so torch.export traces this in seconds."""
    pytest.importorskip("onnxruntime")
    from vit_rope.eval.onnx import compare_onnx, export_onnx

    torch.manual_seed(0)
    model = timm.create_model("swin_rope_mixed_tiny_patch4_window7_224", embed_dim=32, depths=(2,), num_heads=(1,),
                              window_size=4, img_size=64, num_classes=3, drop_path_rate=0.0,
                              dynamic_img_size=True).eval()
    randomize_(model)  # logits of about 1, not timm's init's 0.03 (to which 1e-4 says little)
    export = export_onnx(model, tmp_path / "swin.onnx", img_size=(64, 64))
    assert set(export.diffs) == {(2, 64, 64), (3, 96, 64), (1, 64, 64)}
    diffs = compare_onnx(model, tmp_path / "swin.onnx", [(1, 72, 56), (1, 8, 8)])  # 18x14, 2x2 tokens: padded
    assert all(diff <= 1e-4 * max(1.0, largest) for diff, largest in diffs.values())
