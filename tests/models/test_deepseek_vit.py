"""Twins of timm's DeepSeek ViTs (vit_rope_deepseek_vit_*): timm's tokens, aligner tokens and logits at a square and a
non-square size through from_timm, load_weights and create_from_checkpoint (safetensors written from timm's
state_dict, and a DeepSeek vision shard with language-model tensors); a NaFlex batch sample by sample against timm on
each image alone; dynamic_img_pad; the aligner's width by tag; bad inputs refused by name. Depth 2, width 128 (two
64-wide heads, DeepSeek's head width), random weights, 4x4 and 5x3 patch grids (the aligner pads both)."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.models import assert_maps_then_policy, assert_naflex_as_timm, encoder, randomize_, rel, twins
from vit_rope.eval.loading import create_from_checkpoint
from vit_rope.models.deepseek_vit import DEEPSEEK

SIZES = [(56, 56), (70, 42)]  # 4x4 and 5x3 patches: height != width shows row / column order, both pad to 3x3 cells
TOL = 1e-4
TINY = dict(depth=2, embed_dim=128, num_heads=2)


def timm_deepseek(name: str, **kwargs) -> torch.nn.Module:
    args = dict(TINY, **({} if name.endswith("_enc") else {"num_classes": 5}), **kwargs)
    if name != "deepseek_vit_412m":
        args.setdefault("out_features", 48)
    model = timm.create_model(name, **args)
    randomize_(model)
    return model.eval()


@torch.no_grad()
def assert_parity(theirs: torch.nn.Module, ours: torch.nn.Module, size: tuple[int, int]) -> list[float]:
    """Tokens before the aligner (timm's encoder ``forward_features``, NHWC), the aligner's tokens and the output."""
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    tokens = encoder(theirs).forward_features(x)  # [B, h, w, C]
    errors = [rel(tokens.flatten(1, 2), ours.forward_features(x))]
    if encoder(theirs).aligner is not None:
        merged = ours.patch_merger(tokens.flatten(1, 2), tokens.shape[1:3])[0]
        errors.append(rel(encoder(theirs).aligner(tokens), merged))
    errors.append(rel(theirs(x), ours(x)))
    assert max(errors) < TOL, (size, errors)
    return errors


def deepseek_shard(theirs: torch.nn.Module) -> dict[str, torch.Tensor]:
    """timm's ``_enc`` weights as DeepSeek's own shard names them (``vision.*``, ``aligner.w1``, the linear patch
    embedding ``[C, 3 p p]``), beside language-model tensors (whose ``norm`` / ``head`` collide with timm's names)."""
    shard = {"embed.weight": torch.randn(7, 4), "norm.weight": torch.randn(4), "head.weight": torch.randn(7, 4),
             "layers.0.attn.wq_a.weight": torch.randn(4, 4)}
    for key, value in theirs.state_dict().items():
        if key.startswith("aligner."):
            shard[key.replace(".fc", ".w")] = value
            continue
        if key == "patch_embed.proj.weight":
            value = value.flatten(1)
        for ours, theirs_name in ((".attn.qkv.", ".attn.wqkv."), (".attn.proj.", ".attn.wo."), (".mlp.fc", ".mlp.w")):
            key = key.replace(ours, theirs_name)
        shard["vision." + key] = value
    return shard


@pytest.mark.parametrize("name", list(DEEPSEEK))
def test_twin_equals_timm_through_from_timm_and_the_loader(name, tmp_path):
    theirs = timm_deepseek(name)
    twin, loaded = twins(theirs, name, tmp_path, "rotate-half", "DeepseekVisionTransformer")
    for size in SIZES:
        assert_parity(theirs, twin, size)
    assert_parity(theirs, loaded, SIZES[1])


def test_deepseek_shard_loads_as_timm_filter_reads_it(tmp_path):
    theirs = timm_deepseek("deepseek_vit_412m_enc")
    file = tmp_path / "model-00001-of-00048.safetensors"
    save_file(deepseek_shard(theirs), str(file))
    loaded = create_from_checkpoint(file).eval()
    assert loaded.default_cfg["architecture"] == "vit_rope_deepseek_vit_412m_enc"
    assert any("4 tensors outside the vision tower" in line for line in loaded.load_report.converted)
    assert_parity(theirs, loaded, SIZES[1])
    ours = timm.create_model("vit_rope_deepseek_vit_412m_align", **TINY, num_classes=5, aligner_out_features=48)
    with pytest.warns(UserWarning, match="classifier absent"):  # the shard's tower and aligner into a classifier
        report = vit_rope.load_weights(ours.eval(), file)
    assert report.initialised == {"classifier absent from the checkpoint": ("head.weight", "head.bias")}


@pytest.mark.parametrize("name", ["deepseek_vit_412m_align", "deepseek_vit_412m_enc"])
def test_naflex_batch_sample_by_sample_equals_timm_on_each_image(name):
    theirs = timm_deepseek(name)
    torch.manual_seed(1)
    grids = ((4, 6), (6, 2), (2, 2), (3, 3))  # aligner cells: 2x2, 2x1, 1x1 (padded), 1x1
    images = [torch.randn(3, 14 * h, 14 * w) for h, w in grids]
    out = assert_naflex_as_timm(theirs, vit_rope.from_timm(theirs), images, length=24, patch=14)
    assert name.endswith("_align") or out.shape[1] == 4  # the most aligner tokens of a sample (2x2)


def test_dynamic_img_pad_forward_intermediates_and_resolution_policy():
    theirs = timm_deepseek("deepseek_vit_412m_enc", dynamic_img_pad=True)
    twin = vit_rope.from_timm(theirs)
    x = torch.randn(1, 3, 60, 45)  # 5x4 patches after padding, 2x2 aligner cells
    with torch.no_grad():
        assert rel(theirs(x), twin(x)) < TOL and twin(x).shape == (1, 4, 48)
    assert_maps_then_policy(theirs, twin, x, (1, 128, 5, 4))  # interpolate: to the 39x39 grid of 546 px


def test_aligner_width_follows_the_pretrained_tag_as_timm():
    for tag, width in (("", 5120), (".deepseek_v4_flash_vision_exp", 4096)):
        ours = timm.create_model(f"vit_rope_deepseek_vit_412m_enc{tag}", depth=1, device="meta")
        theirs = timm.create_model(f"deepseek_vit_412m_enc{tag}", depth=1, device="meta")
        assert ours.patch_merger.fc2.out_features == theirs.aligner.fc2.out_features == width
        assert ours.patch_merger.fc1.in_features == 9 * 1024 and ours.blocks[0].mlp.fc1.out_features == 2 * 2816
    other = dict(depth=1, device="meta", pretrained_cfg=dict(tag="other"))  # a tag timm does not know: no silent width
    with pytest.raises(ValueError, match=r"'other', not one of timm's \(deepseek_v4_1_flash, deepseek_v4_flash_vision_"
                                         r"exp\): pass aligner_out_features"):
        timm.create_model("vit_rope_deepseek_vit_412m_align", **other)
    assert timm.create_model("vit_rope_deepseek_vit_412m", **other).patch_merger is None  # the classifier needs none


def test_refused_inputs_name_what_and_where():
    deepseek = timm_deepseek("deepseek_vit_412m_enc").state_dict()
    with pytest.raises(ValueError, match="DeepSeek ViT.*vit_rope_deepseek_vit_"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1, device="meta"), deepseek)
    qwen = timm.create_model("qwen3_vit_88m", depth=1, num_classes=5, device="meta").state_dict()
    with pytest.raises(ValueError, match="Qwen3-VL.*DeepSeek twin"):
        vit_rope.load_weights(timm.create_model("vit_rope_deepseek_vit_412m", depth=1, device="meta"), qwen)
    with pytest.raises(ValueError, match="rotate_half.*qk_layout='interleaved'"):
        vit_rope.load_weights(timm.create_model("vit_rope_deepseek_vit_412m_enc", **TINY, aligner_out_features=48,
                                                qk_layout="interleaved"), deepseek)
    with pytest.raises(ValueError, match="final_norm=False.*vit_rope_deepseek_vit_412m.*without final_norm"):
        vit_rope.from_timm(timm_deepseek("deepseek_vit_412m", final_norm=False))
    with pytest.raises(ValueError, match="global_pool=''.*global_pool='align', or take vit_rope_deepseek_vit_412m,"):
        vit_rope.from_timm(timm.create_model("deepseek_vit_412m_enc", **TINY, global_pool=""))
    with pytest.raises(ValueError, match=r"aligner_out_features \(timm's tags set it: .*'deepseek_v4_1_flash': 5120"):
        timm.create_model("vit_rope_deepseek_vit_412m_enc", depth=1, aligner_out_features=0, device="meta")
    with pytest.raises(ValueError, match="global_pool '', 'avg' or 'align'.*'map'"):
        timm.create_model("vit_rope_deepseek_vit_412m", depth=1, global_pool="map", device="meta")
