"""Every registered model through timm's API: any input size, gradients, fused/explicit attention, helpers."""

import itertools
import re

import pytest
import timm
import torch
from timm.layers import DropPath

import vit_rope
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.models.deepseek_vit import DEEPSEEK
from vit_rope.models.eva_families import FAMILIES, twin_name
from vit_rope.models.gemma4_vit import GEMMA4
from vit_rope.models.pixtral import PIXTRAL
from vit_rope.models.qwen2_5_vl import QWEN25
from vit_rope.models.qwen3_vit import QWEN3
from vit_rope.models.vit import RoPEVisionTransformer

# the twins of timm's Eva backbones (up to 1.8B parameters) by the smallest of each family and block kind
EVA_TWINS = {twin_name(name) for table in FAMILIES.values() for name in table}
SMALLEST_TWINS = ["vit_rope_eva02_tiny_patch14_224", "vit_rope_pe_core_tiny_patch16_384",
                  "vit_rope_pe_spatial_tiny_patch16_512", "vit_rope_medium_patch16_reg1_gap_256",
                  "vit_rope_base_patch16_sapiens2"]
# Qwen3-VL's by its smallest classifier (any size); the merger's twins, even grids only, are test_qwen3_vit.py's
QWEN3_TWINS = {f"vit_rope_{name}" for name in QWEN3}
QWEN25_TWINS = set(QWEN25)  # the Qwen2.5-VL tower outputs its merger's tokens, no classifier: test_qwen2_5_vl.py's
# Pixtral's by its encoder (the other two differ in patch size or a projector, test_pixtral.py's)
PIXTRAL_TWINS = {f"vit_rope_{name}" for name in PIXTRAL}
# DeepSeek's by its classifier (a 412M tower, cut to depth 2); its aligner's twins are test_deepseek_vit.py's
DEEPSEEK_TWINS = {f"vit_rope_{name}" for name in DEEPSEEK}
GEMMA4_TWINS = {f"vit_rope_{name}" for name in GEMMA4}  # likewise: the pooler's twins (3x3 grids) in test_gemma4_vit.py
OWN_TESTS = EVA_TWINS | QWEN3_TWINS | QWEN25_TWINS | PIXTRAL_TWINS | DEEPSEEK_TWINS | GEMMA4_TWINS
MODEL_NAMES = [name for name in timm.list_models("vit_rope_*") if name not in OWN_TESTS] + SMALLEST_TWINS + \
    ["vit_rope_qwen3_vit_88m", "vit_rope_pixtral_vit_12b", "vit_rope_deepseek_vit_412m", "vit_rope_gemma4_vit_167m"]
SIZES = [(2, 2), (4, 4), (3, 5)]  # in patches: two square resolutions and a non-square one
# each encoding and block kind at depth 2 (the blocks past the second repeat them) at its smallest registered width:
# the wider variants of a kind (``tiny`` < ``small`` < ``base`` < ``large`` in the name; ``small_plus`` is a block kind
# of its own) run the same code at other widths and head counts, whose shapes a forward on the meta device checks.
# Sapiens2 lists key/value heads per block, all 12 in the base model: given once for the two blocks
TWO_BLOCKS = {"vit_rope_base_patch16_sapiens2": dict(num_kv_heads=12)}
BY_KIND: dict[str, list[str]] = {}  # the name without its width -> the names, narrowest first
for _name in sorted(MODEL_NAMES, key=lambda n: [f"_{width}_" in n for width in ("large", "base", "small", "tiny")]):
    BY_KIND.setdefault(re.sub(r"_(tiny|small|base|large)_", "_", _name), []).append(_name)
SMALLEST = [names[0] for names in BY_KIND.values()]


def two_blocks(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, num_classes=3, img_size=32, depth=2, **TWO_BLOCKS.get(name, {}), **kwargs)


def tiny(name: str = "vit_rope_tiny_patch16_mixed_224", **kwargs) -> RoPEVisionTransformer:
    return timm.create_model(name, **{"depth": 2, "num_classes": 5, **kwargs})


def set_fused(model: torch.nn.Module, fused: bool) -> None:
    for blk in model.blocks:
        blk.attn.fused_attn = fused


def test_all_variants_are_registered():
    expected = {
        f"vit_rope_{size}_patch16_{kind}{ape}_224"
        for size in ("tiny", "small", "base", "large")
        for kind in ("axial", "mixed")
        for ape in ("", "_ape")
    }
    other_kinds = ("golden", "string", "string_mixed", "lookhere", "alibi", "fire", "comrope_ap", "comrope_ld", "liere",
                   "pape", "pape_ri")  # each at three sizes
    expected |= {f"vit_rope_{size}_patch16_{kind}_224" for size in ("tiny", "small", "base") for kind in other_kinds}
    assert expected <= set(MODEL_NAMES)


