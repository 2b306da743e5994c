"""Checks every layer needs (``vit_rope.checks``): the device a ``--device`` value names."""

from __future__ import annotations

import pytest
import torch

from vit_rope.checks import resolve_device
from vit_rope.errors import UserError


@pytest.mark.parametrize("gpu", [False, True])
def test_auto_takes_cuda_exactly_when_pytorch_sees_a_gpu_and_cuda_without_one_names_the_fix(monkeypatch, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert resolve_device("auto") == ("cuda" if gpu else "cpu")
    assert resolve_device("cpu") == "cpu"  # the CPU whether or not there is a GPU
    if gpu:
        assert resolve_device("cuda") == "cuda"
    else:
        with pytest.raises(UserError, match=r"--device cuda was requested .* pass --device cpu"):
            resolve_device("cuda")
