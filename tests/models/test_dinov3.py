"""DINOv3 backbones (vit_rope.models.dinov3): every registered size loads timm's Eva weights (and Meta's key names) and
gives timm's features and logits (the smallest at 224 and two other sizes, one of them non-square; the others at the
non-square one). Models are randomly initialised (no download), with LayerScale at 1 and random biases and tokens so
that every weight moves the output; timm's own loader and from_timm: tests/models/test_eva_twins.py's DINOv3 case."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.checkpoints import meta_keys
from helpers.models import assert_same_outputs, timm_eva
from vit_rope.eval import command, diagnostics
from vit_rope.models.checkpoint import WeightsNotLoadedWarning, convert_state_dict
from vit_rope.models.registry import dinov3_name

SIZES = [(224, 224), (256, 192), (320, 320)]
ARCHS = [("small", False), ("small_plus", True), ("base", True), ("large", False)]


def timm_dinov3(size: str, qkv_bias: bool, **kwargs) -> torch.nn.Module:
    return timm_eva(dinov3_name(size, qkv_bias).replace("vit_rope_", "vit_"), **kwargs)


@pytest.mark.parametrize(("size", "qkv_bias"), ARCHS)
def test_logits_and_features_match_timm_from_timm_and_meta_files(size, qkv_bias, tmp_path):
    depth = 12 if size == "small" else 2  # every width, head count and MLP at full size; depth 2 for speed
    theirs = timm_dinov3(size, qkv_bias, depth=depth, num_classes=5)
    save_file(theirs.state_dict(), tmp_path / "timm.safetensors")
    torch.save(meta_keys(theirs.state_dict()), tmp_path / "meta.pth")
    loaded = []
    for path in (tmp_path / "timm.safetensors", tmp_path / "meta.pth"):
        ours = timm.create_model(dinov3_name(size, qkv_bias), depth=depth, num_classes=5, init_values=1.0).eval()
        report = vit_rope.load_weights(ours, path)
        assert not report.initialised and set(report.loaded) == set(ours.state_dict())
        loaded.append(ours.state_dict())
    # from Meta's keys; timm's file gave the very same weights:
    assert_same_outputs(ours, theirs, SIZES if size == "small" else SIZES[1:2])
    assert all(torch.equal(loaded[0][key], value) for key, value in loaded[1].items())


def test_a_checkpoint_of_another_dinov3_size_is_refused_naming_the_keys():
    theirs = timm_dinov3("small", False, depth=2)
    with pytest.raises(ValueError, match=r"does not fit RoPEVisionTransformer: .*reg_token"):
        convert_state_dict(theirs.state_dict(), timm.create_model("vit_rope_base_patch16_dinov3", depth=2))


def test_default_policy_is_dinov3s_and_the_others_are_refused():
    model = timm.create_model("vit_rope_small_patch16_dinov3", depth=1)
    assert model.resolution_policy.name == "normalized"
    model.set_resolution_policy("extrapolate")
    with pytest.raises(ValueError, match="does not apply to DINOv3"):
        model.set_resolution_policy("yarn")


def test_missing_layerscale_is_reported_and_warned():
    model = timm.create_model("vit_rope_small_patch16_dinov3", depth=1, num_classes=0)
    state = timm_dinov3("small", False, depth=1, num_classes=0).state_dict()
    with pytest.warns(WeightsNotLoadedWarning, match="LayerScale"):
        out = convert_state_dict({k: v for k, v in state.items() if "gamma" not in k}, model)
    assert torch.equal(out["blocks.0.ls1.gamma"], torch.ones(384))


def test_evaluate_and_diagnose_a_dinov3_model_from_timms_weights(image_root, tmp_path, capsys):
    """Weights in timm's Eva layout, evaluated under both DINOv3 policies and diagnosed, end to end on tiny data."""
    theirs = timm_dinov3("small", True, depth=1, num_classes=3, embed_dim=192, num_heads=3)
    torch.save(theirs.state_dict(), tmp_path / "eva.pth")
    model = ["--model", "vit_rope_small_patch16_dinov3_qkvb", "--pretrained-file", str(tmp_path / "eva.pth"),
             "--model-kwargs", "depth=1", "num_classes=3", "embed_dim=192", "num_heads=3"]
    assert command.main([*model, "--data-dir", str(image_root), "--img-sizes", "32", "48", "--policy", "normalized",
                          "extrapolate", "--output", str(tmp_path / "eval"), "--device", "cpu", "--workers", "0"]) == 0
    rows = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert {(row["policy"], row["img_size"]) for row in rows} == {(p, s) for p in ("normalized", "extrapolate")
                                                                   for s in (32, 48)}
    assert command.main([*model, "--data-dir", str(image_root), "--img-sizes", "32", "--policy", "yarn", "--output",
                          str(tmp_path / "eval2"), "--device", "cpu", "--workers", "0"]) == 2
    assert "does not apply to DINOv3" in capsys.readouterr().err
    assert diagnostics.main([*model, "--data-dir", str(image_root), "--sizes", "32", "64", "--num-images", "2",
                          "--output", str(tmp_path / "diag")]) == 0
    report = json.loads((tmp_path / "diag" / "diagnostics.json").read_text())
    assert report["kind"] == "dinov3" and report["policy"] == "normalized"
    coverage = report["sizes"]["64"]["coverage"][0]
    # normalised coordinates span less than 2 at every size, so no pair turns further than on the training grid
    assert coverage["unseen"] == 0
