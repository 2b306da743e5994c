"""``vit_rope.create_from_checkpoint``: the model each format describes, built and loaded, giving the source model's
outputs; files whose keys name no model need ``model=``, and say so."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.checkpoints import meta_keys
from helpers.evaluation import write_checkpoint
from helpers.models import assert_same_outputs, timm_eva
from vit_rope.eval.loading import load_trained


def test_a_train_checkpoint_is_rebuilt_as_trained(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "best.pth")
    model = vit_rope.create_from_checkpoint(path)
    expected = load_trained(path).model
    assert model.encoding_kind == "mixed" and len(model.blocks) == 2 and model.num_classes == 3
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    with pytest.raises(ValueError, match=r"train.py checkpoint.*\['num_classes'\] do not apply"):
        vit_rope.create_from_checkpoint(path, num_classes=5)


@pytest.mark.parametrize(("timm_name", "ours"), [
    ("vit_small_patch16_rope_mixed_224", "vit_rope_small_patch16_mixed_224"),
    ("vit_small_patch16_rope_mixed_ape_224", "vit_rope_small_patch16_mixed_ape_224"),
    ("vit_small_patch16_rope_ape_224", "vit_rope_small_patch16_axial_ape_224"),
])
def test_timms_rope_vit_ports_name_their_model(tmp_path: Path, timm_name: str, ours: str) -> None:
    theirs = timm_eva(timm_name, depth=2, num_classes=4)
    path = tmp_path / "port.safetensors"
    save_file(theirs.state_dict(), str(path))
    model = vit_rope.create_from_checkpoint(path).eval()
    assert model.default_cfg["architecture"] == ours and len(model.blocks) == 2 and model.num_classes == 4
    assert_same_outputs(model, theirs, [(224, 224)])


@pytest.mark.parametrize("meta", [False, True], ids=["timm", "meta"])
@pytest.mark.parametrize("timm_name", ["vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3_qkvb"])
def test_timms_and_metas_dinov3_name_their_model(tmp_path: Path, timm_name: str, meta: bool) -> None:
    theirs = timm_eva(timm_name, depth=2)
    path = tmp_path / "dinov3.pth"
    torch.save(meta_keys(theirs.state_dict()) if meta else theirs.state_dict(), path)
    model = vit_rope.create_from_checkpoint(path).eval()
    assert model.default_cfg["architecture"] == timm_name.replace("vit_", "vit_rope_", 1)
    assert_same_outputs(model, theirs, [(256, 256)])


def test_keys_that_name_no_model_need_it_named(tmp_path: Path) -> None:
    deit = timm.create_model("deit3_small_patch16_224", depth=2, num_classes=3)
    path = tmp_path / "deit.pth"
    torch.save(deit.state_dict(), path)
    with pytest.raises(ValueError, match="do not say which model it is.*pass model="):
        vit_rope.create_from_checkpoint(path)
    model = vit_rope.create_from_checkpoint(path, model="vit_rope_small_patch16_axial_ape_224")
    assert len(model.blocks) == 2 and torch.equal(model.blocks[1].attn.qkv.weight, deit.blocks[1].attn.qkv.weight)
    with pytest.raises(FileNotFoundError, match="No checkpoint at"):
        vit_rope.create_from_checkpoint(tmp_path / "missing.pth")


def test_a_transformers_dinov3_folder_gives_transformers_outputs(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.DINOv3ViTConfig(hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                                          intermediate_size=1536, num_register_tokens=4)  # as DINOv3's own
    torch.manual_seed(0)
    hf = transformers.DINOv3ViTModel(config).eval()
    with torch.no_grad():  # LayerScale and biases off their initial values, so that every weight shows
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    hf.save_pretrained(tmp_path / "hf")
    model = vit_rope.create_from_checkpoint(tmp_path / "hf").eval()
    assert model.encoding_kind == "dinov3" and len(model.blocks) == 2
    named = vit_rope.create_from_checkpoint(tmp_path / "hf", model=model.default_cfg["architecture"], depth=2).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.inference_mode():
        expected = hf(pixel_values=x).last_hidden_state
        for built in (model, named):
            torch.testing.assert_close(built.forward_features(x), expected, atol=1e-4, rtol=1e-4)