@pytest.mark.parametrize("name", sorted(set(MODEL_NAMES) - set(SMALLEST)))
def test_wider_variants_build_and_run_on_the_meta_device(name):
    model = two_blocks(name, device="meta")
    patch = model.patch_embed.patch_size[0]
    assert model(torch.empty(2, 3, 3 * patch, 5 * patch, device="meta")).shape == (2, 3)


@pytest.mark.parametrize("name", SMALLEST)
def test_forward_backward_at_any_size(name):
    torch.manual_seed(0)
    model = two_blocks(name, drop_path_rate=0.1)
    patch = model.patch_embed.patch_size[0]
    loss = 0.0
    for h, w in SIZES:
        out = model(torch.randn(1, 3, h * patch, w * patch))
        assert out.shape == (1, 3) and torch.isfinite(out).all()
        loss = loss + out.square().mean()
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"parameters without a finite gradient: {no_grad}"

    model.eval()
    x = torch.randn(2, 3, 3 * patch, 5 * patch)
    with torch.no_grad():
        set_fused(model, True)
        fused = model(x)
        set_fused(model, False)
        explicit = model(x)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_rope_changes_the_output_and_is_shared_or_per_layer_its_tables_not_in_the_state_dict(kind):
    model = tiny(f"vit_rope_tiny_patch16_{kind}_224", init_values=1.0).eval()  # LayerScale 1: attention matters
    expected_keys = [] if kind == "axial" else ["pos_encoding.0.freqs", "pos_encoding.1.freqs"]
    assert [k for k in model.state_dict() if "pos_encoding" in k] == expected_keys
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        flipped = model(x.flip(-1))
    assert (out - flipped).abs().max() > 1e-4  # positions are seen: mirrored input, different output
    if kind == "axial":
        assert len(model.pos_encoding) == 1 and isinstance(model.pos_encoding[0], RoPE2D)
        assert not list(model.pos_encoding.parameters())
    else:
        assert len(model.pos_encoding) == len(model.blocks)
        assert not torch.equal(model.pos_encoding[0].freqs, model.pos_encoding[1].freqs)  # frequencies per layer


def _state_between_calls(model: torch.nn.Module) -> list[str]:
    """Names of tensors a model holds outside its parameters and buffers (caches, saved tables)."""
    found = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                continue
            values = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else []
            values = [*values, value]
            if any(isinstance(v, torch.Tensor) for v in values):
                found.append(f"{name}.{attr}")
    return found


GRAD_MODES = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "enable_grad": torch.enable_grad}


@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("order", list(itertools.permutations(GRAD_MODES)), ids="-".join)
def test_every_order_of_grad_modes_then_training(kind, order):
    """Tables made under inference_mode must never reach a later backward (they cannot be saved for it)."""
    torch.manual_seed(0)
    model = tiny(f"vit_rope_tiny_patch16_{kind}_224", num_classes=4)
    x = torch.randn(2, 3, 48, 64)
    outputs = []
    for mode in order:
        model.train(mode == "enable_grad")
        with GRAD_MODES[mode]():
            out = model(x)
            if mode == "enable_grad":
                out.sum().backward()
        outputs.append(out.detach().clone() if mode != "enable_grad" else None)
    model.train()
    model(x).sum().backward()  # eval under inference_mode, then train at the same grid
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    evals = [o for o in outputs if o is not None]
    torch.testing.assert_close(evals[0], evals[1])  # both eval-mode calls give the same logits


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_no_state_grows_with_the_number_of_input_sizes(kind):
    model = tiny(f"vit_rope_tiny_patch16_{kind}_224").eval()
    with torch.no_grad():
        for h in range(1, 9):
            for w in range(1, 9):
                model(torch.randn(1, 3, 16 * h, 16 * w))
    assert _state_between_calls(model) == []


def test_policy_device_and_dtype_changes_take_effect_after_a_forward():
    model = tiny("vit_rope_tiny_patch16_axial_224", img_size=32, init_values=1.0).eval()  # attention matters
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        before = model(x)
        model.set_resolution_policy("interpolate")
        after = model(x)
        fresh = tiny("vit_rope_tiny_patch16_axial_224", img_size=32, resolution_policy="interpolate").eval()
        fresh.load_state_dict(model.state_dict())
        torch.testing.assert_close(after, fresh(x))
        assert (before - after).abs().max() > 1e-4
        double = model.double()(x.double())
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), after, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,kwargs", [("vit_rope_tiny_patch16_mixed_224", {}),
                                         ("vit_rope_tiny_patch16_string_mixed_224", {}),
                                         ("vit_rope_tiny_patch16_lookhere_224", {"head_hidden_dim": 64})])
