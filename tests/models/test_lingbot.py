"""LingBot-Vision twins (vit_rope_{small,base,large,giant}_patch16_lingbot): timm's Eva ports at full width, depth 2,
random, load through ``vit_rope.load_weights`` and give timm's features and logits at the native 512 px and a
non-square size; their pretrained configs are timm's, but for any input size."""

import pytest
import timm
from safetensors.torch import save_file
from timm.models import get_pretrained_cfg

import vit_rope
from helpers.models import assert_same_outputs, timm_eva
from vit_rope.models.eva_families import LINGBOT, twin_name

# small, and giant (small_plus's SwiGLU MLP at 8/3): base and large are small's blocks, wider, with as many channels
# per head (64), which timm's configs of every size hold (test_lingbot_configs_are_timms_for_any_input_size)
SIZES = ["small", "giant"]


@pytest.mark.parametrize("size", SIZES)
def test_lingbot_twin_gives_timms_features_and_logits(size, tmp_path):
    theirs = timm_eva(f"vit_{size}_patch16_lingbot", depth=2, num_classes=5)
    save_file(theirs.state_dict(), tmp_path / "eva.safetensors")
    ours = timm.create_model(twin_name(f"vit_{size}_patch16_lingbot"), depth=2, num_classes=5).eval()
    report = vit_rope.load_weights(ours, tmp_path / "eva.safetensors")
    assert report.converted[0].startswith("timm's Eva DINOv3") and not report.initialised
    assert ours.patch_embed.img_size == (512, 512) and ours.global_pool == "token"
    # the training size and a non-square one on the smallest; giant's weights at the non-square size alone
    assert_same_outputs(ours, theirs, [(512, 512), (192, 320)] if size == "small" else [(192, 320)], batch=1)


def test_lingbot_configs_are_timms_for_any_input_size():
    for name in LINGBOT:
        ours, theirs = (get_pretrained_cfg(model).to_dict() for model in (twin_name(name), name))
        assert ours.pop("fixed_input_size") is False and theirs.pop("fixed_input_size") is True
        assert ours.pop("architecture") == twin_name(name) and theirs.pop("architecture") == name
        assert ours.pop("min_input_size") == (3, 128, 128) and "min_input_size" not in theirs  # eight patches a side
        assert ours == theirs and ours["input_size"] == (3, 512, 512) and ours["license"] == "apache-2.0"
