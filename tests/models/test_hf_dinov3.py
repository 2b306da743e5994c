"""DINOv3 in Hugging Face transformers' format (vit_rope.models.hf_dinov3), without transformers: a timm Eva DINOv3
(random, depth 2) is written out under HF's documented names (``DINOv3ViTModel``: separate q/k/v projections,
``layer_scale{1,2}.lambda1``, ``gate/up/down_proj``) with a ``config.json``, loaded into our model, and must give timm's
features and pooled output (HF's pooler: the class token) at the native size and a non-square one. The mapping below is
written from HF's names, independently of the library's; one test also holds them to ``transformers.DINOv3ViTModel``
built from the same files (transformers is in the test extras)."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope
from helpers.models import assert_same_outputs, timm_eva
from vit_rope.models.checkpoint import convert_state_dict
from vit_rope.models.hf_dinov3 import HF_FORMAT, dinov3_args_from_hf_config

SIZES = [(224, 224), (192, 288)]
# timm Eva name -> HF DINOv3ViTModel name, inside a block
HF_BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn.proj": "attention.o_proj", "gamma_1": "layer_scale1.lambda1",
            "gamma_2": "layer_scale2.lambda1", "mlp.fc1_g": "mlp.gate_proj", "mlp.fc1_x": "mlp.up_proj",
            "mlp.fc1": "mlp.up_proj", "mlp.fc2": "mlp.down_proj"}


def timm_dinov3(name: str, key_bias: bool = False) -> torch.nn.Module:
    """timm's Eva at depth 2 reading the class token as HF's pooler; with ``key_bias``, timm's zero key-bias buffer
    made random, as an HF config with ``key_bias: true`` trains one."""
    model = timm_eva(name, depth=2, global_pool="token", num_classes=0)
    if key_bias:
        for block in model.blocks:
            block.attn.k_bias.normal_(0, 1.0)  # large enough to move the scores of rotated keys
    return model


def hf_state_dict(model: torch.nn.Module, prefix: str = "model.layer.") -> dict[str, torch.Tensor]:
    """``model``'s weights as ``DINOv3ViTModel`` names them (``prefix``: transformers 5's ``model.layer.`` or 4.x's
    ``layer.``); q, k and v biases only where the model has them."""
    state = model.state_dict()
    out = {"embeddings.cls_token": state["cls_token"], "embeddings.register_tokens": state["reg_token"],
           "embeddings.mask_token": torch.zeros_like(state["cls_token"]),
           "embeddings.patch_embeddings.weight": state["patch_embed.proj.weight"],
           "embeddings.patch_embeddings.bias": state["patch_embed.proj.bias"],
           "norm.weight": state["norm.weight"], "norm.bias": state["norm.bias"]}
    for i, block in enumerate(model.blocks):
        hf = f"{prefix}{i}."
        for key, value in block.state_dict().items():
            module, _, kind = key.rpartition(".")
            if key.startswith("gamma_"):
                out[hf + HF_BLOCK[key]] = value
            elif module in HF_BLOCK:
                out[f"{hf}{HF_BLOCK[module]}.{kind}"] = value
        for name, weight in zip("qkv", block.attn.qkv.weight.detach().chunk(3), strict=True):
            out[f"{hf}attention.{name}_proj.weight"] = weight
        for name in "qkv":
            bias = getattr(block.attn, f"{name}_bias")
            if bias is not None and (name != "k" or bias.abs().sum() > 0):
                out[f"{hf}attention.{name}_proj.bias"] = bias.detach().clone()
    return out


def hf_config(model: torch.nn.Module, **extra) -> dict:
    """The ``config.json`` transformers writes for ``model``, leaving out some values equal to its defaults."""
    block = model.blocks[0]
    gated = hasattr(block.mlp, "fc1_g")
    return {"architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit", "hidden_size": model.embed_dim,
            "intermediate_size": block.mlp.fc2.in_features, "num_hidden_layers": len(model.blocks),
            "num_attention_heads": block.attn.num_heads, "hidden_act": "silu" if gated else "gelu",
            "use_gated_mlp": gated, "num_register_tokens": 4, "layerscale_value": 1.0, "rope_theta": 100.0,
            "image_size": 224, "patch_size": 16, "query_bias": block.attn.q_bias is not None,
            "value_bias": block.attn.v_bias is not None, "pos_embed_rescale": 2.0, **extra}


def write_hf(folder, model: torch.nn.Module, prefix: str = "model.layer.", **extra):
    folder.mkdir(exist_ok=True)
    save_file(hf_state_dict(model, prefix), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(hf_config(model, **extra)))
    return folder


@pytest.mark.parametrize(("timm_name", "ours_name", "prefix", "key_bias"), [
    ("vit_small_patch16_dinov3_qkvb", "vit_rope_small_patch16_dinov3_qkvb", "model.layer.", False),
    ("vit_small_plus_patch16_dinov3", "vit_rope_small_plus_patch16_dinov3", "layer.", False),  # SwiGLU, 4.x keys
    ("vit_small_patch16_dinov3_qkvb", "vit_rope_small_patch16_dinov3_qkvb", "model.layer.", True),
])
def test_hf_folder_and_file_load_with_timms_features(timm_name, ours_name, prefix, key_bias, tmp_path):
    """Into our model of the same name (the folder, its weights file), and into the one the folder's config builds:
    class-token pooling, no classifier, HF's training-time coordinate augmentation."""
    theirs = timm_dinov3(timm_name, key_bias)
    folder = write_hf(tmp_path / "hf", theirs, prefix, **({"key_bias": True} if key_bias else {}))
    assert dinov3_args_from_hf_config(hf_config(theirs))[0] == ours_name
    built = vit_rope.create_from_checkpoint(folder)
    assert built.global_pool == "token" and built.num_classes == 0 and len(built.blocks) == 2
    assert built.coord_aug.rescale == 2.0 and not built.coord_aug.per_image
    for path in (folder, folder / "model.safetensors", None):
        ours = built if path is None else timm.create_model(ours_name, depth=2, global_pool="token", num_classes=0)
        report = ours.load_report if path is None else vit_rope.load_weights(ours, path)
        assert report.converted[0].startswith(HF_FORMAT) and not report.initialised and not report.skipped
        assert_same_outputs(ours.eval(), theirs, SIZES)
    if key_bias:  # the control: without its key bias, timm's model is another one
        for block in theirs.blocks:
            block.attn.k_bias.zero_()
        x = torch.randn(1, 3, 192, 288)
        with torch.inference_mode():
            assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() > 1e-3  # tolerance 1e-4