def test_factory_device_and_dtype_reach_every_module(name, kwargs):
    """timm's ``create_model(..., device=, dtype=)``: our modules (RoPE, STRING, an MLP head) go where timm's do; on
    the meta device a forward with autograd gives the output's shape, as timm's model tests run it."""
    model = timm.create_model(name, depth=2, device="meta", **kwargs)
    assert {t.device.type for t in itertools.chain(model.parameters(), model.buffers())} == {"meta"}
    assert model(torch.empty(2, 3, 32, 48, device="meta")).shape == (2, 1000)
    with torch.device("meta"):  # built under a device context too (timm's tests build config checks so)
        assert timm.create_model(name, depth=2, **kwargs)(torch.empty(1, 3, 32, 32)).shape == (1, 1000)
    model.reset_classifier(5)
    assert {p.device.type for p in model.head.parameters()} == {"meta"}
    double = timm.create_model(name, depth=2, dtype=torch.float64, **kwargs)
    assert {p.dtype for p in double.parameters()} == {torch.float64}
    assert double(torch.randn(1, 3, 32, 32, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("name", ["vit_rope_tiny_patch16_axial_224", "vit_rope_tiny_patch16_mixed_ape_224"])
def test_empty_batch_gives_empty_outputs_as_timm(name):
    model = tiny(name, reg_tokens=2)
    x = torch.randn(0, 3, 48, 64)
    model.train()
    out = model(x)
    assert out.shape == (0, 5)
    out.sum().backward()
    model.eval()
    with torch.inference_mode():
        assert model(x).shape == (0, 5)
        assert model.forward_features(x).shape == (0, 3 + 12, 192)
        final, inter = model.forward_intermediates(x, indices=1)
        assert final.shape == (0, 3 + 12, 192) and inter[0].shape == (0, 192, 3, 4)
    reference = timm.create_model("vit_tiny_patch16_224", num_classes=5, depth=2).eval()
    with torch.inference_mode():
        assert reference(torch.randn(0, 3, 224, 224)).shape == out.shape  # what timm's own ViT gives


@pytest.mark.parametrize("theta", [0.0, -10.0, float("nan"), float("inf")])
@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_bad_theta_is_refused_with_its_value(kind, theta):
    with pytest.raises(ValueError, match=rf"rope_theta.*{theta}"):
        tiny(f"vit_rope_tiny_patch16_{kind}_224", rope_theta=theta)


def test_timm_api():
    model = tiny(img_size=64)
    x = torch.randn(2, 3, 64, 48)
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 4 * 3, 192)
    assert model.forward_head(feats).shape == (2, 5)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 192)

    final, inter = model.forward_intermediates(x)
    assert final.shape == feats.shape and [t.shape for t in inter] == [(2, 192, 4, 3)] * 2
    torch.testing.assert_close(final, feats)
    inter = model.forward_intermediates(x, indices=[0], output_fmt="NLC", intermediates_only=True,
                                        return_prefix_tokens=True)
    assert inter[0][0].shape == (2, 12, 192) and inter[0][1].shape == (2, 1, 192)
    out = model.forward_intermediates(x, indices=1, output_dict=True, stop_early=True)
    assert set(out) == {"image_intermediates", "image_features"}

    features = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=3, features_only=True, out_indices=(1, 2))
    assert [f.shape for f in features(x)] == [(2, 192, 4, 3)] * 2

    model.reset_classifier(7)
    assert model(x).shape == (2, 7)
    assert "pos_encoding.0.freqs" in model.no_weight_decay() and "pos_encoding.1.freqs" in model.no_weight_decay()
    assert isinstance(tiny(drop_path_rate=0.2).blocks[-1].drop_path1, DropPath)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_ape_variant_resamples_its_position_embedding(kind):
    model = tiny(f"vit_rope_tiny_patch16_{kind}_ape_224", img_size=32).eval()
    assert model.pos_embed.shape == (1, 4, 192)  # patch tokens only, as DeiT-III
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 64)).shape == (1, 5)


def test_bad_input_errors():
    model = tiny()
    with pytest.raises(ValueError, match=r"50x64.*patch size 16x16"):
        model(torch.randn(1, 3, 50, 64))
    with pytest.raises(ValueError, match=r"head_dim=50"):
        timm.create_model("vit_rope_tiny_patch16_axial_224", embed_dim=150, num_heads=3)
    with pytest.raises(ValueError, match=r"axial, mixed"):
        RoPEVisionTransformer(encoding="spiral", embed_dim=64, num_heads=2, depth=1)


