"""Our tools on the twins of timm's Eva backbones, one small twin per family with every block kind kept:
every resolution policy that applies at a non-native non-square size, ONNX at any size checked by ONNX Runtime,
forward_intermediates / features_only with prefix tokens apart, NaFlex batches equal to each image alone, and
vit_rope.evaluate / diagnose on a patch-14 twin and a register twin without class token. Parity with timm at the native
and another size (the default policy) is tests/models/test_eva_twins.py's."""

from __future__ import annotations

import json
import math
from itertools import combinations

import pytest
import timm
import torch

from helpers.models import onnx_sizes, randomize_
from helpers.naflex import images, pack
from vit_rope.encodings.base import image_positions
from vit_rope.eval import command
from vit_rope.eval.diagnostics import attention_entropy, frequency_coverage
from vit_rope.eval.diagnostics import main as diagnose
from vit_rope.layers.rotary import grid_positions, rope_angles

SMALL = dict(embed_dim=64, num_heads=2, num_classes=5)
FAMILIES = {  # family -> (smallest twin, width cuts): depth 2, every block kind of the family kept
    "eva02": ("vit_rope_eva02_tiny_patch14_224", dict(SMALL, img_size=56)),  # packed SwiGLU, APE with class row
    "pe_core": ("vit_rope_pe_core_tiny_patch16_384", dict(SMALL, img_size=64)),  # offset 1, attention pool
    "pe_spatial": ("vit_rope_pe_spatial_tiny_patch16_512", dict(SMALL, img_size=64)),  # offset 1, no final norm
    "sbb": ("vit_rope_betwixt_patch16_reg4_gap_256", dict(SMALL, img_size=64)),  # 4 registers, no class token
    "sapiens2": ("vit_rope_base_patch16_sapiens2", dict(SMALL, embed_dim=96, num_heads=6, num_kv_heads=(6, 3),
                                                        img_size=(64, 48))),  # GQA, 8 registers, DINOv3 RoPE
    "lingbot": ("vit_rope_small_patch16_lingbot", dict(SMALL, img_size=64)),  # DINOv3 RoPE, storage tokens
    "deepseek": ("vit_rope_deepseek_vit_412m", dict(SMALL, img_size=56)),  # RMSNorm, bias-free SwiGLU, RoPE only
}
PREFIX = {"eva02": 1, "pe_core": 1, "pe_spatial": 1, "sbb": 4, "sapiens2": 9, "lingbot": 5, "deepseek": 0}


def build(family: str, depth: int = 2, **overrides) -> torch.nn.Module:
    name, kwargs = FAMILIES[family]
    model = timm.create_model(name, depth=depth, **{**kwargs, **overrides})
    randomize_(model)
    return model.eval()


