"""Twins of timm's Eva 2D-RoPE backbones: the same logits and features as timm's model, through load_weights (.pth and
.safetensors) and from_timm, at the native size and a non-square other one; wrong layouts differ; wrong families are
refused by name. Depth-2 random models, widths cut where the family's other block kinds survive it."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.models import randomize_, rel
from vit_rope.models.eva_families import FAMILIES, twin_name

# timm name, width overrides (both models), sizes (native first), an override of the twin that must change outputs
CASES = {
    "sbb_base": ("vit_base_patch16_rope_reg1_gap_256", dict(embed_dim=192, num_heads=3), [(256, 256), (224, 320)],
                 dict(qk_layout="eva_xy")),
    "sbb_betwixt_reg4": ("vit_betwixt_patch16_rope_reg4_gap_256", dict(embed_dim=192, num_heads=3),
                         [(256, 256), (224, 320)], dict(qk_layout="eva_xy")),
    "sbb_mediumd_no_qkv_bias": ("vit_mediumd_patch16_rope_reg1_gap_256", dict(embed_dim=128, num_heads=2),
                                [(256, 256), (192, 288)], dict(qk_layout="eva_xy")),
    "eva02_tiny_packed_swiglu": ("eva02_tiny_patch14_224", {}, [(224, 224), (168, 280)], dict(qk_layout="eva_xy")),
    "eva02_tiny_336_ref16": ("eva02_tiny_patch14_336", {}, [(336, 336), (196, 308)], dict(rope_ref_grid=(24, 24))),
    "eva02_clip_separate_qkv": ("eva02_base_patch16_clip_224", dict(embed_dim=192, num_heads=3),
                                [(224, 224), (160, 288)], dict(qk_layout="eva_xy")),
    "pe_core_tiny_attn_pool": ("vit_pe_core_tiny_patch16_384", {}, [(384, 384), (256, 384)],
                               dict(rope_grid_offset=0.0)),
    "pe_spatial_tiny_no_norm": ("vit_pe_spatial_tiny_patch16_512", {}, [(512, 512), (256, 320)],
                                dict(rope_grid_offset=0.0)),
    "pe_lang_layerscale": ("vit_pe_lang_large_patch14_448", dict(embed_dim=128, num_heads=2),
                           [(448, 448), (224, 168)], dict(qk_layout="eva_ij")),
    "pe_gigantic_no_class_token": ("vit_pe_core_gigantic_patch14_448", dict(embed_dim=128, num_heads=2),
                                   [(448, 448), (224, 168)], dict(rope_ref_grid=(16, 16))),
    "sapiens2_gqa_block": ("vit_base_patch16_sapiens2", dict(embed_dim=192, num_heads=6, num_kv_heads=(6, 3),
                                                              img_size=(128, 96)), [(128, 96), (96, 160)],
                           dict(qk_layout="eva_xy")),
    "lingbot_small": ("vit_small_patch16_lingbot", dict(embed_dim=128, num_heads=2), [(512, 512), (256, 384)],
                      dict(resolution_policy="extrapolate")),
    "dinov3_small": ("vit_small_patch16_dinov3", dict(embed_dim=128, num_heads=2), [(256, 256), (192, 288)],
                     dict(resolution_policy="extrapolate")),  # from_timm by timm's DINOv3 names, not a table's
}


def timm_model(name: str, widths: dict) -> torch.nn.Module:
    model = timm.create_model(name, depth=2, dynamic_img_size=True, **widths)
    randomize_(model)
    return model.eval()


@torch.no_grad()
def max_rel_diff(a: torch.nn.Module, b: torch.nn.Module, size: tuple[int, int]) -> tuple[float, float]:
    """Largest difference of forward_features and of the logits, relative to the largest value of timm's."""
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))  # one image: parity is per image
    fa, fb = a.forward_features(x), b.forward_features(x)
    return rel(fa, fb), rel(a.forward_head(fa), b.forward_head(fb))


def twin_for(name: str, widths: dict, eva: torch.nn.Module, **overrides) -> torch.nn.Module:
    return timm.create_model(twin_name(name), depth=2, num_classes=eva.num_classes, **widths, **overrides).eval()


@pytest.mark.parametrize("case", CASES)
def test_twin_equals_timm_through_load_weights_and_from_timm(case, tmp_path):
    name, widths, sizes, wrong = CASES[case]
    eva = timm_model(name, widths)
    state = eva.state_dict()
    torch.save(state, tmp_path / "w.pth")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    twins = {}
    for suffix in ("pth", "safetensors"):
        twins[suffix] = twin_for(name, widths, eva)
        report = vit_rope.load_weights(twins[suffix], tmp_path / f"w.{suffix}")
        assert not report.initialised, report.summary()
    twins["timm_pretrained"] = timm.create_model(  # timm's loader, through our checkpoint filter; timm's classes
        twin_name(name), pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "w.pth")), depth=2,
        **widths).eval()
    assert twins["timm_pretrained"].num_classes == eva.num_classes  # DINOv3's: none, pooled features out
    assert twins["timm_pretrained"].load_report.converted == twins["pth"].load_report.converted
    assert not twins["timm_pretrained"].load_report.initialised
    twins["from_timm"] = vit_rope.from_timm(eva)
    assert not twins["from_timm"].training
    for path, twin in twins.items():
        for size in sizes:
            feat, logits = max_rel_diff(eva, twin, size)
            assert feat < 1e-4 and logits < 1e-4, (path, size, feat, logits)
    if twins["pth"].qk_layout != "eva_xy":
        assert any("permuted" in line for line in twins["from_timm"].load_report.converted)
    twin = twin_for(name, widths, eva, **wrong)  # a wrong layout or offset: the same weights differ
    vit_rope.load_weights(twin, tmp_path / "w.pth")
    assert max_rel_diff(eva, twin, sizes[-1])[0] > 1e-3