def test_the_training_grid_is_dinov3s_256_px_not_the_configs_image_size(tmp_path):
    """Every DINOv3 config.json says image_size 224, transformers' default, which no forward reads; DINOv3 pretrained
    at 256 px (Meta's train configs: global_crops_size 256). Under `extrapolate`, positions are DINOv3's own (its
    coordinates normalised by the input grid: the `normalized` policy) at 256 px, 16 patches, not at 224 px."""
    folder = write_hf(tmp_path / "hf", timm_dinov3("vit_small_patch16_dinov3_qkvb"))
    assert json.loads((folder / "config.json").read_text())["image_size"] == 224
    ours = vit_rope.create_from_checkpoint(folder).eval()
    assert ours.patch_embed.img_size == (256, 256)

    def features(size: int, policy: str) -> torch.Tensor:
        ours.set_resolution_policy(policy)
        with torch.inference_mode():
            return ours.forward_features(torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0)))

    torch.testing.assert_close(features(256, "extrapolate"), features(256, "normalized"), atol=1e-5, rtol=1e-5)
    assert (features(224, "extrapolate") - features(224, "normalized")).abs().max() > 1e-3  # 14 patches: 2/16 apart


def test_against_transformers_dinov3_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    theirs = timm_dinov3("vit_small_patch16_dinov3_qkvb")
    folder = write_hf(tmp_path / "hf", theirs)
    config = {k: v for k, v in hf_config(theirs).items() if k not in ("architectures", "model_type")}
    hf = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**config)).eval()
    hf.load_state_dict(hf_state_dict(theirs))
    ours = vit_rope.create_from_checkpoint(folder).eval()
    with torch.inference_mode():
        for height, width in SIZES:
            x = torch.randn(2, 3, height, width)
            out = hf(pixel_values=x)
            torch.testing.assert_close(ours.forward_features(x), out.last_hidden_state, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours(x), out.pooler_output, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("model_name", "extra", "message"), [
    ("vit_rope_small_patch16_dinov3", {}, r"qkv bias\) is True in the file, False in the model\. Build "
                                          r"vit_rope_small_patch16_dinov3_qkvb with depth=2"),
    ("vit_rope_small_patch16_dinov3_qkvb", {"rope_theta": 1000.0}, r"rope_theta is 1000\.0 in the file, 100\.0"),
    ("vit_rope_small_patch16_dinov3_qkvb", {"num_register_tokens": 0}, r"num_register_tokens is 0 in the file, 4"),
    ("vit_rope_small_patch16_axial_224", {}, r"load into vit_rope_small_patch16_dinov3_qkvb with depth=2; this model "
                                             r"has encoding='axial'"),
])
def test_a_config_that_does_not_fit_the_model_is_refused_naming_the_field(model_name, extra, message, tmp_path):
    folder = write_hf(tmp_path / "hf", timm_dinov3("vit_small_patch16_dinov3_qkvb"), **extra)
    with pytest.raises(ValueError, match=message):
        vit_rope.load_weights(timm.create_model(model_name, depth=2), folder)


def test_other_transformers_models_are_refused_naming_what_they_look_like(tmp_path):
    folder = write_hf(tmp_path / "hf", timm_dinov3("vit_small_patch16_dinov3_qkvb"), model_type="dinov2")
    model = timm.create_model("vit_rope_small_patch16_dinov3_qkvb", depth=2)
    with pytest.raises(ValueError, match=r"model_type 'dinov2', DINOv2 .*: vit_rope loads transformers' DINOv3 ViTs "
                                         r"\(model_type 'dinov3_vit'\) only"):
        vit_rope.load_weights(model, folder)
    vit_keys = {"embeddings.patch_embeddings.projection.weight": torch.zeros(384, 3, 16, 16)}  # HF ViT / DINOv2
    with pytest.raises(ValueError, match="looks like Hugging Face transformers' ViT or DINOv2"):
        convert_state_dict(vit_keys, model)
    with pytest.raises(ValueError, match=r"\(1280, 20, True\), which no vit_rope DINOv3 model has"):
        dinov3_args_from_hf_config({"model_type": "dinov3_vit", "hidden_size": 1280, "num_attention_heads": 20,
                                    "intermediate_size": 5120, "use_gated_mlp": True, "hidden_act": "silu"})


def test_missing_config_or_weights_in_a_folder(tmp_path):
    theirs = timm_dinov3("vit_small_patch16_dinov3_qkvb")
    folder = write_hf(tmp_path / "hf", theirs)
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="do not say which model it is"):  # the config decides the model
        vit_rope.create_from_checkpoint(folder)
    # the weights alone load: shapes decide
    ours = timm.create_model("vit_rope_small_patch16_dinov3_qkvb", depth=2, global_pool="token", num_classes=0)
    assert vit_rope.load_weights(ours, folder).converted[0].startswith(HF_FORMAT)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"No weights file in the folder .*model.pt or model.safetensors"):
        vit_rope.load_weights(ours, folder)
