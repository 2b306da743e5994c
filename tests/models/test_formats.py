"""Checkpoint formats (vit_rope.models.formats): each file of every source carries one format's marker and no other's,
so the order in which the markers are asked never matters; two markers in one file, or none and no ViT keys, are
errors naming what was found and the formats there are."""

import pytest
import timm
import torch

import vit_rope
from helpers.models import timm_eva
from vit_rope.models.formats import FORMATS, VIT, checkpoint_format
from vit_rope.models.hf_dinov3 import HF_FORMAT

EVA = "timm's Eva"


def claims(state_dict: dict) -> list[str]:
    return [fmt.name for fmt in FORMATS if fmt.carries(state_dict)]


def keys(*names: str) -> dict:
    """A state dict with these keys: the markers read keys only."""
    return dict.fromkeys(names, torch.zeros(1))


# Meta's DINOv3 (storage tokens, LayerScale as ls1.gamma, one masked qkv bias) and transformers' DINOv3ViTModel
META = ("cls_token", "storage_tokens", "mask_token", "patch_embed.proj.weight", "blocks.0.ls1.gamma",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.qkv.bias_mask", "rope_embed.periods")
HF = ("embeddings.cls_token", "embeddings.register_tokens", "embeddings.patch_embeddings.weight",
      "model.layer.0.layer_scale1.lambda1", "model.layer.0.attention.q_proj.weight", "model.layer.0.mlp.up_proj.weight")


def lookhere_file() -> dict:
    weights = timm.create_model("vit_rope_tiny_patch16_lookhere_224", depth=1, official=True).state_dict()
    return {"weights": weights, "config": {"head_directions": "halves"}}


@pytest.mark.parametrize(("source", "expected"), [
    (lambda: timm_eva("vit_small_patch16_dinov3", depth=1).state_dict(), EVA),  # gamma_1, no qkv bias
    (lambda: timm_eva("vit_small_patch16_dinov3_qkvb", depth=1).state_dict(), EVA),  # and q_bias / v_bias
    (lambda: timm.create_model("eva02_tiny_patch14_224", depth=1).state_dict(), EVA),  # q_bias, no LayerScale
    (lambda: timm.create_model("eva02_base_patch14_224", depth=1).state_dict(), EVA),  # q_proj / k_proj / v_proj
    (lambda: timm.create_model("vit_small_patch16_rope_mixed_224", depth=1).state_dict(), EVA),  # timm's RoPE-ViT port
    (lambda: keys(*META), "Meta's DINOv3"),
    (lambda: keys(*HF), HF_FORMAT),
    (lambda: keys("embeddings.patch_embeddings.projection.weight", "encoder.layer.0.output.dense.weight"),
     "Hugging Face transformers' ViT or DINOv2"),
    (lookhere_file, "LookHere's official file"),
    (lambda: timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1).state_dict(), VIT.name),  # our own
    (lambda: timm.create_model("deit3_small_patch16_224", depth=1).state_dict(), VIT.name),  # ls1.gamma
    (lambda: timm.create_model("vit_rope_small_patch16_dinov3", depth=1).state_dict(), VIT.name),  # a twin's own
], ids=["timm-dinov3", "timm-dinov3-qkvb", "eva02-q-bias", "eva02-q-proj", "timm-rope-port", "meta-dinov3",
        "hf-dinov3", "hf-vit", "lookhere", "vit-rope", "deit3", "vit-rope-dinov3"])
def test_each_format_is_recognised_by_its_marker_alone(source, expected):
    state_dict = source()
    assert claims(state_dict) == ([] if expected == VIT.name else [expected])
    assert checkpoint_format(state_dict).name == expected


def test_a_file_with_two_formats_markers_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"markers of 2 formats: Meta's DINOv3 \('storage_tokens'\); timm's Eva "
                                         r"\(keys ending in .*'.gamma_1'\)\. A file is in one format"):
        checkpoint_format(keys("storage_tokens", "blocks.0.gamma_1"))


def test_a_file_in_no_format_is_refused_naming_its_keys_and_the_formats(tmp_path):
    resnet = timm.create_model("resnet10t").state_dict()
    torch.save(resnet, tmp_path / "resnet.pth")
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    with pytest.raises(ValueError, match=r"no format vit_rope reads: its keys are conv1\.0\.weight, .*\(\d+ keys\)\. "
                                         r"The formats and their markers: LookHere's official file: top-level .*"
                                         r"Meta's DINOv3: 'storage_tokens'"):
        vit_rope.load_weights(model, tmp_path / "resnet.pth")
    with pytest.raises(ValueError, match="its keys are none"):
        checkpoint_format({})


def test_metas_dinov3_into_another_model_names_the_models_that_take_it():
    with pytest.raises(ValueError, match=r"Meta's DINOv3 \(it has storage_tokens\), which loads into the "
                                         r"vit_rope_\*_patch16_dinov3\* .*='axial'"):
        vit_rope.load_weights(timm.create_model("vit_rope_small_patch16_axial_224", depth=1), keys(*META))