@pytest.mark.parametrize("source, target, family, suggestion", [
    ("vit_betwixt_patch16_rope_reg4_gap_256", "vit_rope_small_patch16_dinov3", "SBB RoPE ViT",
     "vit_rope_betwixt_patch16_reg4_gap_256"),
    ("eva02_tiny_patch14_224", "vit_rope_pe_core_tiny_patch16_384", "EVA-02", "vit_rope_eva02_tiny_patch14_224"),
    ("vit_pe_spatial_tiny_patch16_512", "vit_rope_eva02_tiny_patch14_224", "Perception Encoder",
     "vit_rope_pe_spatial_tiny_patch16_512"),
    ("vit_small_patch16_dinov3", "vit_rope_medium_patch16_reg1_gap_256", "DINOv3", "dinov3"),
    ("vit_base_patch16_sapiens2", "vit_rope_small_patch16_dinov3", "Sapiens2", "vit_rope_base_patch16_sapiens2"),
])
def test_checkpoint_of_another_family_names_it_and_the_twin(source, target, family, suggestion):
    state = timm.create_model(source, device="meta").state_dict()  # keys and shapes: all the check reads
    model = timm.create_model(target, depth=1, embed_dim=64, num_heads=1)
    with pytest.raises(ValueError, match=rf"looks like a {family} backbone.*load it into .*{suggestion}"):
        vit_rope.convert_state_dict(state, model)


def test_from_timm_refuses_a_model_without_twin():
    with pytest.raises(ValueError, match=r"from_timm got resnet10t, which has no vit_rope twin. Supported: EVA-02"):
        vit_rope.from_timm(timm.create_model("resnet10t", device="meta"))
    port = timm.create_model("vit_small_patch16_rope_mixed_224", depth=1, device="meta")  # timm's RoPE-ViT port
    with pytest.raises(ValueError, match=r"no vit_rope twin.*load the port's weights with vit_rope.load_weights"):
        vit_rope.from_timm(port)


def test_twin_options_are_refused_where_they_mean_nothing():
    with pytest.raises(ValueError, match="offset=1.0 shifts integer patch positions"):
        vit_rope.RoPE2D(64, 1, kind="dinov3", grid_offset=1.0)
    with pytest.raises(ValueError, match="attn_pool_num_heads=8 .* only global_pool='map' has"):
        vit_rope.RoPEVisionTransformer(embed_dim=64, depth=1, num_heads=1, attn_pool_num_heads=8)
    with pytest.raises(ValueError, match="Unknown q/k layout 'cat'"):
        vit_rope.RoPEVisionTransformer(embed_dim=64, depth=1, num_heads=1, qk_layout="cat")
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        vit_rope.RoPEVisionTransformer(embed_dim=64, depth=1, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads has 2 entries for 1 blocks"):
        vit_rope.RoPEVisionTransformer(embed_dim=64, depth=1, num_heads=4, num_kv_heads=(2, 2))
    with pytest.raises(ValueError, match="Cayley-STRING .* grouped-query attention"):
        vit_rope.RoPEVisionTransformer(embed_dim=64, depth=1, num_heads=4, num_kv_heads=2, encoding="string")


def test_twins_name_a_smallest_input_of_whole_patches():
    """timm's model tests pick a small input from ``min_input_size``: it must be a multiple of the twin's patch."""
    for table in FAMILIES.values():
        for timm_name, args in table.items():
            smallest = timm.models.get_pretrained_cfg_value(twin_name(timm_name), "min_input_size")
            assert smallest[1] % args["patch_size"] == 0 and smallest[2] % args["patch_size"] == 0, timm_name
    twin = "vit_rope_eva02_tiny_patch14_224"
    assert timm.models.get_pretrained_cfg_value(twin, "min_input_size") == (3, 112, 112)
    model = timm.create_model(twin, depth=1, num_classes=5).eval()
    assert model(torch.randn(1, 3, 112, 112)).shape == (1, 5)


def test_sapiens2_twin_keeps_grouped_query_attention():
    name, widths, _, _ = CASES["sapiens2_gqa_block"]
    eva = timm_model(name, widths)
    twin = vit_rope.from_timm(eva)
    assert [blk.attn.num_kv_heads for blk in twin.blocks] == [6, 3]
    assert isinstance(twin.blocks[0].ls2, torch.nn.Identity)  # LayerScale on the attention branch only
    assert sum(p.numel() for p in twin.parameters()) == sum(p.numel() for p in eva.parameters())
