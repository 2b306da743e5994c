"""Models for evaluation (vit_rope.eval.loading): train.py checkpoints rebuilt (EMA first), timm models with a local
weights file, and the refusal of a mixed model whose learned frequencies were not in its file; and
``create_from_checkpoint``: the model each format describes, built and loaded, giving the source model's outputs; files
whose keys name no model need ``model=``, and say so."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from helpers.checkpoints import meta_keys, save_source
from helpers.evaluation import ROPE, write_checkpoint
from helpers.models import assert_same_outputs, timm_eva
from studies.results import is_run
from vit_rope.errors import UserError
from vit_rope.eval.loading import create_from_checkpoint, load_pretrained, load_trained, model_label
from vit_rope.models.checkpoint import WeightsNotLoadedWarning
from vit_rope.train.state import load_checkpoint, save_checkpoint
from vit_rope.weights import tensor_rows


def test_ema_weights_preferred(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "ema.pth", ema_bias=7.0)
    assert load_trained(path).model.head.bias.tolist() == [7.0] * 3
    assert load_trained(path, use_ema=False).model.head.bias.tolist() != [7.0] * 3


def test_pretrained_file(tmp_path: Path) -> None:
    """--pretrained-file weights load through timm's pretrained path; a given num_classes keeps the file's head; a
    file that is not one, does not fit, or that weights_only refuses is one error line, not a traceback."""
    torch.manual_seed(0)
    source = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=3, img_size=32)
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    loaded = load_pretrained("vit_tiny_patch16_224", str(tmp_path / "vit.pth"), 10, 32,
                                      {"depth": 1, "num_classes": 3})
    assert loaded.train_size == 32 and loaded.classes is None
    assert all(torch.equal(value, loaded.model.state_dict()[key]) for key, value in source.state_dict().items())
    with pytest.raises(UserError, match="vit.pth does not fit vit_tiny_patch16_224"):
        load_pretrained("vit_tiny_patch16_224", str(tmp_path / "vit.pth"), 10, 32, {"depth": 2})
    for missing in (tmp_path / "absent.pth", tmp_path):  # no such file; a folder
        with pytest.raises(UserError, match=f"--pretrained-file {missing} is not a file: pass the path of a weights"):
            load_pretrained("vit_tiny_patch16_224", str(missing), 10, 32, {"depth": 1})
    torch.save({"model": source.state_dict(), "run_dir": Path("/x")}, tmp_path / "pickled.pth")
    with pytest.raises(UserError, match="pickled.pth"):
        load_pretrained("vit_tiny_patch16_224", str(tmp_path / "pickled.pth"), 3, 32, {"depth": 1})
    # a train.py checkpoint loaded as plain weights would be rebuilt at the registry's size (224), not its own
    path = write_checkpoint(tmp_path / "run.pth")
    with pytest.raises(UserError, match=f"--pretrained-file {path} is a train.py checkpoint: pass it as --checkpoint"):
        load_pretrained(ROPE, str(path), 3, None, {"depth": 1})


def test_learned_frequencies_checked_for_pretrained_files(tmp_path: Path, capsys) -> None:
    """A mixed model is evaluated with a mixed checkpoint (refused with an axial one: test_evaluate's bad input,
    axial_into_mixed); without a file (timing runs) it keeps its random weights, as before."""
    kwargs = {"depth": 2, "num_classes": 3}
    mixed = save_source("mixed", tmp_path / "mixed.pth", num_classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsNotLoadedWarning)
        loaded = load_pretrained(ROPE, str(mixed), 3, 32, kwargs)
    assert loaded.model.load_report.rope_freqs_loaded and loaded.model.load_report.initialised == {}
    expected = torch.load(mixed, weights_only=True)["model"]["pos_encoding.1.freqs"]
    assert torch.equal(loaded.model.pos_encoding[1].freqs, expected)
    random = load_pretrained(ROPE, None, 3, 32, {"depth": 2})
    assert not hasattr(random.model, "load_report") and capsys.readouterr().out == ""
    # labelled by the file, as checkpoints are by theirs (two files, two rows), or as random
    assert (loaded.label, random.label) == (f"{ROPE} (depth=2) ({mixed})", f"{ROPE} (depth=2, random init)")


def test_plain_vit_into_axial_model_is_evaluated_with_a_warning(tmp_path: Path, capsys) -> None:
    """No learned frequencies are missing, but the LayerScale that the file lacked is said."""
    vit = save_source("plain_vit", tmp_path / "vit.pth", num_classes=3)
    axial = "vit_rope_tiny_patch16_axial_224"
    loaded = load_pretrained(axial, str(vit), 3, 32, {"depth": 2, "num_classes": 3})
    assert loaded.model.load_report.rope_freqs_loaded
    assert capsys.readouterr().out.startswith(f"warning: {vit} lacks weights of {axial}, "
                                              "which were initialised instead: LayerScale set to the identity")


def test_checkpoint_of_a_run_seeded_from_pretrained_weights(tmp_path: Path) -> None:
    """train.py can start a mixed model from a plain ViT (model_kwargs pretrained=true): its checkpoint holds the
    trained frequencies, so evaluation accepts it, without the seed file (gone here) and without a warning."""
    seed = save_source("plain_vit", tmp_path / "seed.pth")
    path = write_checkpoint(tmp_path / "run.pth")
    ckpt = load_checkpoint(path)
    ckpt["model_kwargs"] = {**ckpt["model_kwargs"], "pretrained": True, "pretrained_cfg_overlay": {"file": str(seed)}}
    save_checkpoint(ckpt, path)
    seed.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsNotLoadedWarning)
        loaded = load_trained(path)
    assert not hasattr(loaded.model, "load_report")
    assert torch.equal(loaded.model.pos_encoding[0].freqs, ckpt["model"]["pos_encoding.0.freqs"])


def test_labels_name_what_changed_the_architecture(tmp_path: Path) -> None:
    """A patch-8, depth-1 checkpoint does not read as the registry's patch-16, depth-12 model; the checkpoint path
    stays the last parenthesised part, which the study matches runs by."""
    assert model_label("m", {"num_classes": 3, "img_size": 32, "drop_path_rate": 0.1, "dynamic_img_size": True,
                             "pretrained": True, "pretrained_cfg_overlay": {"file": "w.pth"}}) == "m"
    assert model_label("m", {"patch_size": 4, "depth": 6, "embed_dim": 96, "num_heads": 2, "drop_rate": 0.1}, "x") == (
        "m (patch_size=4, depth=6, embed_dim=96, num_heads=2, x)")
    (tmp_path / "run").mkdir()
    path = write_checkpoint(tmp_path / "run" / "last.pth", patch_size=8, depth=1)
    label = load_trained(path).label
    assert label == f"{ROPE} (depth=1, patch_size=8) ({path})"  # in the order of model_kwargs
    assert is_run(label, {"output": str(tmp_path / "run")})


def test_weights_that_do_not_fit_the_rebuilt_model_are_listed(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "run.pth")
    ckpt = load_checkpoint(path)
    extra = {f"blocks.{i}.extra": torch.zeros(1) for i in range(12)}
    ckpt["model"] = {**{k: v for k, v in ckpt["model"].items() if k != "blocks.1.mlp.fc2.bias"}, **extra,
                     "head.weight": torch.zeros(5, 192)}
    save_checkpoint(ckpt, path)
    with pytest.raises(UserError) as info:
        load_trained(path, use_ema=False)
    assert str(info.value) == (
        f"the weights in {path} do not fit {ROPE} rebuilt with {ckpt['model_kwargs']} (1 missing key: "
        "blocks.1.mlp.fc2.bias; 12 unexpected keys: " + ", ".join(list(extra)[:10]) + ", ... (2 more); 1 key of "
        "another shape: head.weight (5, 192) in the file, (3, 192) in the model); the checkpoint was written by "
        "another version of the model's code")


def test_a_weights_file_gives_the_model_its_class_count(tmp_path: Path) -> None:
    """--pretrained-file without num_classes: the file's classifier decides, not the registry's 1000."""
    source = save_source("mixed", tmp_path / "three.pth", num_classes=3)
    assert load_pretrained(ROPE, str(source), 7, 32, {"depth": 2}).model.num_classes == 3
    assert load_pretrained(ROPE, str(source), 7, 32, {"depth": 2, "num_classes": 3}).model.num_classes == 3
    with pytest.raises(UserError) as info:  # a num_classes the file's classifier does not have: both sizes named
        load_pretrained(ROPE, str(source), 7, 32, {"depth": 2, "num_classes": 5})
    assert str(info.value) == (f"--pretrained-file {source} does not fit {ROPE} (The checkpoint does not fit "
                               "RoPEVisionTransformer: classifier of another size: the checkpoint has 3 classes, the "
                               "model 5.); pick the model it was trained as, or --model-kwargs to match it")


def test_timm_weights_that_do_not_fit_name_the_keys(tmp_path: Path) -> None:
    """torch's load error puts the keys on lines of their own: all of it reaches the one error line."""
    torch.save(timm.create_model("vit_tiny_patch16_224", depth=2, num_classes=3).state_dict(), tmp_path / "two.pth")
    with pytest.raises(UserError, match=r"two.pth does not fit vit_tiny_patch16_224 \(Error\(s\) in loading state_dict "
                                        r"for VisionTransformer: Unexpected key\(s\) in state_dict: \"blocks.1"):
        load_pretrained("vit_tiny_patch16_224", str(tmp_path / "two.pth"), 3, 32, {"depth": 1})


