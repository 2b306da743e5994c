"""LieRE's official checkpoints (``vit_rope.encodings.generators.liere_weights``): ``create_from_checkpoint`` builds
the model a Lightning checkpoint of the official ``RoPEViT`` describes, whose logits equal the official code's
(reference written by tests/fixtures/liere/make_reference.py from StanfordMIMI/LieRE at b27b41b) at the training
grid and a larger one; what does not fit is refused with the reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import timm
import torch

import vit_rope
from vit_rope.encodings.generators.liere_weights import FORMAT_NAME, liere_args
from vit_rope.models.formats import checkpoint_format, describe

FIXTURES = Path(__file__).parents[1] / "fixtures" / "liere"
CHECKPOINT = FIXTURES / "model.ckpt"
REFERENCE = torch.load(FIXTURES / "reference.pt", weights_only=True)
_spec = importlib.util.spec_from_file_location("liere_make_reference", FIXTURES / "make_reference.py")
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)  # the script that wrote the reference: its test images


class AttributeDict(dict):
    """Lightning keeps its hyper-parameters in a class of its own, which torch's safe loading refuses to run."""


def state_dict() -> dict[str, torch.Tensor]:
    return torch.load(CHECKPOINT, weights_only=True)["state_dict"]


@pytest.mark.parametrize("size", [32, 48])
def test_logits_equal_the_official_model_at_the_training_grid_and_a_larger_one(size: int):
    model = vit_rope.create_from_checkpoint(CHECKPOINT, img_size=32).eval()  # trained at 32 px: a 4 x 4 grid
    assert model.encoding_kind == "liere" and not model.load_report.initialised and not model.load_report.skipped
    assert any("layer 0's" in note for note in model.load_report.converted)  # saved per layer, run with layer 0's
    with torch.no_grad():
        torch.testing.assert_close(model(_script.images(size)), REFERENCE[f"logits_{size}"], atol=1e-4, rtol=0)


def test_the_architecture_is_read_from_the_shapes_and_the_training_size_defaults_to_imagenets(tmp_path):
    bare = {key.removeprefix("model."): value for key, value in state_dict().items()}  # no Lightning container
    torch.save(bare, tmp_path / "liere.pth")
    assert checkpoint_format(bare).name == FORMAT_NAME
    name, args = liere_args(bare)
    assert name is None and args["encoding"] == "liere"  # the arguments say it all: any LieRE model's name serves
    assert describe(tmp_path / "liere.pth")[0] == "vit_rope_base_patch16_liere_224"  # 128 wide: no registered size
    assert (args["embed_dim"], args["depth"], args["num_heads"], args["patch_size"], args["num_classes"]) == (
        128, 2, 2, 8, 5)
    assert args["encoding_options"] == {"generator_dim": 8, "per_head": True} and args["img_size"] == 224
    model = vit_rope.create_from_checkpoint(tmp_path / "liere.pth")
    assert model.patch_embed.grid_size == (28, 28) and not model.load_report.initialised
    assert model.blocks[0].attn.qkv.bias is None and model.norm.eps == 1e-5


def test_what_does_not_fit_is_refused_with_the_reason(tmp_path):
    axial = timm.create_model("vit_rope_tiny_patch16_axial_224")
    with pytest.raises(ValueError, match="vit_rope_\\*_patch16_liere_224"):  # into another kind's model
        vit_rope.load_weights(axial, CHECKPOINT)
    absolute = state_dict()
    absolute["model.pos_embedding"] = torch.ones(1, 17, 128)
    torch.save({"state_dict": absolute}, tmp_path / "absolute.ckpt")
    with pytest.raises(ValueError, match="pos_embedding is not zero"):
        vit_rope.create_from_checkpoint(tmp_path / "absolute.ckpt", img_size=32)
    partial = {key: value for key, value in state_dict().items() if not key.startswith("model.mlp_head.")}
    torch.save({"state_dict": partial}, tmp_path / "partial.ckpt")
    with pytest.raises(ValueError, match="lacks mlp_head.1.weight"):
        vit_rope.create_from_checkpoint(tmp_path / "partial.ckpt")
    lightning = {"state_dict": state_dict(), "hyper_parameters": AttributeDict(initialization_factor=6.28)}
    torch.save(lightning, tmp_path / "lightning.ckpt")
    with pytest.raises(Exception, match="weights_only"):  # torch's reason, not "no format"
        vit_rope.create_from_checkpoint(tmp_path / "lightning.ckpt")
