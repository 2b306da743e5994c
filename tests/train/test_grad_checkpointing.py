"""``grad_checkpointing`` (``vit_rope.train.model.set_checkpointing``): every block or every n-th recomputed in
backward, with the gradients of a run without it, for every position encoding, NaFlex batches and a compiled model
(a DDP run of train.py with it: test_train_datasets' DDP resume test); models that cannot are refused by name."""

from __future__ import annotations

import pytest
import timm
import torch

from helpers import naflex
from vit_rope.encodings import KINDS
from vit_rope.errors import UserError
from vit_rope.train.command_line import build_config
from vit_rope.train.model import set_checkpointing


def tiny(kind: str = "mixed", depth: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_rope_tiny_patch16_axial_224", encoding=kind, depth=depth, img_size=32,
                             dynamic_img_size=True, num_classes=5).train()


def gradients(model: torch.nn.Module, *inputs, run: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The parameters' gradients of a loss of ``model``'s logits, computed by ``run`` (e.g. the compiled model)."""
    model.zero_grad()
    (model if run is None else run)(*inputs).square().sum().backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


def assert_same(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == reference.keys()
    for name, grad in ours.items():
        torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("every", [True, 2])
def test_the_gradients_are_those_without_checkpointing_for_every_encoding(kind: str, every: bool | int) -> None:
    model, x = tiny(kind), torch.randn(2, 3, 32, 48)
    reference = gradients(model, x)
    set_checkpointing(model, every, "tiny")
    assert_same(gradients(model, x), reference)


def test_every_nth_block_is_recomputed_and_no_other() -> None:
    model, calls = tiny(depth=5), []
    for index, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda *_, index=index: calls.append(index))  # recomputation may stop early
    set_checkpointing(model, 2, "tiny")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert sorted(calls) == [0, 0, 1, 2, 2, 3, 4, 4]  # blocks 0, 2 and 4 run again in backward
    calls.clear()
    set_checkpointing(model, True, "tiny")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert sorted(calls) == sorted(list(range(5)) * 2)


def test_naflex_batches_and_a_compiled_model_keep_their_gradients() -> None:
    model = tiny("mixed", depth=2)  # half the blocks to trace and compile, still two checkpointed ones
    batch = naflex.pack(naflex.images([(2, 3), (1, 2)]), length=8)  # grids in 16 px patches, padded to 8 tokens
    reference = gradients(model, batch)
    set_checkpointing(model, True, "tiny")
    assert_same(gradients(model, batch), reference)
    x = torch.randn(2, 3, 32, 32)
    model.set_grad_checkpointing(False)
    reference = gradients(model, x)
    set_checkpointing(model, True, "tiny")
    assert_same(gradients(model, x, run=torch.compile(model, backend="aot_eager")), reference)


def test_timm_models_check_every_block_and_other_settings_are_refused() -> None:
    swin = timm.create_model("swin_rope_mixed_tiny_patch4_window7_224", depths=(1, 1), num_heads=(1, 2),
                             embed_dim=16, img_size=56, num_classes=3)
    set_checkpointing(swin, 1, "swin")
    assert all(stage.grad_checkpointing for stage in swin.layers)
    with pytest.raises(UserError, match=r"grad_checkpointing=2 \(every 2th block\) needs a vit_rope_\* ViT.*"
                       "set grad_checkpointing=true"):
        set_checkpointing(swin, 2, "swin")
    with pytest.raises(UserError, match="has none; set grad_checkpointing=false"):
        set_checkpointing(torch.nn.Linear(2, 2), True, "linear")
    set_checkpointing(swin, False, "swin")  # off: nothing asked of the model


def test_the_config_key_takes_true_false_or_a_block_interval() -> None:
    assert build_config(None, ["grad_checkpointing=true"]).grad_checkpointing is True
    assert build_config(None, ["grad_checkpointing=3"]).grad_checkpointing == 3
    assert build_config(None, []).grad_checkpointing is False
    with pytest.raises(UserError, match="'grad_checkpointing' must be >= 0, got -1"):
        build_config(None, ["grad_checkpointing=-1"])
    with pytest.raises(UserError, match="must be true or false or int"):
        build_config(None, ["grad_checkpointing=often"])