def patch_of(model: torch.nn.Module) -> int:
    return model.patch_embed.patch_size[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_policy_runs_at_a_non_native_non_square_size_and_changes_the_output(family):
    model = build(family)
    rope = model.pos_encoding[0]
    # wider than the grid the policies scale against, so that ntk and yarn (which only compress) act too
    grid = (3, rope.train_grid[1] + 2)
    patch = patch_of(model)
    x = torch.randn(1, 3, grid[0] * patch, grid[1] * patch, generator=torch.Generator().manual_seed(0))
    features = {}
    for policy in model.pos_encoding.policies:
        model.set_resolution_policy(policy)
        with torch.no_grad():
            features[policy] = model.forward_features(x)
        assert features[policy].shape == (1, PREFIX[family] + grid[0] * grid[1], model.embed_dim)
        assert features[policy].isfinite().all(), policy
    assert len(features) == (2 if rope.kind == "dinov3" else 5)
    for a, b in combinations(features, 2):
        assert (features[a] - features[b]).abs().max() > 1e-4, (a, b)  # each policy is applied


@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
def test_pe_offset_comes_before_the_policy_scaling_against_the_reference_grid(policy):
    """timm's Eva (build_rotary_pos_embed): positions t = arange(n) + grid_offset, then t * ref / n; ours must place
    PE's patches at (i + 1) * 24 / n under interpolate and at i + 1 under extrapolate, after set_resolution_policy
    too."""
    model = build("pe_core", depth=1)
    model.set_resolution_policy(policy)
    rope = model.pos_encoding[0]
    assert rope.train_grid == (24, 24) and rope.grid_offset == 1.0
    positions = image_positions(rope, 30, 20)
    cos, sin = rope(positions.coords, 1, positions.grids)
    scale = torch.tensor([24 / 20, 24 / 30]) if policy == "interpolate" else torch.ones(2)  # (x, y): ref / grid
    expected = rope_angles((grid_positions(30, 20) + 1) * scale, rope.pair_frequencies())
    torch.testing.assert_close(cos[:, 1:], expected.cos())
    torch.testing.assert_close(sin[:, 1:], expected.sin())
    assert (cos[:, 0] == 1).all() and (sin[:, 0] == 0).all()  # the class token stays unrotated


# one export per code path: pe_spatial's offset is pe_core's; lingbot is Sapiens2's DINOv3 RoPE beside registers (its
# storage tokens); the DeepSeek classifier's trunk is its encoder twin's (tests/models/test_deepseek_vit.py); SBB's
# registers are Sapiens2's, its prefix without class token the VLM towers' (none: their exports in
# tests/models/test_*_vit.py); Sapiens2's is the suite's export of DINOv3's RoPE
@pytest.mark.parametrize("family, kwargs", [("eva02", {}), ("pe_core", {}), ("sapiens2", dict(num_kv_heads=3))])
def test_twin_exports_to_onnx_with_dynamic_height_and_width(family, kwargs, tmp_path):
    """Packed SwiGLU and APE with a class row; RoPE offset, reference grid and attention pool; registers,
    grouped-query attention (3 key / value heads for 6), qkv bias and DINOv3's RoPE. The file serves its export's
    sizes and one wider than high (onnx_sizes' batch of one)."""
    model = build(family, depth=1, **kwargs)
    patch = patch_of(model)
    sizes = onnx_sizes(model, tmp_path / f"{family}.onnx", (4 * patch, 3 * patch))
    assert sizes == [(2, 4 * patch, 3 * patch), (3, 6 * patch, 3 * patch)]


@pytest.mark.parametrize("family", FAMILIES)
def test_intermediates_and_features_only_give_maps_of_the_grid_with_prefix_tokens_apart(family):
    model = build(family)
    name, kwargs = FAMILIES[family]
    patch, dim, P = patch_of(model), model.embed_dim, PREFIX[family]
    x = torch.randn(2, 3, 3 * patch, 5 * patch)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, return_prefix_tokens=True)
        assert final.shape == model.forward_features(x).shape == (2, P + 15, dim)
        inter = inter if P else [(s, s.new_zeros(2, 0, dim)) for s in inter]  # no prefix tokens: the maps alone
        assert [(s.shape, p.shape) for s, p in inter] == [((2, dim, 3, 5), (2, P, dim))] * 2
        tokens = model.forward_intermediates(x, indices=[1], output_fmt="NLC", intermediates_only=True)
        torch.testing.assert_close(tokens[0], inter[1][0].flatten(2).transpose(1, 2))
        features = timm.create_model(name, features_only=True, out_indices=(0, 1), depth=2, **kwargs).eval()
        assert [f.shape for f in features(x)] == [(2, dim, 3, 5)] * 2
        model.reset_classifier(7)
        assert model(x).shape == (2, 7)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_sample_of_a_mixed_aspect_naflex_batch_equals_its_image_alone(family):
    model = build(family)
    patch = patch_of(model)
    inputs = images(patch=patch)
    batch = pack(inputs, patch=patch)
    P = model.num_prefix_tokens
    with torch.no_grad():
        logits, tokens = model(batch), model.forward_features(batch)
        for b, image in enumerate(inputs):
            n = int(batch["patch_valid"][b].sum())
            torch.testing.assert_close(tokens[b, :P + n], model.forward_features(image[None])[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(logits[b], model(image[None])[0], rtol=1e-4, atol=1e-4)
    assert logits.abs().max() > 0.1


@pytest.mark.parametrize("family", FAMILIES)
def test_diagnostics_of_every_family(family):
    """Entropy through each block's own projection (grouped-query attention repeats its kv heads), bounded by the
    uniform attention over all tokens, prefix tokens included; coverage against the grid the policy scales on."""
    model = build(family)
    patch = patch_of(model)
    entropy = attention_entropy(model, torch.randn(2, 3, 3 * patch, 5 * patch))
    assert len(entropy) == 2 and all(0 < e <= math.log(PREFIX[family] + 15) + 1e-5 for e in entropy)
    rope = model.pos_encoding[0]
    at_reference = frequency_coverage(model, rope.train_grid)
    assert len(at_reference) == 1 and at_reference[0]["unseen"] == 0 < at_reference[0]["pairs"]


TOOL_CASES = {  # twin, width cuts, sizes that tile, a size that does not, the nearest that do, the twin's own policy;
    # Pixtral's and DeepSeek's classifiers (no projector) reach the tools as eva02's and sbb's twins do
    "eva02": ("vit_rope_eva02_tiny_patch14_224", dict(depth=1, embed_dim=64, num_heads=2, img_size=56), ["56", "84"],
              "64", "56 or 70", "interpolate"),
    "sbb": ("vit_rope_betwixt_patch16_reg4_gap_256", dict(depth=1, embed_dim=64, num_heads=2, img_size=64),
            ["64", "96"], "56", "48 or 64", "interpolate"),
    "qwen3": ("vit_rope_qwen3_vit_88m", dict(depth=1, embed_dim=64, num_heads=2, img_size=64), ["64", "96"], "56",
              "48 or 64", "extrapolate"),  # Qwen3-VL's RoPE counts patches as they are
    "gemma4": ("vit_rope_gemma4_vit_167m", dict(depth=1, embed_dim=64, num_heads=2, img_size=96), ["96", "144"],
               "100", "96 or 112", "extrapolate"),
    "qwen2_5_vl": ("vit_rope_qwen2_5_vl_vit", dict(depth=1, embed_dim=64, num_heads=2, img_size=112, window_size=56,
                                                   fullatt_block_indexes=[]), ["112", "168"], "120", "112 or 126",
                   "extrapolate"),  # a windowed block; with classes, the mean of the merger's tokens into a head
}


@pytest.fixture(params=TOOL_CASES)
def weights(request, tmp_path):
    """A family's twin and a local weights file of it (3 classes, as the generated ImageFolder)."""
    name, kwargs, *_ = TOOL_CASES[request.param]
    model = timm.create_model(name, num_classes=3, **kwargs)
    randomize_(model)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    return request.param, tmp_path / "w.pth"


def test_evaluate_and_diagnose_run_on_twins_under_two_policies(weights, image_root, tmp_path, capsys):
    family, path = weights
    name, kwargs, sizes, bad, near, own_policy = TOOL_CASES[family]
    source = ["--model", name, "--pretrained-file", str(path), "--model-kwargs", *(f"{k}={v}" for k, v in
                                                                                     kwargs.items())]
    common = ["--device", "cpu", "--workers", "0", "--batch-size", "8", "--data-dir", str(image_root)]
    out = tmp_path / "eval"
    assert command.main([*source, *common, "--img-sizes", *sizes, "--seq-lens", "20", "--policy", "extrapolate",
                         "interpolate", "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    policies = ("extrapolate", "interpolate")
    assert {(r["policy"], r["img_size"], r["seq_len"]) for r in results} == {
        *((p, int(s), None) for p in policies for s in sizes), *((p, None, 20) for p in policies)}
    assert all(r["images"] == 12 and 0 <= r["top1"] <= r["top5"] <= 100 and r["loss"] > 0 for r in results)
    loss = {(r["policy"], r["img_size"]): r["loss"] for r in results}
    assert loss["extrapolate", int(sizes[1])] != pytest.approx(loss["interpolate", int(sizes[1])], rel=1e-6)
    # without --policy, the twin's own (its source's), labelled so
    assert command.main([*source, *common, "--img-sizes", sizes[1], "--output", str(tmp_path / "own")]) == 0
    [own] = json.loads((tmp_path / "own" / "results.json").read_text())["results"]
    assert own["policy"] == own_policy and own["loss"] == pytest.approx(loss[own_policy, int(sizes[1])])
    assert command.main([*source, *common, "--img-sizes", bad, "--output", str(tmp_path / "bad")]) == 2
    assert f"size {bad} is not a positive multiple of the patch size" in capsys.readouterr().err
    for policy in ("extrapolate", "interpolate"):
        assert diagnose([*source, "--sizes", *sizes, "--seq-lens", "20", "--num-images", "2", "--policy", policy,
                         "--data-dir", str(image_root), "--output", str(tmp_path / policy)]) == 0
        report = json.loads((tmp_path / policy / "diagnostics.json").read_text())
        assert report["policy"] == policy and set(report["sizes"]) == set(sizes) and set(report["seq_lens"]) == {"20"}
        measured = [report["sizes"][size] for size in sizes] + [report["seq_lens"]["20"]]
        assert all(row["pairs"] > 0 and len(row["entropy"]) == 1 and row["entropy"][0] > 0 for row in measured)
    capsys.readouterr()
    assert diagnose([*source, "--sizes", bad, "--output", str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err.endswith(f"use {near}\n")
