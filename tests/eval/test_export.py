"""ONNX export: one file, exported once by the command line, serves other batches and sizes (non-square too) as eager
does.

Each variant is exported once per module, its torch.export program kept for the checks before ONNX; LayerScale at 1 so
that attention and the encoding visibly shape the output. A ``train.py`` checkpoint
(``helpers.evaluation.write_checkpoint``, trained at 32 px) of plain mixed RoPE with APE and 2 registers under yarn
(its factors hold interpolate's division by the grid's scale and a temperature), exported at its training size: 2
blocks, as through one the policy hardly reaches the class token. The attention biases LookHere and 2D-ALiBi from a
timm model name (random weights) at 64x48: 1-block tiny models, as a second block would trace the same ops again.
Axial tables export in the twins (tests/models/test_twin_tools.py, the VLM towers' tests), DINOv3's RoPE with registers
and qkv bias in the Sapiens2 twin's, timm's SwiGLU in the Gemma 4 tower's (tests/models/test_gemma4_vit.py).
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

SIZES = [(64, 48), (48, 96), (128, 80)]  # LookHere's and ALiBi's export size, wider than high, larger in both sides
# the biases' dense penalties per sample (a capture's path), LookHere's with a register beside the class token
MODELS = {
    "lookhere": ("vit_rope_tiny_patch16_lookhere_224", ["encoding_options={config: lh90}", "reg_tokens=1"]),
    "alibi": ("vit_rope_tiny_patch16_alibi_224", []),
}
# what the command checks: the export size, a taller one with one more image, one image turned round
EXPORTED = {"checkpoint": ("2 x 32x32", "3 x 48x32", "1 x 32x32"),
            **dict.fromkeys(MODELS, ("2 x 64x48", "3 x 96x48", "1 x 48x64"))}
ATOL, POLICY = 1e-4, "yarn"
real_program = export.export_program


def images(batch: int, h: int, w: int) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(batch * 1000 + h + w))


def run_onnx(sess: onnxruntime.InferenceSession, x: torch.Tensor) -> np.ndarray:
    return sess.run(None, {"images": x.numpy()})[0]


def eager(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(x).numpy()


def run_command(args: list[str], out: Path) -> tuple:
    """(model, ONNX Runtime session, model.training right after the export, the torch.export program the file was
    written from, the file, what the command printed) of ``vit-rope-export args --output out``."""
    built = []

    def kept(model, *args):  # the model the command built, and the program export_onnx writes the file from
        built.append((model, real_program(model, *args)))
        return built[-1][1]

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as printed:
        patch.setattr(export, "export_program", kept)
        assert export.main([*args, "--output", str(out)]) == 0
    (model, program), = built
    return model, onnx_session(out), model.training, program, out, printed.getvalue()


@pytest.fixture(scope="module")
def checkpoint_export(tmp_path_factory) -> tuple:
    """``run_command``'s tuple for a checkpoint exported under the policy at its training size (no --img-size), and
    the checkpoint."""
    folder = tmp_path_factory.mktemp("checkpoint")
    checkpoint = write_checkpoint(folder / "best.pth", pos_embed="learn", reg_tokens=2)
    args = ["--checkpoint", str(checkpoint), "--policy", POLICY]
    return *run_command(args, folder / "onnx" / "model.onnx"), checkpoint


@pytest.fixture(scope="module", params=list(EXPORTED))
def exported(request, tmp_path_factory):
    """``run_command``'s tuple for one variant: the checkpoint's export, or a model name's at 64x48."""
    if request.param == "checkpoint":
        return request.getfixturevalue("checkpoint_export")[:-1]
    name, kwargs = MODELS[request.param]
    return run_command(["--model", name, "--model-kwargs", "depth=1", "init_values=1.0", *kwargs, "--random-init",
                        "--num-classes", "3", "--img-size", "64", "48"],
                       tmp_path_factory.mktemp(request.param) / "onnx" / "model.onnx")


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_onnx_matches_eager(exported, size: tuple[int, int], batch: int) -> None:
    model, sess = exported[:2]
    x = images(batch, *size)
    expected, got = eager(model, x), run_onnx(sess, x)
    assert got.shape == expected.shape == (batch, 3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    if batch > 1:  # each image gets its own logits: the batch is not broadcast from one image
        assert np.abs(expected - expected[:1]).max() > 1e-3


def test_export_result_and_graph(exported, request) -> None:
    """The command says the file and the diffs at the shapes it checks; the graph's batch, height and width are
    symbolic; the model's training mode is left as it was; weights are inside the one file."""
    model, _, training_after, _, path, printed = exported
    assert training_after is True
    assert f"wrote {path} (" in printed and "MiB" in printed
    diffs = {shape: float(diff) for shape, diff in re.findall(r"(\d+ x \d+x\d+) images: .* = (\S+)", printed)}
    assert set(diffs) == set(EXPORTED[request.node.callspec.params["exported"]]) and max(diffs.values()) < ATOL
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


def test_cli_from_checkpoint_with_policy(checkpoint_export) -> None:
    """The checkpoint's file (exported at its training size under the policy) holds the checkpoint's weights and still
    follows the policy at other sizes, where the policy changes the logits (yarn: its factors and its attention
    temperature are tensors of the grid)."""
    out, checkpoint = checkpoint_export[4], checkpoint_export[-1]
    model = load_trained(checkpoint).model
    x = images(3, 80, 48)
    extrapolated = eager(model, x)
    model.set_resolution_policy(POLICY)
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
