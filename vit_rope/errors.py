"""The error type of bad user input, and the models' refusal of TorchScript, in a module every other can import."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, data, checkpoint path) rather than a bug in the code.

    ``train.py``, ``vit_rope.evaluate`` and ``vit_rope.diagnose`` print the message as a single ``error: ...`` line
    and exit with code 2 instead of showing a traceback, so every message must say what was wrong, with which value,
    and what to do about it.
    """


class NoTorchScript:
    """A model that ``torch.jit.script`` refuses with one error that says what to use instead: TorchScript is
    deprecated since torch 2.14, and a forward that takes image or NaFlex batches does not script (timm leaves its own
    NaFlex models out of its TorchScript tests for the same reason)."""

    def __prepare_scriptable__(self) -> None:  # torch.jit.script calls it before compiling anything
        raise RuntimeError(f"{type(self).__name__} does not support TorchScript (torch.jit.script, deprecated since "
                           "torch 2.14): use torch.export, `python -m vit_rope.export` for ONNX, or torch.compile.")
