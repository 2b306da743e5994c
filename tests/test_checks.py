"""Checks every layer needs (``vit_rope.checks``): the device a ``--device`` value names."""

from __future__ import annotations

import pytest
import torch

from vit_rope.checks import resolve_device
from vit_rope.errors import UserError


@pytest.mark.parametrize("gpu", [False, True])
def test_auto_takes_cuda_exactly_when_pytorch_sees_a_gpu(monkeypatch, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert resolve_device("auto") == ("cuda" if gpu else "cpu")
    assert resolve_device("cpu") == "cpu"  # the CPU whether or not there is a GPU


def test_cuda_without_a_gpu_names_the_option_and_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"--device cuda was requested .* pass --device cpu"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda") == "cuda"
