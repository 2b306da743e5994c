"""ONNX export: one file, exported once at 64x48, serves other batches and sizes (non-square too) as eager does.

Each model variant (axial + APE + registers, DINOv3, the attention biases LookHere and 2D-ALiBi) is exported once per
module by the command line from a timm model name (random weights, LayerScale at 1 so that attention and the encoding
visibly shape the output), its torch.export program kept for the checks before ONNX; 1-block tiny models (a second
block would trace the same ops again). A ``train.py`` checkpoint (``helpers.evaluation.write_checkpoint``, plain mixed
under yarn, whose factors hold interpolate's division by the grid's scale and a temperature) is exported too.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from helpers.evaluation import write_checkpoint
from helpers.models import onnx_session
from vit_rope.eval import onnx as export
from vit_rope.eval.loading import load_trained

EXPORT_SIZE = (64, 48)
SIZES = [(64, 48), (48, 96), (128, 80)]  # the export size, wider than high, larger than the export in both sides
VARIANTS = {
    # plain mixed: the checkpoint's export below
    "axial_ape_registers": ("vit_rope_tiny_patch16_axial_ape_224", ["reg_tokens=2"]),
    # DINOv3: normalised coordinates, 4 registers, SwiGLU, qkv bias (narrowed to tiny's width for speed)
    "dinov3": ("vit_rope_small_plus_patch16_dinov3_qkvb", ["embed_dim=192", "num_heads=3"]),
    # the biases' dense penalties per sample (a capture's path), LookHere's with a register beside the class token
    "lookhere": ("vit_rope_tiny_patch16_lookhere_224", ["encoding_options={config: lh90}", "reg_tokens=1"]),
    "alibi": ("vit_rope_tiny_patch16_alibi_224", []),
}
ATOL = 1e-4
real_program = export.export_program


def images(batch: int, h: int, w: int) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(batch * 1000 + h + w))


def run_onnx(sess: onnxruntime.InferenceSession, x: torch.Tensor) -> np.ndarray:
    return sess.run(None, {"images": x.numpy()})[0]


def eager(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(x).numpy()


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    """(model, ONNX Runtime session, model.training right after the export, the torch.export program the file was
    written from, the file, what the command printed) for one variant."""
    name, kwargs = VARIANTS[request.param]
    out, built = tmp_path_factory.mktemp(request.param) / "onnx" / "model.onnx", []

    def kept(model, *args):  # the model the command built, and the program export_onnx writes the file from
        built.append((model, real_program(model, *args)))
        return built[-1][1]

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as printed:
        patch.setattr(export, "export_program", kept)
        assert export.main(["--model", name, "--model-kwargs", "depth=1", "init_values=1.0", *kwargs, "--random-init",
                            "--num-classes", "5", "--img-size", *map(str, EXPORT_SIZE), "--output", str(out)]) == 0
    (model, program), = built
    return model, onnx_session(out), model.training, program, out, printed.getvalue()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_onnx_matches_eager(exported, size: tuple[int, int], batch: int) -> None:
    model, sess = exported[:2]
    x = images(batch, *size)
    expected, got = eager(model, x), run_onnx(sess, x)
    assert got.shape == expected.shape == (batch, 5)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    if batch > 1:  # each image gets its own logits: the batch is not broadcast from one image
        assert np.abs(expected - expected[:1]).max() > 1e-3


def test_export_result_and_graph(exported) -> None:
    """The command says the file and the diffs at the export size and a second, taller one; the graph's batch, height
    and width are symbolic; the model's training mode is left as it was; weights are inside the one file."""
    model, _, training_after, _, path, printed = exported
    assert training_after is True
    assert f"wrote {path} (" in printed and "MiB" in printed
    diffs = {shape: float(diff) for shape, diff in re.findall(r"(\d+ x \d+x\d+) images: .* = (\S+)", printed)}
    assert set(diffs) == {"2 x 64x48", "3 x 96x48"} and max(diffs.values()) < ATOL
    graph = onnx.load(str(path)).graph
    dims = graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims][1] == 3
    assert [dims[i].dim_param for i in (0, 2, 3)] == ["batch", "height", "width"] and not dims[0].dim_value
    assert graph.output[0].name == "logits" and graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert graph.output[0].type.tensor_type.shape.dim[1].dim_value == model.num_classes  # fixed sizes stay fixed
    assert not list(path.parent.glob("*.data"))


