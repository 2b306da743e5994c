"""LookHere's official checkpoints (vit_rope.encodings.bias.lookhere_weights): the official model (a reference copy
of its code, tests/helpers/lookhere_official.py), built at random and saved in its checkpoint format, loads through
``vit_rope.load_weights`` into our LookHere model and gives the same logits at its training grid and a larger one.

The official code rounds its bias to bf16 (ours stays fp32), so features agree to 1e-3 of their scale, not exactly; the
same model without its bias is far outside that tolerance, so the comparison checks the bias."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import timm
import torch

import vit_rope
from helpers.lookhere_official import LookHere
from vit_rope.encodings.bias.lookhere_weights import official_args
from vit_rope.errors import UserError
from vit_rope.eval.loading import load_pretrained

IMG, LARGER, DEPTH, CLASSES = 64, 96, 2, 10  # 4x4 training grid, 6x6 beyond it
CASES = [  # (head_directions, heads, distance, fill_with)
    ("halves", 4, "linear", "inf"),
    ("corners", 4, "sqrt", "inf"),
    ("triangles", 8, "linear", "max"),
    ("diagonals", 4, "square", "zero"),
    ("eighths1-eighths2", 12, "linear", "inf"),
    ("zerohalves-none-center", 12, "linear", "inf"),
    (["halves", "triangles"], 4, "linear", "inf"),  # one string per layer
]


def config(directions: str | list[str], distance: str, fill_with: str) -> dict:
    return dict(global_slope=2.0, layer_slopes=[1.5, 0.5], head_directions=directions, distance=distance,
                fill_with=fill_with)


def official(cfg: dict, heads: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = LookHere(device="cpu", lh_config=copy.deepcopy(cfg), img_size=IMG, patch_size=16, embed_dim=8 * heads,
                     depth=DEPTH, num_heads=heads, num_classes=CLASSES).eval()
    with torch.no_grad():  # off the zero head and tiny LayerScale of its initialisation, so every weight shows
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    model.turn_off_scaled_dot()  # fp32 logits plus its bf16 bias (its SDPA path wants bf16 autocast)
    return model


def ours(cfg: dict, heads: int, weights: dict) -> torch.nn.Module:
    """Our LookHere model with what an official file of ``weights`` and ``cfg`` needs (``official_args``)."""
    return timm.create_model("vit_rope_tiny_patch16_lookhere_224", img_size=IMG, embed_dim=8 * heads, depth=DEPTH,
                             num_heads=heads, **official_args({"weights": weights, "config": cfg})).eval()


@pytest.mark.parametrize("directions,heads,distance,fill_with", CASES)
def test_official_checkpoint_gives_the_official_logits(tmp_path: Path, directions: str | list[str], heads: int,
                                                       distance: str, fill_with: str) -> None:
    cfg = config(directions, distance, fill_with)
    reference = official(cfg, heads)
    path = tmp_path / "lh.pth"
    torch.save({"weights": reference.state_dict(), "config": cfg}, path)
    # the model the file describes, given the name of our registered LookHere models (its width is none of theirs)
    model = vit_rope.create_from_checkpoint(path, model="vit_rope_tiny_patch16_lookhere_224", img_size=IMG,
                                            num_heads=heads).eval()
    report = model.load_report
    assert not report.initialised and not report.skipped and model.head_hidden_dim == 4 * 8 * heads
    torch.manual_seed(1)
    for size in (IMG, LARGER):
        x = torch.randn(2, 3, size, size)
        reference.set_pos_embed(size // 16)
        with torch.no_grad():
            theirs, mine = reference.forward_features(x), model.forward_features(x)  # [B, 1 + N, C] tokens
            torch.testing.assert_close(model.forward_head(mine), reference.forward_head(theirs), rtol=1e-3, atol=1e-3)
            bias = model.pos_encoding
            scales, bias.scales = bias.scales, [0.0] * DEPTH  # the same model without any bias
            unbiased = model.forward_features(x)
            model.pos_encoding.scales = scales
        tolerance = 1e-3 * float(theirs.abs().max())
        torch.testing.assert_close(mine, theirs, rtol=0, atol=tolerance, msg=f"{directions} at {size} px")
        assert (unbiased - theirs).abs().max() > 10 * tolerance  # the bias is what the comparison checks


def test_official_checkpoint_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    cfg = config("halves", "linear", "inf")
    path = tmp_path / "lh.pth"
    weights = official(cfg, 4).state_dict()
    torch.save({"weights": weights, "config": cfg}, path)
    wider = timm.create_model("vit_rope_tiny_patch16_lookhere_224", img_size=IMG, embed_dim=64, depth=DEPTH,
                              num_heads=4, num_classes=CLASSES, encoding_options={"config": cfg}, head_hidden_dim=128)
    with pytest.raises(ValueError, match=r"blocks.0.attn.qkv.weight \(96, 32\) in the file, \(192, 64\) in the model"):
        vit_rope.load_weights(wider, path)
    other = ours(config("corners", "linear", "inf"), 4, weights)
    with pytest.raises(ValueError, match="LookHere config .*'halves'.* differs from the model's .*'corners'"):
        vit_rope.load_weights(other, path)
    linear_head = timm.create_model("vit_rope_tiny_patch16_lookhere_224", img_size=IMG, embed_dim=32, depth=DEPTH,
                                    num_heads=4, num_classes=CLASSES, encoding_options={"config": cfg})
    with pytest.raises(ValueError, match=r"create the model with head_hidden_dim=128"):
        vit_rope.load_weights(linear_head, path)
    alibi = timm.create_model("vit_rope_tiny_patch16_alibi_224", img_size=IMG, embed_dim=32, depth=DEPTH,
                              num_heads=4, num_classes=CLASSES)
    with pytest.raises(ValueError, match="encoding is 'alibi'"):
        vit_rope.load_weights(alibi, path)


def test_evaluation_harness_loads_an_official_file(tmp_path: Path) -> None:
    """What ``vit_rope.evaluate --model NAME --pretrained-file FILE [--model-kwargs ...]`` does: the arguments the
    file needs come from the file (``vit_rope.models.formats.model_args``) unless given."""
    cfg = config("corners", "linear", "inf")
    reference = official(cfg, 4)
    path = tmp_path / "lh.pth"
    torch.save({"weights": reference.state_dict(), "config": cfg}, path)
    given = official_args({"weights": reference.state_dict(), "config": cfg})
    entry = load_pretrained("vit_rope_tiny_patch16_lookhere_224", str(path), CLASSES, train_size=IMG,
                            model_kwargs=dict(given, embed_dim=32, num_heads=4, depth=DEPTH))
    # without the LookHere config and the official ViT's arguments: the harness reads them from the file
    bare = load_pretrained("vit_rope_tiny_patch16_lookhere_224", str(path), CLASSES, train_size=IMG,
                           model_kwargs=dict(embed_dim=32, num_heads=4, depth=DEPTH))
    assert bare.model.pos_encoding.config == entry.model.pos_encoding.config and bare.model.head_hidden_dim == 128
    assert "config" not in bare.label and "config" in entry.label  # the label names what was given, not the file's
    with pytest.raises(UserError, match="the model's encoding is 'axial'"):  # the file's arguments are LookHere's
        load_pretrained("vit_rope_tiny_patch16_axial_224", str(path), CLASSES, train_size=IMG,
                        model_kwargs=dict(embed_dim=32, num_heads=4, depth=DEPTH))
    x = torch.randn(2, 3, LARGER, LARGER)
    reference.set_pos_embed(LARGER // 16)
    with torch.no_grad():
        torch.testing.assert_close(entry.model.eval()(x), reference(x), rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(bare.model.eval()(x), entry.model(x), rtol=0, atol=0)
