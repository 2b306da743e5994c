"""The attention-bias models (LookHere, 2D-ALiBi) in the tools (their ONNX export: test_export.py): the harness's policy
check, ``vit_rope.diagnose`` (attention entropy with the bias; no frequencies to cover), and the factory that
train.py's ``model`` / ``model_kwargs`` go through (a YAML LookHere ``config`` preset or dict in ``encoding_options``; a
bad one is one error)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from helpers.models import tiny
from vit_rope.errors import UserError
from vit_rope.eval.diagnostics import attention_entropy, main
from vit_rope.eval.harness import check_sizes
from vit_rope.eval.loading import EvalModel
from vit_rope.models.factory import create_model

LOOKHERE = "vit_rope_tiny_patch16_lookhere_224"


def test_harness_refuses_policies_without_meaning_for_a_bias() -> None:
    entry = EvalModel("alibi", tiny("vit_rope_tiny_patch16_alibi_224").eval(), 224)
    check_sizes([64], [entry], ["extrapolate", "interpolate"])
    with pytest.raises(UserError, match="alibi: Policy 'ntk' does not apply to alibi, an attention bias"):
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
