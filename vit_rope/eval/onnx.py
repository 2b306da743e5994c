"""ONNX export with a dynamic batch, height and width: one file serves every image size the model accepts.

A RoPE ViT builds its tables from the patch grid inside ``forward``, so nothing is fixed to the training size
(docs/export.md). Exit codes: 0 written and checked, 1 ONNX Runtime disagrees with eager, 2 bad input."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from vit_rope.encodings.policies import POLICIES
from vit_rope.errors import UserError
from vit_rope.eval.loading import add_model_options, check_model_options, load_model_option, set_policy

Shape = tuple[int, int, int]  # (batch, height, width)


class ExportError(RuntimeError):
    """The written ONNX file does not reproduce the eager model."""


@dataclass(frozen=True)
class OnnxExport:
    """A written ONNX file and, for each checked ``(batch, H, W)``, the max ``|ONNX Runtime - eager|``."""

    path: Path
    diffs: dict[Shape, float]


def require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(f"ONNX export needs {', '.join(missing)}, not installed here: "
                                  "pip install 'vit-rope[export]' (or the dev extra, 'vit-rope[dev]')")


def _images(model: nn.Module, batch: int, h: int, w: int) -> torch.Tensor:
    """Seeded random images: the same shape always gives the same tensor."""
    generator = torch.Generator().manual_seed(h * 10_000 + w)
    return torch.randn(batch, model.patch_embed.proj.in_channels, h, w, generator=generator)


def export_program(model: nn.Module, img_size: tuple[int, int] = (224, 224), batch_size: int = 2) -> ExportedProgram:
    """``torch.export`` of ``model`` in eval mode, batch and patch grid dynamic (``img_size`` two patches a side or
    more), size-oblivious as torch.onnx traces (fewer guards to solve; the program may assert a batch above 1, which
    the ONNX file drops); Cayley-STRING as a copy with ``P`` in its qkv, so the graph has no solve."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is None:
        raise UserError(f"{type(model).__name__} has no patch_embed.patch_size: only ViTs export here")
    (ph, pw), (h, w) = patch, img_size
    if h % ph or w % pw or h < 2 * ph or w < 2 * pw:
        near = f"{max(2 * ph, round(h / ph) * ph)}x{max(2 * pw, round(w / pw) * pw)}"
        raise UserError(f"image size {h}x{w} (HxW) must be a multiple of the patch size {ph}x{pw}, with at least "
                        f"two patches per side: use e.g. {near}")
    if batch_size < 2:
        raise UserError(f"batch_size {batch_size}: trace with 2 or more images (torch.export fixes a batch of 1 "
                        "as a constant); the exported batch stays dynamic")
    dims = ({0: Dim("batch", min=1), 2: ph * Dim("grid_h", min=1), 3: pw * Dim("grid_w", min=1)},)
    if hasattr(model, "fold_encoding_"):  # what folds (STRING's basis) is written into a copy's weights
        model = copy.deepcopy(model)
        model.fold_encoding_()
    was_training = model.training
    try:  # runtime asserts, not guards simplified at trace time: a Swin's padded windows export in a third of the time
        with torch.fx.experimental._config.patch(backed_size_oblivious=True):
            return torch.export.export(model.eval(), (_images(model, batch_size, *img_size),),
                                       dynamic_shapes=dims, prefer_deferred_runtime_asserts_over_guards=True)
    finally:
        model.train(was_training)


def name_dims(path: str | Path) -> None:
    """Rename torch.export's symbolic dimensions (``s77``, ``16*s52``) in the ONNX file to batch, height and width."""
    import onnx

    proto = onnx.load(str(path))
    renamed = {dim.dim_param: name for dim, name in zip(proto.graph.input[0].type.tensor_type.shape.dim,
                                                        ("batch", "channels", "height", "width"), strict=True)
               if dim.dim_param}
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renamed:  # dim_param and dim_value are one field: a fixed size stays untouched
                dim.dim_param = renamed[dim.dim_param]
    onnx.save(proto, str(path))


