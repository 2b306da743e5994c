"""Position ablation (vit_rope.eval.ablation): without its encoding every kind sees its patches as a set."""

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from helpers.models import perturbed
from helpers.naflex import pack
from vit_rope.eval.ablation import position_reliance, without_positions

PATCH = 16
BASE = dict(img_size=64, embed_dim=48, depth=2, num_heads=3, num_classes=5, init_values=0.5)
KINDS = {  # every encoding: RoPE tables, STRING, RoPE + APE (patches only or with the class token), DINOv3, biases
    "axial": ("vit_rope_tiny_patch16_axial_224", {}),
    "mixed": ("vit_rope_tiny_patch16_mixed_224", {}),
    "golden": ("vit_rope_tiny_patch16_golden_224", {}),
    "string_mixed": ("vit_rope_tiny_patch16_string_mixed_224", {}),
    "axial_ape": ("vit_rope_tiny_patch16_axial_ape_224", {}),
    "mixed_ape_cls": ("vit_rope_tiny_patch16_mixed_ape_224", {"no_embed_class": False}),
    "dinov3": ("vit_rope_tiny_patch16_axial_224", {"encoding": "dinov3", "reg_tokens": 2}),
    "lookhere": ("vit_rope_tiny_patch16_lookhere_224", {}),
    "alibi": ("vit_rope_tiny_patch16_alibi_224", {}),
}


def build(kind: str, **kwargs) -> torch.nn.Module:
    name, extra = KINDS[kind]
    return perturbed(name, None, **{**BASE, **extra, **kwargs})


def shuffle_patches(images: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` with its PATCH x PATCH patches moved to the raster positions ``order``."""
    B, C, H, W = images.shape
    h, w = H // PATCH, W // PATCH
    patches = images.reshape(B, C, h, PATCH, w, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C, PATCH, PATCH)
    patches = patches[:, order].reshape(B, h, w, C, PATCH, PATCH)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [64, 96])  # the training grid and a larger one
def test_without_positions_every_kind_is_blind_to_where_patches_are(kind: str, size: int) -> None:
    model = build(kind)
    torch.manual_seed(1)
    images = torch.randn(2, 3, size, size)
    moved = shuffle_patches(images, torch.randperm((size // PATCH) ** 2))
    with torch.no_grad():
        assert not torch.allclose(model(moved), model(images), atol=1e-3)  # with its encoding, where matters
        with without_positions(model):
            torch.testing.assert_close(model(moved), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["mixed_ape_cls", "lookhere"])
def test_leaving_restores_the_encoding_even_after_an_error(kind: str) -> None:
    model = build(kind)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(images)
        ape = None if model.pos_embed is None else model.pos_embed.clone()
        with pytest.raises(RuntimeError, match="inside"), without_positions(model):
            assert not torch.allclose(model(images), before, atol=1e-3)
            raise RuntimeError("inside")
        torch.testing.assert_close(model(images), before, atol=0, rtol=0)
    assert ape is None or torch.equal(model.pos_embed, ape)
    assert not any(blk._forward_pre_hooks for blk in model.blocks)


def test_other_models_are_refused_not_half_ablated() -> None:
    with pytest.raises(TypeError, match="got Eva, whose position encoding"), without_positions(timm.create_model(
            "vit_small_patch16_rope_mixed_224", depth=1)):
        pass


def test_reliance_is_zero_for_a_model_that_has_no_positions_to_lose() -> None:
    images = torch.randn(4, 3, 64, 64)
    blind = build("axial", rope_fraction=0.0)  # every pair unrotated, no APE: positions never reach it
    assert position_reliance(blind, images) == {"output_change": pytest.approx(0, abs=1e-6), "predictions_kept": 1.0}
    reliance = position_reliance(build("axial"), images)
    assert reliance["output_change"] > 1e-2 and 0 <= reliance["predictions_kept"] <= 1


@pytest.mark.parametrize("kind", ["lookhere", "axial_ape"])
def test_without_positions_a_naflex_sample_still_equals_its_image_alone(kind: str) -> None:
    """The padding mask is no position: it stays when the bias goes, so each sample is still its image alone."""
    torch.manual_seed(3)
    inputs = [torch.randn(3, 64, 96), torch.randn(3, 80, 48)]
    model = build(kind)
    with torch.no_grad(), without_positions(model):
        logits = model(pack(inputs, length=28))
        for b, image in enumerate(inputs):
            torch.testing.assert_close(logits[b], model(pack([image], length=28))[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits[b], model(image[None])[0], atol=1e-4, rtol=1e-4)


def test_reliance_of_a_naflex_batch_and_of_a_model_without_classifier() -> None:
    torch.manual_seed(2)
    batch = pack([torch.randn(3, 64, 96), torch.randn(3, 80, 48)], length=28)
    model = build("mixed")
    reliance = position_reliance(model, batch)
    with torch.no_grad():
        logits = model(batch)
        with without_positions(model):
            blind = model(batch)
    change = ((blind - logits).norm(dim=-1) / logits.norm(dim=-1)).mean()
    assert float(change) > 0 and reliance["output_change"] == pytest.approx(float(change), rel=1e-6)
    assert reliance["predictions_kept"] == float((blind.argmax(-1) == logits.argmax(-1)).float().mean())
    features = position_reliance(build("lookhere", num_classes=0), torch.randn(2, 3, 64, 64))
    assert set(features) == {"output_change"} and features["output_change"] > 0  # pooled features, no top-1


def test_reliance_restores_training_mode_even_when_the_forward_fails() -> None:
    model = build("axial").train()
    with pytest.raises(RuntimeError):
        position_reliance(model, torch.randn(2, 5, 64, 64))  # five channels: the patch embedding refuses them
    assert model.training and all(module.training for module in model.modules())
