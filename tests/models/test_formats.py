"""Checkpoint formats (vit_rope.models.formats): each file of every source carries one format's marker and no other's,
so the order in which the markers are asked never matters; two markers in one file, or none and no ViT keys, are
errors naming what was found and the formats there are."""

from functools import partial

import pytest
import timm
import torch

import vit_rope
from helpers.models import timm_eva
from vit_rope.models import pixtral
from vit_rope.models.formats import FORMATS, VIT, checkpoint_format, describe, folder_format, model_args
from vit_rope.models.hf_dinov3 import HF_FORMAT
from vit_rope.models.qwen2_5_vl import SOURCE as QWEN25_SOURCE

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
    (lambda: {"weights": timm.create_model("vit_rope_tiny_patch16_lookhere_224", depth=1, head_hidden_dim=768)
              .state_dict(), "config": {"head_directions": "halves"}}, "LookHere's official file"),
    (lambda: timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1).state_dict(), VIT.name),  # our own
    (lambda: timm.create_model("deit3_small_patch16_224", depth=1).state_dict(), VIT.name),  # ls1.gamma
    (lambda: timm.create_model("vit_rope_small_patch16_dinov3", depth=1).state_dict(), VIT.name),  # a twin's own
    (lambda: timm.create_model("gemma4_vit_167m", depth=1, device="meta").state_dict(),
     "timm's Gemma 4 ViT (timm.models.gemma4_vit)"),  # its q_proj.linear is no Eva q_proj
    (lambda: keys("patch_embedder.position_embedding_table", "encoder.layers.0.self_attn.q_proj.linear.weight"),
     "Hugging Face transformers' Gemma4VisionModel"),
    (lambda: timm.create_model("vit_rope_gemma4_vit_167m", depth=1, device="meta").state_dict(), VIT.name),
], ids=["timm-dinov3", "timm-dinov3-qkvb", "eva02-q-bias", "eva02-q-proj", "timm-rope-port", "meta-dinov3",
        "hf-dinov3", "hf-vit", "lookhere", "vit-rope", "deit3", "vit-rope-dinov3", "timm-gemma4", "hf-gemma4",
        "vit-rope-gemma4"])
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


def test_every_format_converts_describes_and_loads_through_one_table(tmp_path):
    """One record per format, file or folder: unique names, one converter signature (a state dict and notes), and the
    model a file describes said by its format (here LookHere's: its width names the registered model, its config and
    official ViT the arguments), so that ``create_from_checkpoint`` and the harness need no branch per format."""
    assert len({fmt.name for fmt in (*FORMATS, VIT)}) == len(FORMATS) + 1
    assert {fmt.name for fmt in FORMATS if fmt.folder is not None} == {HF_FORMAT, "PaPE's official ImageClassifier",
                                                                       pixtral.SOURCE, QWEN25_SOURCE,
                                                                       "Hugging Face transformers' Gemma4VisionModel"}
    reference = timm.create_model("vit_rope_tiny_patch16_lookhere_224", depth=2, head_hidden_dim=768, num_classes=4,
                                  norm_layer=partial(torch.nn.LayerNorm, eps=1e-5)).eval()  # the official ViT's
    obj = {"weights": reference.state_dict(), "config": {**reference.pos_encoding.config}}
    path = tmp_path / "lh.pth"
    torch.save(obj, path)
    name, args = describe(path)
    assert name == "vit_rope_tiny_patch16_lookhere_224"
    assert (args["depth"], args["embed_dim"], args["head_hidden_dim"], args["num_classes"]) == (2, 192, 768, 4)
    assert args["encoding_options"] == {"config": obj["config"]} and model_args(path)["init_values"] == 1e-4
    converted, notes = checkpoint_format(obj).convert(obj, reference)
    assert converted.keys() == reference.state_dict().keys() and notes
    built = vit_rope.create_from_checkpoint(path).eval()
    assert not built.load_report.initialised
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(built(x), reference(x), rtol=0, atol=0)
    plain = tmp_path / "plain.pth"
    torch.save(reference.state_dict(), plain)
    assert model_args(plain) == {} and describe(plain) == (None, {"depth": 2})


def test_a_folder_is_found_by_its_config_and_two_configs_are_refused(tmp_path):
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    folder = tmp_path / "both"
    folder.mkdir()
    assert folder_format(folder) is None
    (folder / "config.json").write_text('{"model_type": "dinov3_vit", "positional": "pape", "pape": {}}')
    with pytest.raises(ValueError, match=r"holds the config of 2 formats"):
        folder_format(folder)
    with pytest.raises(FileNotFoundError, match=r"No weights file in .*with model.pt or model.safetensors and its"):
        vit_rope.load_weights(model, folder)
