"""timm's ``prune_intermediate_layers`` on every kind of position encoding: the pruned model is the shallower model
with the same weights, also after an evaluation kept the tables of every block for the input's grid (the encodings'
``prune_``)."""

from __future__ import annotations

import pytest
import torch

from helpers.models import randomize_
from vit_rope.encodings import KINDS
from vit_rope.models.vit import RoPEVisionTransformer

BASE = dict(img_size=64, patch_size=16, embed_dim=32, depth=3, num_heads=2, num_classes=5, reg_tokens=1)
OPTIONS = {"pape": {"parabolas": 3}, "comrope_ap": {"block_size": 4}, "comrope_ld": {"block_size": 4},
           "liere": {"generator_dim": 4, "per_layer": True}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_pruned_model_is_the_shallower_model_with_its_weights(kind: str) -> None:
    kwargs = dict(BASE, encoding=kind, encoding_options=OPTIONS.get(kind))
    torch.manual_seed(0)
    model = RoPEVisionTransformer(**kwargs).eval()
    randomize_(model)  # a trained model's values, not the initial ones
    # as a model just loaded: tensors of their own, never written since (the kept tables' keys see no new version)
    model.load_state_dict({name: value.clone() for name, value in model.state_dict().items()}, assign=True)
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        model(x)  # evaluation keeps the tables of all three blocks for this grid
    assert model.prune_intermediate_layers([1], prune_head=False) == [1]
    shallow = RoPEVisionTransformer(**dict(kwargs, depth=2)).eval()
    shallow.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), shallow(x), atol=1e-5, rtol=1e-5)
