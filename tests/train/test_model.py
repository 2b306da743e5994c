"""The model a training run trains (``vit_rope.train.model``): a new classifier for other classes, and which models
take NaFlex batches (fine-tuning and resuming through ``train.py`` are tested end to end in test_train.py)."""

from __future__ import annotations

import pytest
import timm

from vit_rope.errors import UserError
from vit_rope.train import model


def test_new_classifier_handles_two_heads_and_none() -> None:
    """DeiT's distilled models name two classifiers; num_classes=0 has none to fill."""
    distilled = timm.create_model("deit_tiny_distilled_patch16_224", depth=1, num_classes=2)
    state = timm.create_model("deit_tiny_distilled_patch16_224", depth=1, num_classes=3).state_dict()
    said = []
    out = model.new_classifier(state, distilled, None, ["a", "b"], "x.pth", said.append)
    assert all(out[key].shape == value.shape for key, value in distilled.state_dict().items())
    assert "head_dist.weight" in said[0]
    headless = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=0)
    out = model.new_classifier(timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=3).state_dict(),
                               headless, None, ["a", "b"], "x.pth", said.append)
    assert set(out) == set(headless.state_dict()) and "dropped (num_classes=0)" in said[1]


def test_naflex_training_takes_ours_and_timms_naflexvit_with_their_patch_and_refuses_other_models() -> None:
    ours = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=1, patch_size=8, num_classes=3)
    theirs = timm.create_model("naflexvit_base_patch16_gap", depth=1, num_classes=3)
    assert (model.naflex_patch(ours, "ours"), model.naflex_patch(theirs, "theirs")) == (8, 16)
    with pytest.raises(UserError, match="'cnn' \\(ResNet\\) does not; pick a vit_rope_\\* model or timm's "
                                              "naflexvit_\\*, or set naflex=false"):
        model.naflex_patch(timm.create_model("resnet10t", num_classes=3), "cnn")