@pytest.mark.parametrize("kwargs", [{"reg_tokens": 4}, {"class_token": False, "reg_tokens": 2, "global_pool": "avg"}])
def test_ape_with_prefix_rows_covers_every_prefix_token(kwargs):
    """With ``no_embed_class=False`` the APE has a row per class and register token, as in timm's ViT."""
    model = tiny("vit_rope_tiny_patch16_axial_ape_224", img_size=64, no_embed_class=False, **kwargs).eval()
    torch.nn.init.normal_(model.pos_embed)
    P = model.num_prefix_tokens
    assert model.pos_embed.shape == (1, P + 16, 192)
    tokens = torch.randn(2, 4, 4, 192)  # [B, h, w, C] at the built grid: the APE is added as it is
    prefix = [t.expand(2, -1, -1) for t in (model.cls_token, model.reg_token) if t is not None]
    expected = torch.cat([*prefix, tokens.flatten(1, 2)], dim=1) + model.pos_embed
    torch.testing.assert_close(model._pos_embed(tokens), expected, atol=0, rtol=0)
    other = model._pos_embed(torch.zeros(2, 3, 5, 192))  # another grid: prefix rows kept, patch rows resampled
    torch.testing.assert_close(other[:, :P] - torch.cat(prefix, dim=1), model.pos_embed[:, :P].expand(2, -1, -1))
    with torch.inference_mode():
        for h, w in SIZES:
            assert model(torch.randn(2, 3, 16 * h, 16 * w)).shape == (2, 5)


@pytest.mark.parametrize(("name", "default"), [("vit_rope_tiny_patch16_mixed_224", "extrapolate"),
                                               ("vit_rope_small_patch16_dinov3", "normalized")])
def test_set_resolution_policy_none_restores_the_default(name, default):
    model = tiny(name, resolution_policy="yarn" if default == "extrapolate" else "extrapolate")
    model.set_resolution_policy(None)
    assert model.resolution_policy.name == default
    assert all(rope.policy.name == default for rope in model.pos_encoding)
    with pytest.raises(ValueError, match=r"Policy options \['yarn_beta'\] go with a policy name"):
        model.set_resolution_policy({"name": "yarn"}, yarn_beta=4.0)


@pytest.mark.parametrize(("old", "new"), [("rope_kind", "encoding"), ("rope_policy", "resolution_policy"),
                                          ("lh_config", "encoding_options")])
def test_earlier_model_arguments_are_refused_as_any_unknown_one(old, new):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        tiny("vit_rope_tiny_patch16_lookhere_224", **{old: "lh90"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'official'"):
        tiny("vit_rope_tiny_patch16_lookhere_224", official=True)
    model = tiny()
    for name in ("rope", "rope_kind", "rope_policy", "set_rope_policy", "fold_string_"):
        assert not hasattr(model, name), name


def test_weights_saved_under_rope_load_as_the_encodings():
    """Checkpoints of RoPE-ViT's layout, and ours before every kind lived at ``pos_encoding``, keep the mixed
    frequencies under ``rope.``: ``load_state_dict`` and ``load_weights`` take them."""
    source, target = tiny(), tiny()
    old = {key.replace("pos_encoding.", "rope.", 1): value for key, value in source.state_dict().items()}
    assert "rope.0.freqs" in old
    target.load_state_dict(old, strict=True)
    assert torch.equal(target.pos_encoding[1].freqs, source.pos_encoding[1].freqs)
    fresh = tiny()
    report = vit_rope.load_weights(fresh, old)
    assert report.rope_freqs_loaded and torch.equal(fresh.pos_encoding[0].freqs, source.pos_encoding[0].freqs)


@pytest.mark.parametrize("option", [{"rope_min_period": 0.5}, {"rope_max_period": 90.0},
                                    {"rope_normalize_coords": "max"}])
@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_dinov3_rope_options_are_refused_for_other_kinds(kind, option):
    with pytest.raises(ValueError, match=rf"encoding='dinov3'.*{kind}"):
        tiny(f"vit_rope_tiny_patch16_{kind}_224", **option)


def test_patch_dropout_keeps_tokens_and_nchw_intermediates_say_what_to_do():
    model = tiny(patch_drop_rate=0.5).train()
    assert model.forward_features(torch.randn(2, 3, 64, 64)).shape == (2, 1 + 8, 192)
    with pytest.raises(ValueError, match=r"Patch dropout \(patch_drop_rate=0.5\).*model.eval\(\).*NLC"):
        model.forward_intermediates(torch.randn(2, 3, 64, 96))
    assert model.forward_intermediates(torch.randn(2, 3, 64, 96), output_fmt="NLC")[1][0].shape[1] < 24
