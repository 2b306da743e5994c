"""The rotation kinds on the ViT (golden, Cayley-STRING over axial and mixed, p-RoPE on every kind): registered names,
translation invariance on NaFlex batches whose coordinates are shifted and sparse, STRING's orthogonality through
training and its fold, p-RoPE at 0 blind to positions, ONNX export, and errors."""

from __future__ import annotations

import copy

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from helpers.models import assert_onnx_matches_eager, assert_same_gradients, perturbed
from helpers.naflex import assert_offsets_only, images, pack
from vit_rope.encodings.rope.rotary_encoding import cayley

ROTATION_KINDS = ("golden", "string", "string_mixed")  # the rotating name suffixes of registry.NEW_KINDS
BASE = dict(img_size=80, embed_dim=32, depth=2, num_heads=2, num_classes=7, init_values=0.5)
KINDS = {  # every RoPE table, and STRING over axial and mixed
    "axial": dict(encoding="axial"),
    "mixed": dict(encoding="mixed"),
    "golden": dict(encoding="golden"),
    "dinov3": dict(encoding="dinov3", resolution_policy="extrapolate"),
    "string_axial": dict(encoding="string", rope_string_base="axial"),
    "string_mixed": dict(encoding="string", rope_string_base="mixed"),
    "string_golden": dict(encoding="string", rope_string_base="golden"),
    "string_dinov3": dict(encoding="string", rope_string_base="dinov3", resolution_policy="extrapolate"),
}


def build(kind: str, **kwargs) -> torch.nn.Module:
    """Every parameter off its initial value (STRING's P off the identity too)."""
    return perturbed("vit_rope_tiny_patch16_axial_224", **{**BASE, **KINDS[kind], **kwargs})


