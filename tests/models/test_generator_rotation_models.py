"""ComRoPE-AP, ComRoPE-LD and LieRE on the ViT: registered names, NaFlex batches (a sample equals its image alone;
ComRoPE's patch logits see offsets only on shifted and sparse coordinates), features, position reliance, the
policies each takes, a compiled training step, ONNX export at two sizes, FX feature extraction, a forward on the meta
device, and errors."""

from __future__ import annotations

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from helpers.models import (
    assert_features_and_reliance,
    assert_fx_features_match_eager,
    assert_onnx_matches_eager,
    perturbed,
)
from helpers.naflex import assert_offsets_only, images, pack, samples_equal_images
from vit_rope.encodings.base import image_positions
from vit_rope.encodings.generators.comrope import Spectral

KINDS = ("comrope_ap", "comrope_ld", "liere")
BASE = dict(img_size=80, embed_dim=32, depth=2, num_heads=2, num_classes=7, init_values=0.5)
OPTIONS = {"comrope_ap": {"block_size": 4}, "comrope_ld": {"block_size": 4}, "liere": {"generator_dim": 4}}


def build(kind: str, policy: str = "extrapolate", **kwargs) -> torch.nn.Module:
    return perturbed(f"vit_rope_tiny_patch16_{kind}_224", policy,
                     **{**BASE, "encoding_options": OPTIONS[kind], **kwargs})


def test_the_registered_models_have_the_official_defaults():  # registered at three sizes: test_models.py
    model = timm.create_model("vit_rope_small_patch16_comrope_ld_224", depth=1)
    assert model.pos_encoding.freqs.shape == (1, 6, 1, 8, 8, 8) and model.pos_encoding.multiplier.shape[2] == 2
    model = timm.create_model("vit_rope_small_patch16_liere_224", depth=2)
    assert model.pos_encoding.generator_raw_params.shape == (2, 1, 6 * 8, 8, 8)  # per head, one set for all blocks


@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_sample_of_a_mixed_batch_equals_its_image_alone(kind: str, policy: str):
    samples_equal_images(build(kind, policy))


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_comrope_patch_logits_see_offsets_only_on_shifted_and_sparse_coordinates(kind: str):
    assert_offsets_only(build(kind, class_token=False, global_pool="avg"))


@pytest.mark.parametrize("kind", KINDS)
def test_intermediates_and_position_reliance(kind: str):
    assert_features_and_reliance(build(kind), torch.randn(2, 3, 64, 96), pack(images()))


@pytest.mark.parametrize("kind", KINDS)
def test_training_grid_tables_are_cached_in_eval_and_follow_the_generators(kind: str):
    model = build(kind)
    x = torch.randn(1, 3, 80, 80)
    with torch.no_grad():
        before = model(x)
        assert torch.equal(model(x), before) and len(model.pos_encoding._cache) == 1
        for param in model.pos_encoding.parameters():
            param.mul_(1.5)
        assert not torch.allclose(model(x), before)


