"""The encodings beyond RoPE tables in the tools: the attention biases (LookHere, 2D-ALiBi) and the rotation kinds
(golden, STRING over mixed with p-RoPE, ComRoPE, LieRE). The harness's policy check (a bias has no frequencies for a
policy to scale, STRING takes those of its RoPE table), ``vit_rope.diagnose`` (attention entropy with the bias or under
block rotations; no frequencies to cover for a bias; from a weights file), and the factory that train.py's ``model`` /
``model_kwargs`` go through (a YAML LookHere ``config`` preset or dict in ``encoding_options``; a bad one is one error).
Their ONNX export: test_export.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import timm
import torch

from helpers.models import tiny
from vit_rope.errors import UserError
from vit_rope.eval.diagnostics import attention_entropy, main, without_positions
from vit_rope.eval.harness import check_sizes
from vit_rope.eval.loading import EvalModel
from vit_rope.models.registry import create_model

LOOKHERE = "vit_rope_tiny_patch16_lookhere_224"


@pytest.mark.parametrize("name, kwargs, taken, message", [
    ("vit_rope_tiny_patch16_alibi_224", {}, "interpolate", "m: Policy 'ntk' does not apply to alibi, an attention"),
    ("vit_rope_tiny_patch16_string_224", {"rope_string_base": "dinov3"}, "normalized", "does not apply to DINOv3"),
])
def test_the_harness_takes_the_policies_of_a_kind_and_refuses_the_others(name: str, kwargs: dict, taken: str,
                                                                         message: str) -> None:
    entry = EvalModel("m", timm.create_model(name, depth=1, **kwargs), 224)
    check_sizes([64], [entry], ["extrapolate", taken])
    with pytest.raises(UserError, match=message):
        check_sizes([64], [entry], ["extrapolate", "ntk"])


def test_attention_entropy_sees_the_bias() -> None:
    model = tiny(LOOKHERE).eval()
    x = torch.randn(2, 3, 64, 48)
    entropy = attention_entropy(model, x)
    assert all(0 < e <= math.log(1 + 12) for e in entropy)
    model.pos_encoding.scales = [0.0, 0.0]  # the same model without its masks and penalties attends more widely
    assert all(a < b for a, b in zip(entropy, attention_entropy(model, x), strict=True))


def test_diagnose_cli_on_a_bias_model(tmp_path: Path, capsys) -> None:
    argv = ["--model", LOOKHERE, "--random-init", "--model-kwargs", "depth=1", "--sizes", "32", "64",
            "--num-images", "1", "--output", str(tmp_path)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"{LOOKHERE} (depth=1, random init): lookhere, policy extrapolate")
    report = json.loads((tmp_path / "diagnostics.json").read_text())
    assert report["sizes"]["64"]["pairs"] == 0 and len(report["sizes"]["64"]["entropy"]) == 1
    assert main([*argv, "--policy", "yarn"]) == 2
    assert "Policy 'yarn' does not apply to lookhere" in capsys.readouterr().err


def test_factory_builds_what_a_train_config_names() -> None:
    config = {"global_slope": 1.0, "layer_slopes": [1, 0.5], "head_directions": "corners"}
    cfg = {"depth": 2, "num_classes": 10, "img_size": 64, "encoding_options": {"config": config}}
    model, _ = create_model(LOOKHERE, cfg)
    assert model.pos_encoding.config["head_directions"] == "corners"
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    with pytest.raises(UserError, match="Unknown LookHere preset 'lh30'"):
        create_model(LOOKHERE, {"encoding_options": {"config": "lh30"}})
    with pytest.raises(UserError, match="unexpected keyword argument .lh_config."):  # the earlier argument, refused
        create_model(LOOKHERE, {"lh_config": "lh90"})


@pytest.mark.parametrize("name, kwargs", [
    ("vit_rope_tiny_patch16_golden_224", []),
    ("vit_rope_tiny_patch16_string_mixed_224", ["rope_fraction=0.5"]),
])
def test_diagnose_runs_on_the_rotation_kinds(name: str, kwargs: list[str], tmp_path) -> None:
    weights = tmp_path / "w.pth"
    torch.manual_seed(0)
    model = timm.create_model(name, depth=2, num_classes=3, **dict(kw.split("=") for kw in kwargs))
    torch.save(model.state_dict(), weights)
    argv = ["--model", name, "--pretrained-file", str(weights), "--sizes", "32", "64", "--num-images", "2",
            "--output", str(tmp_path / "out"), "--model-kwargs", "depth=2", "num_classes=3", *kwargs]
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "diagnostics.json").read_text())
    assert report["kind"] == model.encoding_kind and len(report["sizes"]["64"]["entropy"]) == 2


@pytest.mark.parametrize("kind", ["comrope_ld", "liere"])
def test_attention_entropy_sees_the_block_rotations(kind: str) -> None:
    """``diagnose``'s attention entropy turns q and k as the model does: it changes when the positions are removed,
    and equals that of no positions once the generators are zero (every rotation the identity)."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", depth=2, num_classes=3).eval()
    with torch.no_grad():  # sharper attention than at initialisation, where every distribution is nearly uniform
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(20.0)
    x = torch.randn(2, 3, 64, 64)
    turned = attention_entropy(model, x)
    with without_positions(model):
        content = attention_entropy(model, x)
    assert max(abs(a - b) for a, b in zip(turned, content, strict=True)) > 1e-3
    with torch.no_grad():
        for param in model.pos_encoding.parameters():
            param.zero_()
    torch.testing.assert_close(attention_entropy(model, x), content, atol=1e-5, rtol=0)