def test_tensor_rows_reads_the_classifier_without_loading_the_file(tmp_path: Path) -> None:
    head = {"head.weight": torch.zeros(7, 4), "blocks.0.w": torch.zeros(2, 2)}
    save_file(head, tmp_path / "w.safetensors")
    torch.save({"model": head, "model_ema": {**head, "head.weight": torch.zeros(9, 4)}}, tmp_path / "ema.pth")
    torch.save({"state_dict": {f"module.{k}": v for k, v in head.items()}}, tmp_path / "ddp.pth")
    assert tensor_rows(tmp_path / "w.safetensors", "head.weight") == 7
    assert tensor_rows(tmp_path / "ema.pth", "head.weight") == 9  # EMA first, as timm's loader
    assert tensor_rows(tmp_path / "ddp.pth", "head.weight") == 7
    assert tensor_rows(tmp_path / "w.safetensors", "head.fc.weight") is None
    (tmp_path / "bad.pth").write_bytes(b"garbage")
    assert tensor_rows(tmp_path / "bad.pth", "head.weight") is None  # the full read names what is wrong


def test_a_train_checkpoint_is_rebuilt_as_trained(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "best.pth")
    model = create_from_checkpoint(path)
    expected = load_trained(path).model
    assert model.encoding_kind == "mixed" and len(model.blocks) == 2 and model.num_classes == 3
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    with pytest.raises(ValueError, match=r"train.py checkpoint.*\['num_classes'\] do not apply"):
        create_from_checkpoint(path, num_classes=5)