# ComRoPE-LD's captured form is AP's (the same generators times a parameter instead of a buffer): AP and LieRE only
@pytest.mark.parametrize("kind", ["comrope_ap", "liere"])
def test_compiled_training_step_equals_eager(kind: str):
    """torch.compile traces the captured form (one table per token, the exportable exponential): the logits and every
    parameter's gradient of a training step equal the eager model's (whose ComRoPE turns per axis) to 1e-5 of their
    size. ``aot_eager``: the traced graphs are what these kinds add; inductor's code generation is torch's."""
    model = build(kind, depth=1).train()
    compiled = torch.compile(model, dynamic=False, backend="aot_eager")
    x = torch.randn(2, 3, 64, 96)
    steps = []
    for forward in (compiled, model):
        model.zero_grad(set_to_none=True)
        logits = forward(x)
        logits.square().sum().backward()
        steps.append([logits.detach(), *(param.grad for param in model.parameters())])
    for got, expected in zip(*steps, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize("kind", ["comrope_ap", "liere"])  # LD's captured form is AP's, as compiled above
def test_onnx_export_at_two_sizes_matches_eager(kind: str, tmp_path):
    assert_onnx_matches_eager(build(kind, depth=1), tmp_path)  # a second block would trace the same ops again


def test_bad_options_and_policies_are_errors_that_say_what_fits():
    with pytest.raises(ValueError, match=r"block_size'\]=5 must divide the head width 16"):
        build("comrope_ld", encoding_options={"block_size": 5})
    with pytest.raises(ValueError, match=r"\['generator_dim'\] do not apply to the comrope_ap encoding, which takes "
                                         "block_size, init_std, cls_position"):
        build("comrope_ap", encoding_options={"generator_dim": 4})
    with pytest.raises(ValueError, match=r"\['block_size'\] do not apply to the axial encoding, which takes none"):
        timm.create_model("vit_rope_tiny_patch16_axial_224", encoding_options={"block_size": 4})
    with pytest.raises(ValueError, match="rope_theta=.* configure RoPE"):
        build("liere", rope_theta=10.0)
    model = build("comrope_ap")
    with pytest.raises(ValueError, match="'ntk' does not apply to comrope_ap"):
        model.set_resolution_policy("ntk")


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_on_the_meta_device_runs_a_forward(kind: str):
    """Shapes without values (no host sync in the exponential): what a model's size is read from before loading."""
    model = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", device="meta")
    x = torch.empty(1, 3, 224, 224, device="meta")
    assert model(x).shape == (1, 1000)
    with torch.no_grad():  # and in evaluation (ComRoPE's RoPE form needs values: its block rotations run)
        assert model.eval()(x).shape == (1, 1000)


@pytest.mark.parametrize("kind", KINDS)
def test_grouped_query_attention_rotates_the_shared_keys_too(kind):
    """One key / value head shared by both query heads (``num_kv_heads=1``) is the full model whose key and value
    rows are the same for every head: the rotations must act on the grouped path as on the full one."""
    grouped = build(kind, num_kv_heads=1)
    full = build(kind)
    D = full.blocks[0].attn.head_dim
    state = grouped.state_dict()
    for name, value in state.items():
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            q, k, v = value.split([2 * D, D, D])
            state[name] = torch.cat((q, k, k, v, v))  # [q heads; k head twice; v head twice]
    full.load_state_dict(state)
    x = torch.randn(2, 3, 80, 48)
    with torch.no_grad():
        torch.testing.assert_close(grouped(x), full(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["comrope_ap", "comrope_ld"])
def test_comrope_inference_in_rope_form_equals_its_block_rotations(kind: str):
    """In eager inference ComRoPE runs as RoPE in a folded basis (``generators.comrope``); its logits equal the
    block rotations' (the path autograd takes), also after its matrices and the projections change in place."""
    model = build(kind).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():  # the RoPE form is what the blocks are handed in inference
        inputs = model.pos_encoding.block_inputs(image_positions(model.pos_encoding, 4, 6), model.num_prefix_tokens)
    assert all(isinstance(item, Spectral) for item in inputs)
    for _ in range(2):
        with torch.no_grad():
            folded = model(x)
        torch.testing.assert_close(folded, model(x).detach(), atol=1e-5, rtol=1e-5)
        with torch.no_grad():  # new weights: the kept form and the folded projection must not be reused
            model.pos_encoding.freqs.mul_(1.1)
            model.blocks[0].attn.qkv.weight.mul_(0.9)


class LowRank(torch.nn.Module):
    """A LoRA-style wrapper of a Linear: its ``weight`` is the base's, its output the base's plus a low-rank update."""

    def __init__(self, base: torch.nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.down = torch.nn.Parameter(torch.randn(base.in_features, 2) * 0.1)
        self.up = torch.nn.Parameter(torch.randn(2, base.out_features) * 0.1)

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.down @ self.up


def test_comrope_inference_calls_a_hooked_or_wrapped_projection():
    """The RoPE form folds the basis into the projection's weights, which do not say what a hooked or wrapped
    projection computes: such a projection is called, in inference as in training."""
    model = build("comrope_ld").eval()
    x = torch.randn(2, 3, 64, 96)
    seen = []
    model.blocks[0].attn.qkv.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    model.blocks[1].attn.qkv = LowRank(model.blocks[1].attn.qkv)
    with torch.no_grad():
        inferred = model(x)
    assert seen == [torch.Size([2, 1 + 24, 3 * model.embed_dim])]
    torch.testing.assert_close(inferred, model(x).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_fx_feature_extraction_with_timms_tracer_options(kind: str):
    """timm's tracer keeps the encoding whole (a leaf), so the traced graph builds its tables at each input's grid."""
    assert_fx_features_match_eager(build(kind).eval())
