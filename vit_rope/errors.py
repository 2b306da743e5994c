"""The error type of bad user input, in a module of its own so that every other module can import it."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, data, checkpoint path) rather than a bug in the code.

    ``train.py``, ``vit_rope.evaluate`` and ``vit_rope.diagnose`` print the message as a single ``error: ...`` line
    and exit with code 2 instead of showing a traceback, so every message must say what was wrong, with which value,
    and what to do about it.
    """
