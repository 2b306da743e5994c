"""The rotation kinds through the evaluation tools: ``vit_rope.diagnose`` from a weights file (golden, STRING over
mixed with p-RoPE), its attention entropy under block rotations (ComRoPE, LieRE), and the policies a STRING model takes
being those of its RoPE table."""

from __future__ import annotations

import json

import pytest
import timm
import torch

from vit_rope.errors import UserError
from vit_rope.eval.diagnostics import attention_entropy, main, without_positions
from vit_rope.eval.harness import check_sizes
from vit_rope.eval.loading import EvalModel


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


def test_a_string_model_takes_the_policies_of_its_table() -> None:
    model = timm.create_model("vit_rope_tiny_patch16_string_224", rope_string_base="dinov3", depth=1)
    entry = EvalModel(label="string over dinov3", model=model, train_size=224)
    check_sizes([32], [entry], ["normalized", "extrapolate"])
    with pytest.raises(UserError, match="does not apply to DINOv3"):
        check_sizes([32], [entry], ["ntk"])


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
