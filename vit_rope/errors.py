"""The error type of bad user input, and the models' refusal of TorchScript, in a module every other can import."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, data, checkpoint path), not a bug: the commands print it as one
    ``error: ...`` line and exit with code 2, so it says what was wrong, with which value, and what to do."""


class NoTorchScript:
    """A model that ``torch.jit.script`` refuses with one error saying what to use instead: TorchScript is deprecated
    since torch 2.14, and a forward taking image or NaFlex batches does not script (timm's NaFlex models neither)."""

    def __prepare_scriptable__(self) -> None:  # torch.jit.script calls it before compiling anything
        raise RuntimeError(f"{type(self).__name__} does not support TorchScript (torch.jit.script, deprecated since "
                           "torch 2.14): use torch.export, `python -m vit_rope.export` for ONNX, or torch.compile.")
