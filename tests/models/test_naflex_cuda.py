"""NaFlex batches on a CUDA GPU (``pytest -m cuda``, skipped without one): a batch of mixed aspect ratios gives the
CPU's logits and gradients, for every kind of position encoding of ``test_naflex.py``. TF32 is off, so the GPU's
products are fp32 as the CPU's and the two differ only in summation order."""

from __future__ import annotations

import copy

import pytest
import torch
from test_naflex import KINDS, build

from helpers.naflex import images, pack
from vit_rope.train.distributed import set_tf32


@pytest.fixture
def no_tf32():
    set_tf32(False)
    yield
    set_tf32(True)  # train.py's default (tf32: true), which it sets itself anyway


@pytest.mark.cuda
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_mixed_batch_on_the_gpu_equals_the_cpu(kind: str, no_tf32) -> None:
    model = build(kind, KINDS[kind][2][0]).train()
    batch = pack(images())
    results = []
    for device in ("cpu", "cuda"):
        net = copy.deepcopy(model).to(device)
        inputs = {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
        inputs["patches"].requires_grad_(True)
        logits = net(inputs)
        logits.square().sum().backward()
        grads = {name: param.grad.cpu() for name, param in net.named_parameters() if param.grad is not None}
        results.append((logits.detach().cpu(), inputs["patches"].grad.cpu(), grads))
    (cpu_logits, cpu_input, cpu_grads), (gpu_logits, gpu_input, gpu_grads) = results
    assert cpu_logits.abs().max() > 0.1  # not two near-zero outputs
    torch.testing.assert_close(gpu_logits, cpu_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gpu_input, cpu_input, rtol=1e-4, atol=1e-4 * float(cpu_input.abs().max()))
    assert gpu_grads.keys() == cpu_grads.keys()
    for name, grad in cpu_grads.items():  # to 1e-4 of each gradient's largest entry
        torch.testing.assert_close(gpu_grads[name], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()), msg=name)
