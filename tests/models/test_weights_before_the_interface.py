"""Weights written before the one position-encoding interface load and give the same logits, for every kind.

``tests/fixtures/old_logits.pt`` holds, for small models of every encoding, the weights, inputs and logits that the
code of commit 1e33b2f gave (``tests/fixtures/make_old_logits.py`` wrote it): images at the training size and two
others, a NaFlex batch of two grids with padding, under every policy the kind takes. ``old_logits_block_inputs.pt``
holds the same for the kinds added later (PaPE, PaPE-RI, ComRoPE, LieRE), from the code before each block got one
``BlockInput`` (commit 8094f0e). The current code builds each model with the current argument names, loads the old
state dict strictly and must give the old logits (equal to the bit on the machine that wrote them; the tolerance is for
another CPU's vector paths).
"""

from pathlib import Path

import pytest
import torch

from vit_rope.models.vit import RoPEVisionTransformer

FIXTURES = {name: torch.load(Path(__file__).parents[1] / "fixtures" / f"{name}.pt", weights_only=False)
            for name in ("old_logits", "old_logits_block_inputs")}
RENAMED = {"rope_kind": "encoding", "rope_policy": "resolution_policy"}


@pytest.mark.parametrize("fixture, name", [(fixture, name) for fixture, saved in FIXTURES.items()
                                           for name in sorted(saved["models"])])
def test_weights_written_before_the_interface_give_the_same_logits(fixture: str, name: str) -> None:
    data = FIXTURES[fixture]
    saved = data["models"][name]
    kwargs = {RENAMED.get(key, key): value for key, value in saved["kwargs"].items()}
    model = RoPEVisionTransformer(**data["base"], **kwargs).eval()
    model.load_state_dict(saved["state_dict"], strict=True)
    for (policy, inputs), expected in saved["logits"].items():
        model.set_resolution_policy(policy)
        x = data["naflex"] if inputs == "naflex" else data["images"][inputs]
        with torch.no_grad():
            torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5, msg=f"{name}, {policy}, {inputs}")
