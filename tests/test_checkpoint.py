"""Weights users already have: timm's RoPE-ViT ports (parity of logits), original RoPE-ViT, plain ViT / DeiT-III."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope  # noqa: F401  (registers the models)
from vit_rope.checkpoint import convert_state_dict, load_weights

# (timm's port, ours)
PAIRS = [
    ("vit_small_patch16_rope_224", "vit_rope_small_patch16_axial_224"),
    ("vit_small_patch16_rope_mixed_224", "vit_rope_small_patch16_mixed_224"),
    ("vit_small_patch16_rope_ape_224", "vit_rope_small_patch16_axial_ape_224"),
    ("vit_small_patch16_rope_mixed_ape_224", "vit_rope_small_patch16_mixed_ape_224"),
]
SIZES = [(224, 224), (320, 320), (224, 320)]


def timm_port(name: str, **kwargs) -> torch.nn.Module:
    """A timm RoPE-ViT port with non-trivial LayerScale and head, so that every block shows in the logits."""
    torch.manual_seed(0)
    model = timm.create_model(name, dynamic_img_size=True, **kwargs).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "gamma" in n or n.startswith("head"):
                p.normal_(0, 0.5)
    return model


def assert_same_logits(reference: torch.nn.Module, ours: torch.nn.Module, sizes=SIZES) -> None:
    for h, w in sizes:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            expected, got = reference(x), ours(x)
        assert expected.abs().max() > 1.0
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0, msg=f"logits differ at {h}x{w}")


@pytest.mark.parametrize("port,ours", PAIRS)
@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_parity_with_timm_ports_through_create_model(port, ours, fmt, tmp_path):
    reference = timm_port(port, depth=3)
    path = tmp_path / f"weights.{fmt}"
    if fmt == "pth":
        torch.save(reference.state_dict(), path)
    else:
        save_file(reference.state_dict(), str(path))
    model = timm.create_model(ours, depth=3, pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    assert_same_logits(reference, model)


def test_parity_full_depth_mixed_small(tmp_path):
    reference = timm_port("vit_small_patch16_rope_mixed_224", num_classes=10)
    torch.save({"model": reference.state_dict()}, tmp_path / "w.pth")
    model = load_weights(timm.create_model("vit_rope_small_patch16_mixed_224", num_classes=10), tmp_path / "w.pth")
    assert_same_logits(reference, model.eval())


def test_original_rope_vit_checkpoint_layout(tmp_path):
    """naver-ai/rope-vit stores mixed frequencies as ``freqs [2, depth, nh * D/2]`` beside grid buffers."""
    reference = timm_port("vit_small_patch16_rope_mixed_ape_224", depth=2)
    sd = {k.replace("rope.freqs", "freqs"): v for k, v in reference.state_dict().items()}
    sd["freqs"] = sd["freqs"].reshape(2, 2, -1)
    sd["freqs_t_x"], sd["freqs_t_y"] = torch.arange(196.0) % 14, torch.arange(196.0) // 14
    torch.save({"model": sd}, tmp_path / "naver.pth")
    model = load_weights(timm.create_model("vit_rope_small_patch16_mixed_ape_224", depth=2), tmp_path / "naver.pth")
    assert_same_logits(reference, model.eval(), sizes=[(224, 224)])


def test_plain_vit_into_rope_ape_model():
    """timm ViT (class-token APE row, no LayerScale) -> RoPE+APE: weights carried, APE stripped, identity scales."""
    source = timm.create_model("vit_small_patch16_224", depth=2)
    model = timm.create_model("vit_rope_small_patch16_axial_ape_224", depth=2)
    freqs_before = model.rope.freqs.clone()
    sd = convert_state_dict(source.state_dict(), model)
    model.load_state_dict(sd)
    torch.testing.assert_close(model.pos_embed, source.pos_embed[:, 1:])
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    assert (model.blocks[0].ls1.gamma == 1).all()
    assert torch.equal(model.rope.freqs, freqs_before)


def test_deit3_into_rope_mixed_model_drops_the_ape():
    source = timm.create_model("deit3_small_patch16_224", depth=2)
    model = timm.create_model("vit_rope_small_patch16_mixed_224", depth=2)
    freqs = [r.freqs.detach().clone() for r in model.rope]
    sd = convert_state_dict(source.state_dict(), model)
    assert "pos_embed" not in sd
    model.load_state_dict(sd)
    torch.testing.assert_close(model.blocks[0].ls2.gamma, source.blocks[0].ls2.gamma)
    assert all(torch.equal(r.freqs, f) for r, f in zip(model.rope, freqs, strict=True))  # initialised, not loaded


def test_deit3_resampled_into_a_smaller_grid(tmp_path):
    source = timm.create_model("deit3_small_patch16_224", depth=1)
    torch.save(source.state_dict(), tmp_path / "deit3.pth")
    model = timm.create_model(
        "vit_rope_small_patch16_axial_ape_224", depth=1, img_size=112, pretrained=True,
        pretrained_cfg_overlay=dict(file=str(tmp_path / "deit3.pth")),
    )
    assert model.pos_embed.shape == (1, 49, 384)


def test_mismatched_checkpoints_are_clear_errors(tmp_path):
    model = timm.create_model("vit_rope_small_patch16_axial_224", depth=2)
    sd = timm.create_model("vit_small_patch16_rope_224", depth=2).state_dict()
    sd["blocks.0.attn.extra"] = torch.zeros(1)
    del sd["blocks.1.mlp.fc2.bias"]
    with pytest.raises(ValueError, match=r"missing keys \['blocks.1.mlp.fc2.bias'\].*unexpected keys \['blocks.0.attn"):
        convert_state_dict(sd, model)
    mixed = timm.create_model("vit_small_patch16_rope_mixed_224", depth=2).state_dict()
    with pytest.raises(ValueError, match="not a mixed RoPE model"):
        convert_state_dict(mixed, model)
    with pytest.raises(ValueError, match="depth 3"):
        convert_state_dict(mixed, timm.create_model("vit_rope_small_patch16_mixed_224", depth=3))
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        load_weights(model, tmp_path / "missing.pth")


class _Payload:
    """Arbitrary pickled object: weights_only loading must refuse it."""


def test_loading_is_weights_only(tmp_path):
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    torch.save({"model": model.state_dict(), "extra": _Payload()}, tmp_path / "unsafe.pth")
    with pytest.raises(RuntimeError, match="weights_only=True blocked"):
        load_weights(model, tmp_path / "unsafe.pth")