@pytest.mark.parametrize(("timm_name", "ours", "file", "size"), [
    ("vit_small_patch16_rope_mixed_224", "vit_rope_small_patch16_mixed_224", "port.safetensors", 224),
    ("vit_small_patch16_rope_mixed_ape_224", "vit_rope_small_patch16_mixed_ape_224", "port.safetensors", 224),
    ("vit_small_patch16_rope_ape_224", "vit_rope_small_patch16_axial_ape_224", "port.safetensors", 224),
    *[(name, name.replace("vit_", "vit_rope_", 1), file, 256) for file in ("timm.pth", "meta.pth")
      for name in ("vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3_qkvb")],
])
def test_timms_rope_vit_ports_and_timms_and_metas_dinov3_name_their_model(tmp_path: Path, timm_name: str, ours: str,
                                                                          file: str, size: int) -> None:
    """timm's RoPE-ViT ports (4 classes, a safetensors file) and DINOv3 in timm's or Meta's keys (a .pth file)."""
    theirs = timm_eva(timm_name, depth=2, **({"num_classes": 4} if file == "port.safetensors" else {}))
    state = meta_keys(theirs.state_dict()) if file == "meta.pth" else theirs.state_dict()
    (save_file if file.endswith(".safetensors") else torch.save)(state, str(tmp_path / file))
    model = create_from_checkpoint(tmp_path / file).eval()
    assert model.default_cfg["architecture"] == ours and len(model.blocks) == 2
    assert model.num_classes == theirs.num_classes
    assert_same_outputs(model, theirs, [(size, size)])


def test_keys_that_name_no_model_need_it_named(tmp_path: Path) -> None:
    deit = timm.create_model("deit3_small_patch16_224", depth=2, num_classes=3)
    path = tmp_path / "deit.pth"
    torch.save(deit.state_dict(), path)
    with pytest.raises(ValueError, match="do not say which model it is.*pass model="):
        create_from_checkpoint(path)
    model = create_from_checkpoint(path, model="vit_rope_small_patch16_axial_ape_224")
    assert len(model.blocks) == 2 and torch.equal(model.blocks[1].attn.qkv.weight, deit.blocks[1].attn.qkv.weight)
    with pytest.raises(FileNotFoundError, match="No checkpoint at"):
        create_from_checkpoint(tmp_path / "missing.pth")


def test_a_transformers_dinov3_folder_gives_transformers_outputs(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.DINOv3ViTConfig(hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                                          intermediate_size=1536, num_register_tokens=4)  # as DINOv3's own
    torch.manual_seed(0)
    hf = transformers.DINOv3ViTModel(config).eval()
    with torch.no_grad():  # LayerScale and biases off their initial values, so that every weight shows
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    hf.save_pretrained(tmp_path / "hf")
    model = create_from_checkpoint(tmp_path / "hf").eval()
    assert model.encoding_kind == "dinov3" and len(model.blocks) == 2
    named = create_from_checkpoint(tmp_path / "hf", model=model.default_cfg["architecture"], depth=2).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.inference_mode():
        expected = hf(pixel_values=x).last_hidden_state
        for built in (model, named):
            torch.testing.assert_close(built.forward_features(x), expected, atol=1e-4, rtol=1e-4)