def test_export_program_runs_at_other_sizes(exported) -> None:
    """The torch.export program (before ONNX) takes other batches and sizes and matches eager."""
    model, program = exported[0], exported[3].module()
    for batch, (h, w) in [(1, (96, 48)), (3, (128, 80))]:
        x = images(batch, h, w)
        with torch.no_grad():
            torch.testing.assert_close(program(x), model.eval()(x), rtol=0, atol=1e-5)


def test_cli_from_checkpoint_with_policy(tmp_path: Path, capsys) -> None:
    """A train.py checkpoint (trained at 32 px), exported at its training size under a policy: the file still
    follows the policy at other sizes, where the policy changes the logits (yarn: its factors and its attention
    temperature are tensors of the grid)."""
    checkpoint, policy = write_checkpoint(tmp_path / "best.pth"), "yarn"
    out = tmp_path / "model.onnx"
    assert export.main(["--checkpoint", str(checkpoint), "--policy", policy, "--output", str(out)]) == 0
    assert "2 x 32x32 images" in capsys.readouterr().out
    model = load_trained(checkpoint).model
    x = images(3, 80, 48)
    extrapolated = eager(model, x)
    model.set_resolution_policy(policy)
    expected, got = eager(model, x), run_onnx(onnx_session(out), x)
    assert np.abs(expected - extrapolated).max() > 1e-3
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("args, message", [
    (["--img-size", "50"], "image size 50x50 (HxW) must be a multiple of the patch size 16x16"),
    (["--img-size", "64", "16"], "use e.g. 64x32"),
    (["--batch-size", "1"], "batch_size 1"),
    (["--output", "."], "--output . is a folder: name the ONNX file to write, e.g. model.onnx"),
    # random weights in a file meant for deployment are a mistake unless asked for, as in vit_rope.evaluate
    (None, "--model vit_rope_tiny_patch16_mixed_224 has no weights, so the command would export its random "
           "initialisation: pass --pretrained-file PATH or --model-kwargs pretrained=true for timm's published "
           "weights, or --random-init to export random weights on purpose"),
])
def test_cli_rejects_bad_input(tmp_path: Path, capsys, args: list[str] | None, message: str) -> None:
    out = tmp_path / "model.onnx"
    code = export.main(["--model", "vit_rope_tiny_patch16_mixed_224", "--model-kwargs", "depth=1", "--output",
                        str(out), *(["--random-init", *args] if args is not None else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err
    assert not out.exists()


def test_missing_onnxruntime_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # importlib then finds no such package
    with pytest.raises(ModuleNotFoundError, match=r"onnxruntime.*pip install 'vit-rope\[export\]'"):
        export.require_onnx()
    assert export.main(["--model", "vit_rope_tiny_patch16_mixed_224", "--output", str(tmp_path / "m.onnx")]) == 2
    assert "vit-rope[export]" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "c.pth", "--random-init"], "--random-init"),
    (["--model", "vit_rope_tiny_patch16_mixed_224", "--random-init", "--pretrained-file", "w.pth"], "--random-init"),
    (["--model", "vit_rope_tiny_patch16_mixed_224", "--policy", "nearest"], "invalid choice: 'nearest' (choose from"),
])
def test_usage_errors(tmp_path: Path, args: list[str], message: str, capsys) -> None:
    """--random-init goes with a --model alone; --policy is one of the policies."""
    with pytest.raises(SystemExit) as exit_info:
        export.main([*args, "--output", str(tmp_path / "m.onnx")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
