"""The error type of bad user input, and the models' refusal of TorchScript, in a module every other can import."""

from __future__ import annotations


class UserError(Exception):
    """Bad user input, not a bug: commands print it as one ``error: ...`` line (exit 2): name the value and the fix."""


class NoTorchScript:
    """A model ``torch.jit.script`` refuses with an error naming what to use: image or NaFlex forwards do not script."""

    def __prepare_scriptable__(self) -> None:  # torch.jit.script calls it before compiling anything
        raise RuntimeError(f"{type(self).__name__} does not support TorchScript (torch.jit.script, deprecated since "
                           "torch 2.14): use torch.export, `python -m vit_rope.export` for ONNX, or torch.compile.")