@pytest.mark.parametrize("fraction", [0.5, 1.0])
@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_see_offsets_only_on_shifted_and_sparse_coordinates(kind: str, fraction: float):
    """A crop's patches at a common integer offset, and a sparse (MAE-style) subset of them, give the same logits as
    at the origin; one patch moved alone changes them. No prefix token: an unrotated class token's scores with the
    patches see their absolute positions (RoPE-ViT's design), so the property is the patches' among themselves."""
    assert_offsets_only(build(kind, rope_fraction=fraction, class_token=False, global_pool="avg"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_rotated_pair_makes_the_model_blind_to_positions(kind: str):
    """rope_fraction=0: the patches in another order (their coordinates kept) give the same tokens in that order."""
    model = build(kind, rope_fraction=0.0)
    x = pack(images([(5, 6)]), length=40)  # 30 patches, then padding
    order = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    shuffled = {**x, "patches": torch.cat((x["patches"][:, order], x["patches"][:, 30:]), 1)}  # coordinates kept
    with torch.no_grad():
        tokens = model.forward_features(x)[0, 1:31]  # class token, then the 30 patches
        permuted = model.forward_features(shuffled)[0, 1:31]
        logits = model(x), model(shuffled)
    torch.testing.assert_close(permuted, tokens[order], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(*logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["string_axial", "string_mixed"])
def test_string_stays_orthogonal_through_training_and_folds_exactly(kind: str):
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", **{**BASE, **KINDS[kind]})
    base_kind = model.pos_encoding.kind
    fresh = timm.create_model("vit_rope_tiny_patch16_axial_224", **{**BASE, "encoding": base_kind})
    fresh.load_state_dict(model.state_dict(), strict=False)  # P = I at creation: the base kind exactly
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), fresh.eval()(x), atol=1e-6, rtol=0)

    model.train()
    decay = [p for n, p in model.named_parameters() if n not in model.no_weight_decay()]
    no_decay = [p for n, p in model.named_parameters() if n in model.no_weight_decay()]
    assert all(n.endswith("skew") for n, _ in model.named_parameters() if "string" in n)
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=0.05)
    for _ in range(3):
        model(x).logsumexp(-1).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    for blk in model.blocks:
        basis = cayley(blk.attn.string.skew)
        assert (basis - torch.eye(basis.shape[-1])).abs().max() > 1e-2  # P has moved
        eye = torch.eye(basis.shape[-1]).expand_as(basis)
        torch.testing.assert_close(basis.transpose(-1, -2) @ basis, eye, atol=1e-5, rtol=0)

    model.eval()
    with torch.no_grad():
        unfolded = model(x)
        with torch.enable_grad():
            per_forward = model(x).detach()  # the fold of the training path
        folded_model = copy.deepcopy(model)
        folded_model.fold_encoding_()
        assert not any("string" in key for key in folded_model.state_dict())
        torch.testing.assert_close(folded_model(x), unfolded, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(per_forward, unfolded, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [f"vit_rope_tiny_patch16_{kind}_224" for kind in ROTATION_KINDS])
def test_intermediates_of_images_and_naflex_batches(name: str):
    model = timm.create_model(name, depth=2, num_classes=3, rope_fraction=0.5).eval()  # names at 3 sizes: test_models
    if name.endswith("string_mixed_224"):
        assert model.encoding_kind == "string" and model.pos_encoding.kind == "mixed"
    maps = model.forward_intermediates(torch.randn(2, 3, 48, 64), intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(2, 192, 3, 4)] * 2
    x = pack(images([(3, 4)]), length=16)
    x["patch_coord"][x["patch_valid"]] += 2
    naflex = model.forward_intermediates(x, intermediates_only=True)
    assert naflex[0].shape == (1, 192, 5, 6)  # the sample's map in the corner of its grid, coordinates from 2


def test_unknown_kind_and_bad_fraction_are_errors_that_say_what_is_allowed():
    with pytest.raises(ValueError, match=r"position encoding 'spiral'.*golden, dinov3, string, none, lookhere, alibi"):
        timm.create_model("vit_rope_tiny_patch16_axial_224", encoding="spiral")
    with pytest.raises(ValueError, match=r"rope_string_base .* 'spiral': choose one of axial, mixed, golden, dinov3.$"):
        timm.create_model("vit_rope_tiny_patch16_string_224", rope_string_base="spiral")
    with pytest.raises(ValueError, match=r"rope_fraction must be in \[0, 1\].*2\.0"):
        timm.create_model("vit_rope_tiny_patch16_golden_224", rope_fraction=2)


def test_arguments_a_kind_would_ignore_are_errors():
    with pytest.raises(ValueError, match=r"rope_string_base='mixed' names the RoPE under Cayley-STRING.*'golden'"):
        timm.create_model("vit_rope_tiny_patch16_golden_224", rope_string_base="mixed")
    with pytest.raises(ValueError, match=r"rope_fraction=0\.5, rope_mixed_init='golden' configure RoPE; the alibi"):
        timm.create_model("vit_rope_tiny_patch16_alibi_224", rope_fraction=0.5, rope_mixed_init="golden")
    with pytest.raises(ValueError, match=r"rope_theta=10\.0, rope_ref_grid=\(4, 4\) configure RoPE; the lookhere"):
        timm.create_model("vit_rope_tiny_patch16_lookhere_224", rope_theta=10.0, rope_ref_grid=(4, 4))
    assert timm.create_model("vit_rope_tiny_patch16_alibi_224", depth=1, rope_fraction=1.0).encoding_kind == "alibi"


def test_onnx_export_of_string_at_a_size_other_than_training_matches_eager(tmp_path):
    """Exported folded: the graph has no solve, and the caller's model is not folded. (Golden-angle RoPE's tables are
    RoPE2D's, exported fixed in the twins' tests and per head in test_export's mixed checkpoint; a second block would
    trace the same ops again.)"""
    import onnx

    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny_patch16_string_mixed_224", depth=1, num_classes=5, init_values=1.0)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.string.skew.normal_(std=0.3)
    result = assert_onnx_matches_eager(model.eval(), tmp_path)
    assert not {node.op_type for node in onnx.load(str(result.path)).graph.node} & {"Inverse", "Solve"}
    assert any(key.endswith("skew") for key in model.state_dict())


def test_a_checkpoint_without_string_loads_with_p_the_identity_and_says_so(tmp_path):
    from vit_rope.models.checkpoint import STRING, WeightsNotLoadedWarning, load_weights

    torch.manual_seed(0)
    axial = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=2, num_classes=3)
    torch.save(axial.state_dict(), tmp_path / "axial.pth")
    string = timm.create_model("vit_rope_tiny_patch16_string_224", depth=2, num_classes=3)
    with torch.no_grad():
        string.blocks[0].attn.string.skew.normal_()
    with pytest.warns(WeightsNotLoadedWarning, match="Cayley-STRING"):
        report = load_weights(string, tmp_path / "axial.pth")
    assert set(report.initialised[STRING]) == {f"blocks.{i}.attn.string.skew" for i in range(2)}
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(string.eval()(x), axial.eval()(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["string_mixed", "golden"])
def test_compiled_model_equals_eager_in_training_and_after_the_fold(kind: str):
    """torch.compile of a training step (STRING's basis rebuilt from S in the graph) gives the eager gradients; in
    eval the cached fold compiles to the eager logits. One block: the graph of every block is the same. ``aot_eager``:
    the traced forward and backward graphs hold what the kinds add (golden-angle RoPE differs from STRING in its tables
    only); inductor's code generation from them is torch's, and on a NaFlex batch test_naflex's."""
    model = build(kind, depth=1).train()
    compiled = torch.compile(model, dynamic=False, backend="aot_eager")
    x = torch.randn(2, 3, 96, 80)
    assert_same_gradients(model, compiled, model, x)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