def compare_onnx(model: nn.Module, path: str | Path, shapes: list[Shape]) -> dict[Shape, tuple[float, float]]:
    """``(batch, H, W) -> (max |ONNX Runtime - eager|, max |eager|)`` on seeded random images of each shape."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    was_training = model.training
    diffs = {}
    try:
        for batch, h, w in shapes:
            images = _images(model, batch, h, w)
            with torch.no_grad():
                expected = model.eval()(images).float().numpy()
            try:  # a graph that kept some size fixed fails here (onnxruntime's own exception classes)
                got = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
                if got.shape != expected.shape:
                    raise ValueError(f"output shape {got.shape}, eager {expected.shape}")
            except Exception as err:
                raise ExportError(f"ONNX Runtime cannot run {path} at {batch}x{h}x{w} like eager PyTorch "
                                  f"({str(err).strip().splitlines()[0][:300]}); do not use it") from err
            diffs[batch, h, w] = float(abs(got - expected).max()), float(abs(expected).max())
    finally:
        model.train(was_training)
    return diffs


def export_onnx(model: nn.Module, path: str | Path, *, img_size: tuple[int, int] = (224, 224), batch_size: int = 2,
                opset: int | None = None, atol: float = 1e-4) -> OnnxExport:
    """Write ``model`` in eval mode as one ONNX file and check it against eager with ONNX Runtime, at the example shape
    and two more; ``ExportError`` when a diff exceeds ``atol`` (times the largest output when above 1)."""
    require_onnx()
    program = export_program(model, img_size, batch_size)
    (path := Path(path)).parent.mkdir(parents=True, exist_ok=True)
    output = "logits" if getattr(model, "num_classes", 0) else "features"
    torch.onnx.export(program, (_images(model, batch_size, *img_size),), str(path), dynamo=True, verbose=False,
                      opset_version=opset, external_data=False, input_names=["images"], output_names=[output])
    name_dims(path)
    (h, w), (ph, pw) = img_size, model.patch_embed.patch_size  # also 1.5x as high (whole patches) with one more
    # image, and one image of the grid turned round: the trace took no size of 1 as a case apart (export_program)
    diffs = compare_onnx(model, path, [(batch_size, h, w), (batch_size + 1, max(h + ph, round(1.5 * h / ph) * ph), w),
                                       (1, w // pw * ph, h // ph * pw)])
    for (b, h, w), (diff, largest) in diffs.items():
        if not diff <= atol * max(1.0, largest):  # NaN fails too
            raise ExportError(f"{path}: ONNX Runtime differs from eager PyTorch by {diff:.2e} at {b}x{h}x{w} (tolerance"
                              f" {atol * max(1.0, largest):.1e}); the file is kept for inspection, do not use it")
    return OnnxExport(path, {shape: diff for shape, (diff, _) in diffs.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vit-rope-export", description=__doc__.split("\n\n")[0])
    add_model_options(parser, "export", "a timm model name (vit_rope_* or timm's own ViTs)")
    parser.add_argument("--num-classes", type=int, help="outputs of --model (default: the file's, else 1000)")
    parser.add_argument("--no-ema", action="store_true", help="export a checkpoint's model weights, not its EMA")
    parser.add_argument("--output", required=True, metavar="FILE", help="the ONNX file to write")
    parser.add_argument("--img-size", nargs="+", type=int, metavar="SIDE",
                        help="example size, H or H W, multiples of the patch size (default: the training size)")
    parser.add_argument("--batch-size", type=int, default=2, help="example batch, 2 or more (default 2)")
    parser.add_argument("--policy", choices=POLICIES, help="RoPE resolution policy (default: the model's)")
    parser.add_argument("--opset", type=int, help="ONNX opset (default: torch.onnx's)")
    args = parser.parse_args(argv)
    check_model_options(parser, args, "--num-classes")
    if args.img_size and len(args.img_size) > 2:
        parser.error(f"--img-size takes H or H W, got {len(args.img_size)} values")
    try:
        require_onnx()
        if Path(args.output).is_dir():  # else the export would fail at its last step, the write
            raise UserError(f"--output {args.output} is a folder: name the ONNX file to write, e.g. "
                            f"{Path(args.output) / 'model.onnx'}")
        classes = {} if args.num_classes is None else {"num_classes": args.num_classes}
        entry = load_model_option(args, "export", 1000, dict(args.model_kwargs, **classes))
        set_policy(entry, args.policy)
        sides = args.img_size or [entry.train_size]
        result = export_onnx(entry.model, args.output, img_size=(sides[0], sides[-1]), batch_size=args.batch_size,
                             opset=args.opset)
    except (UserError, ModuleNotFoundError, ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1 if isinstance(err, ExportError) else 2
    patch = "x".join(map(str, entry.model.patch_embed.patch_size))
    print(f"wrote {result.path} ({result.path.stat().st_size / 2**20:.1f} MiB) from {entry.label}: batch, height "
          f"and width dynamic (multiples of {patch})")
    for (b, h, w), diff in result.diffs.items():
        print(f"  {b} x {h}x{w} images: max |ONNX Runtime - eager| = {diff:.2e}")
    return 0
