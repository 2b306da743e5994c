"""Weights users already have: timm's RoPE-ViT ports (parity of logits), original RoPE-ViT, plain ViT / DeiT-III;
what was initialised rather than loaded, and unreadable files."""

import warnings
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope  # noqa: F401  (registers the models)
from helpers.checkpoints import CORRUPT, save_source, write_corrupt
from vit_rope.errors import UserError
from vit_rope.models.checkpoint import LAYERSCALE, ROPE_FREQS, WeightsNotLoadedWarning, convert_state_dict, load_weights
from vit_rope.train.state import load_checkpoint
from vit_rope.weights import UnreadableCheckpointError

# (timm's port, ours, the file's format: each twice)
PAIRS = [
    ("vit_small_patch16_rope_224", "vit_rope_small_patch16_axial_224", "pth"),
    ("vit_small_patch16_rope_mixed_224", "vit_rope_small_patch16_mixed_224", "safetensors"),
    ("vit_small_patch16_rope_ape_224", "vit_rope_small_patch16_axial_ape_224", "pth"),
    ("vit_small_patch16_rope_mixed_ape_224", "vit_rope_small_patch16_mixed_ape_224", "safetensors"),
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


@pytest.mark.parametrize("port,ours,fmt", PAIRS)
def test_parity_with_timm_ports_through_create_model(port, ours, fmt, tmp_path):
    reference = timm_port(port, depth=3)
    path = tmp_path / f"weights.{fmt}"
    if fmt == "pth":
        torch.save(reference.state_dict(), path)
    else:
        save_file(reference.state_dict(), str(path))
    model = timm.create_model(ours, depth=3, pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    assert_same_logits(reference, model)


def test_parity_full_depth_mixed(tmp_path):
    """All 12 blocks' learned frequencies (at the tiny width: the small one is the tests above')."""
    reference = timm_port("vit_small_patch16_rope_mixed_224", num_classes=10, embed_dim=192, num_heads=3)
    torch.save({"model": reference.state_dict()}, tmp_path / "w.pth")
    model = timm.create_model("vit_rope_small_patch16_mixed_224", num_classes=10, embed_dim=192, num_heads=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsNotLoadedWarning)  # everything is in the checkpoint: no warning
        report = load_weights(model, tmp_path / "w.pth")
    assert report.initialised == {} and report.skipped == () and report.rope_freqs_loaded and report.summary() == ""
    assert set(report.loaded) == set(model.state_dict()) and model.load_report is report
    assert_same_logits(reference, model.eval())


def test_original_rope_vit_checkpoint_layout(tmp_path):
    """naver-ai/rope-vit stores mixed frequencies as ``freqs [2, depth, nh * D/2]`` beside grid buffers."""
    reference = timm_port("vit_small_patch16_rope_mixed_ape_224", depth=2)
    sd = {k.replace("rope.freqs", "freqs"): v for k, v in reference.state_dict().items()}
    sd["freqs"] = sd["freqs"].reshape(2, 2, -1)
    sd["freqs_t_x"], sd["freqs_t_y"] = torch.arange(196.0) % 14, torch.arange(196.0) // 14
    torch.save({"model": sd}, tmp_path / "naver.pth")
    model = timm.create_model("vit_rope_small_patch16_mixed_ape_224", depth=2)
    assert load_weights(model, tmp_path / "naver.pth").initialised == {}
    assert_same_logits(reference, model.eval(), sizes=[(224, 224)])


def test_plain_vit_into_rope_ape_model():
    """timm ViT (class-token APE row, no LayerScale) -> RoPE+APE: weights carried, APE stripped, identity scales."""
    source = timm.create_model("vit_small_patch16_224", depth=2)
    model = timm.create_model("vit_rope_small_patch16_axial_ape_224", depth=2)
    freqs_before = model.pos_encoding[0].freqs.clone()
    with pytest.warns(WeightsNotLoadedWarning, match=r"LayerScale set to the identity \(blocks.0.ls1.gamma, ..., "
                      r"blocks.1.ls2.gamma: 4 tensors\)\. Fine for fine-tuning") as record:
        sd = convert_state_dict(source.state_dict(), model)
    assert ROPE_FREQS not in str(record[0].message)  # axial frequencies are fixed: nothing learned is missing
    model.load_state_dict(sd)
    torch.testing.assert_close(model.pos_embed, source.pos_embed[:, 1:])
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    assert (model.blocks[0].ls1.gamma == 1).all()
    assert torch.equal(model.pos_encoding[0].freqs, freqs_before)


def test_deit3_into_rope_mixed_model_drops_the_ape():
    source = timm.create_model("deit3_small_patch16_224", depth=2)
    model = timm.create_model("vit_rope_small_patch16_mixed_224", depth=2)
    freqs = [r.freqs.detach().clone() for r in model.pos_encoding]
    with pytest.warns(WeightsNotLoadedWarning, match=rf"{ROPE_FREQS} \(pos_encoding.0.freqs, pos_encoding.1.freqs\)"):
        sd = convert_state_dict(source.state_dict(), model)
    assert "pos_embed" not in sd
    model.load_state_dict(sd)
    torch.testing.assert_close(model.blocks[0].ls2.gamma, source.blocks[0].ls2.gamma)
    assert all(torch.equal(r.freqs, f) for r, f in zip(model.pos_encoding, freqs, strict=True))  # kept, not loaded


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
    with pytest.raises(ValueError, match=r"1 missing key: blocks.1.mlp.fc2.bias; 1 unexpected key: blocks.0.attn"):
        convert_state_dict(sd, model)
    reshaped = {**model.state_dict(), "norm.weight": torch.ones(3), "norm.bias": torch.ones(3)}
    with pytest.raises(ValueError, match=r"2 keys of another shape: norm.weight \(3,\) in the file"):
        convert_state_dict(reshaped, model)  # counts in words
    mixed = timm.create_model("vit_small_patch16_rope_mixed_224", depth=2).state_dict()
    with pytest.raises(ValueError, match="not a mixed RoPE model"):
        convert_state_dict(mixed, model)
    with pytest.raises(ValueError, match="depth 3"):
        convert_state_dict(mixed, timm.create_model("vit_rope_small_patch16_mixed_224", depth=3))
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        load_weights(model, tmp_path / "missing.pth")
    torch.save(sd, tmp_path / "misfit.pth")  # a readable file whose keys do not fit: not called corrupt
    with pytest.raises(ValueError, match="does not fit") as info:
        load_weights(model, tmp_path / "misfit.pth")
    assert not isinstance(info.value, UnreadableCheckpointError)


class _Payload:
    """Arbitrary pickled object: weights_only loading must refuse it."""


# ---- what a checkpoint lacked: warned, reported, marked on the model -------------------------------------------------

TINY_MIXED = "vit_rope_tiny_patch16_mixed_224"


@pytest.mark.parametrize("kind", ["axial", "plain_vit"])
def test_checkpoint_without_learned_frequencies_is_warned_and_reported(kind, tmp_path):
    path = save_source(kind, tmp_path / f"{kind}.pth")
    model = timm.create_model(TINY_MIXED, depth=2)
    initial = [rope.freqs.detach().clone() for rope in model.pos_encoding]
    with pytest.warns(WeightsNotLoadedWarning) as record:
        report = load_weights(model, path)
    assert len(record) == 1  # once, naming the file, what was initialised and why it matters
    message = str(record[0].message)
    assert message.startswith(f"{path} lacks weights of the model")
    assert "pos_encoding.0.freqs, pos_encoding.1.freqs" in message
    assert message.endswith("Fine for fine-tuning; for evaluation, load a checkpoint that has them.")
    assert report.initialised[ROPE_FREQS] == ("pos_encoding.0.freqs", "pos_encoding.1.freqs")
    assert not report.rope_freqs_loaded
    assert (LAYERSCALE in report.initialised) == (kind == "plain_vit")  # timm's augreg ViT has no LayerScale
    assert report.source == str(path) and model.load_report is report
    assert "blocks.1.attn.qkv.weight" in report.loaded and "pos_encoding.0.freqs" not in report.loaded
    assert all(torch.equal(rope.freqs, f) for rope, f in zip(model.pos_encoding, initial, strict=True))


def test_mixed_checkpoint_into_mixed_model_loads_everything(tmp_path):
    path = save_source("mixed", tmp_path / "mixed.pth")
    stale = timm.create_model(TINY_MIXED, depth=2)
    with pytest.warns(WeightsNotLoadedWarning):
        load_weights(stale, save_source("axial", tmp_path / "axial.pth"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsNotLoadedWarning)
        report = load_weights(stale, path)  # a later complete load replaces the mark of the earlier one
    assert stale.load_report is report and report.rope_freqs_loaded and report.initialised == {}
    expected = torch.load(path, weights_only=True)["model"]
    assert all(torch.equal(stale.state_dict()[key], value) for key, value in expected.items())


def test_classifier_of_another_shape_or_none_is_reported(tmp_path):
    path = save_source("mixed", tmp_path / "mixed.pth", num_classes=3)
    model = timm.create_model(TINY_MIXED, depth=2, num_classes=5)
    another_size = "classifier of another size: the checkpoint has 3 classes, the model 5"
    with pytest.warns(WeightsNotLoadedWarning, match=f"initialised instead: {another_size} \\(head.weight, head.bias"):
        report = load_weights(model, path)
    assert report.initialised == {another_size: ("head.weight", "head.bias")} and report.head_reason == another_size
    assert report.skipped == ("head.weight", "head.bias") and report.rope_freqs_loaded
    headless = timm.create_model(TINY_MIXED, depth=2, num_classes=0)  # features: the checkpoint's head is dropped
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsNotLoadedWarning)
        report = load_weights(headless, path)
        via_timm = timm.create_model(TINY_MIXED, depth=2, num_classes=0, pretrained=True,
                                     pretrained_cfg_overlay=dict(file=str(path)))
    assert report.skipped == ("head.weight", "head.bias") and report.initialised == {} and report.head_reason is None
    torch.testing.assert_close(via_timm.blocks[1].mlp.fc2.weight, headless.blocks[1].mlp.fc2.weight)


def timm_load(path: Path, **kwargs) -> tuple[torch.nn.Module, list[str]]:
    """A 2-block tiny mixed model built by timm with ``pretrained=True`` from ``path``, and the warnings it gave."""
    kwargs.setdefault("pretrained_cfg_overlay", dict(file=str(path)))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", WeightsNotLoadedWarning)
        model = timm.create_model(TINY_MIXED, depth=2, pretrained=True, **kwargs)
    return model, [str(w.message) for w in record if issubclass(w.category, WeightsNotLoadedWarning)]


def test_timm_num_classes_of_another_size_reports_the_classifier_initialised(tmp_path):
    """timm drops the classifier after our filter when num_classes differs from the pretrained config's (1000): the
    report and the warning say so, with both class counts, and the head holds its initialisation."""
    path = save_source("mixed", tmp_path / "mixed.pth", num_classes=3)
    torch.manual_seed(0)
    fresh = timm.create_model(TINY_MIXED, depth=2, num_classes=5).head.weight.detach().clone()
    torch.manual_seed(0)
    model, warned = timm_load(path, num_classes=5)
    reason = "classifier of another size: the checkpoint has 3 classes, the model 5"
    assert model.load_report.head_reason == reason and model.load_report.initialised == {reason: ("head.weight",
                                                                                                  "head.bias")}
    assert "head.weight" not in model.load_report.loaded and model.load_report.skipped == ("head.weight", "head.bias")
    assert len(warned) == 1 and f"initialised instead: {reason} (head.weight, head.bias)" in warned[0]
    assert torch.equal(model.head.weight, fresh)
    assert torch.equal(model.blocks[1].attn.qkv.weight, torch.load(path, weights_only=True)["model"][
        "blocks.1.attn.qkv.weight"])


def test_timm_drops_a_fitting_classifier_and_the_report_says_how_to_keep_it(tmp_path):
    path = save_source("mixed", tmp_path / "mixed.pth", num_classes=3)
    model, warned = timm_load(path, num_classes=3)  # fits, but the pretrained config declares 1000 classes
    assert model.load_report.head_reason.startswith("classifier dropped by timm, as num_classes (3) differs from the "
                                                    "pretrained config's (1000): put num_classes=3 in "
                                                    "pretrained_cfg_overlay")
    assert len(warned) == 1 and "classifier dropped by timm" in warned[0]
    kept, warned = timm_load(path, num_classes=3, pretrained_cfg_overlay=dict(file=str(path), num_classes=3))
    assert kept.load_report.initialised == {} and warned == [] and "head.weight" in kept.load_report.loaded
    assert torch.equal(kept.head.weight, torch.load(path, weights_only=True)["model"]["head.weight"])


def test_timm_classifier_that_cannot_load_names_both_sizes_and_features_only_needs_none(tmp_path):
    path = save_source("mixed", tmp_path / "mixed.pth", num_classes=3)
    with pytest.raises(ValueError, match=r"classifier of another size: the checkpoint has 3 classes, the model "
                                         r"1000\.\ntimm loads the classifier as it is.*pass the checkpoint's class"):
        timm_load(path)  # num_classes 1000, as the pretrained config: timm would load the head strictly
    features, warned = timm_load(path, features_only=True, out_indices=(1,))
    assert warned == [] and features(torch.zeros(1, 3, 32, 32))[0].shape == (1, 192, 2, 2)


def test_timm_pretrained_path_warns_and_marks_the_model(tmp_path):
    model, warned = timm_load(save_source("axial", tmp_path / "axial.pth"))
    assert len(warned) == 1 and warned[0].startswith("The checkpoint lacks weights") and ROPE_FREQS in warned[0]
    assert not model.load_report.rope_freqs_loaded and model.load_report.source is None
    assert not hasattr(timm.create_model(TINY_MIXED, depth=2), "load_report")  # a new model is marked by nothing


# ---- unreadable files: an error naming the file and the fix, the library's message after ---------------------------

@pytest.mark.parametrize("name", list(CORRUPT))
def test_unreadable_file_is_an_error_naming_it(name, tmp_path):
    path = write_corrupt(tmp_path / name)
    model = timm.create_model(TINY_MIXED, depth=2)
    with pytest.raises(UnreadableCheckpointError) as info:
        load_weights(model, path)
    message = str(info.value)
    assert message.startswith(f"{path} is not a readable checkpoint: the file is truncated or corrupt")
    assert "download it again or save it again [" in message and CORRUPT[name] in message.split("[", 1)[1]
    assert not hasattr(model, "load_report")
    with pytest.raises(UserError) as info:
        load_checkpoint(path)  # train.py --resume / --finetune and vit_rope.evaluate --checkpoint
    assert str(info.value).startswith(f"{path} is not a vit-rope training checkpoint: torch.load failed, the file is "
                                      "truncated or corrupt (or not a weights file); download it again or save it")


def test_readable_files_of_the_wrong_kind_are_not_called_corrupt(tmp_path):
    """A valid safetensors file is no training checkpoint; a pickle that weights_only refuses keeps its own error
    (loading is weights-only)."""
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(UserError, match="is not a vit-rope training checkpoint") as info:
        load_checkpoint(tmp_path / "w.safetensors")
    assert "corrupt" not in str(info.value)
    torch.save({"model": model.state_dict(), "extra": _Payload()}, tmp_path / "unsafe.pth")
    with pytest.raises(UserError, match="is not a vit-rope training checkpoint: torch.load failed"):
        load_checkpoint(tmp_path / "unsafe.pth")
    with pytest.raises(RuntimeError, match="weights_only=True blocked"):
        load_weights(model, tmp_path / "unsafe.pth")


def test_a_trained_ape_dropped_by_a_rope_only_model_is_reported(tmp_path):
    source = timm.create_model("vit_rope_tiny_patch16_axial_ape_224", depth=2)
    torch.save(source.state_dict(), tmp_path / "ape.pth")
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=2)
    with pytest.warns(WeightsNotLoadedWarning, match=r"ape.pth has an absolute position embedding \(pos_embed\), "
                      r"which was not loaded.*for evaluation, load it into the \+APE variant\.$"):
        report = load_weights(model, tmp_path / "ape.pth")
    assert report.skipped == ("pos_embed",) and report.initialised == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same checkpoint into its own variant: nothing to say
        assert load_weights(source, tmp_path / "ape.pth").skipped == ()


def test_rope_vits_mixed_weights_load_into_string_over_mixed():
    """timm's mixed RoPE-ViT port into Cayley-STRING over mixed RoPE: the frequencies split per block, the basis at
    the identity, so the model is the port's function exactly."""
    port = timm.create_model("vit_small_patch16_rope_mixed_224", depth=2, num_classes=5).eval()
    string = timm.create_model("vit_rope_small_patch16_string_mixed_224", depth=2, num_classes=5).eval()
    with pytest.warns(WeightsNotLoadedWarning, match="STRING"):
        report = load_weights(string, port.state_dict())
    assert report.rope_freqs_loaded and not report.initialised.get(ROPE_FREQS)
    freqs = port.state_dict()["rope.freqs"]  # [2, depth, nh, D/2]
    for i, rope in enumerate(string.pos_encoding):
        torch.testing.assert_close(rope.freqs, freqs[:, i], rtol=0, atol=0)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(string(x), port(x), rtol=1e-4, atol=1e-4)


def test_a_folder_builds_a_feature_extractor(tmp_path):
    """``create_from_checkpoint(folder, features_only=True)``: the folder's model, through timm's loader."""
    features = vit_rope.create_from_checkpoint(Path(__file__).parents[1] / "fixtures" / "pape" / "pape_ri",
                                               features_only=True, out_indices=(1,))
    maps = features(torch.randn(1, 3, 64, 64))
    assert len(maps) == 1 and maps[0].shape[-2:] == (4, 4)
