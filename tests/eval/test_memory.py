"""The harness's memory estimate: above a real forward's peak for every kind of attention, growing as attention does,
and the batch it allows (``vit_rope.eval.extraction``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from benchmarks import throughput
from helpers.evaluation import run, write_checkpoint
from vit_rope.errors import UserError
from vit_rope.eval import extraction
from vit_rope.eval.extraction import FIXED_BYTES, fit_batch, image_bytes


def peak_bytes(model: torch.nn.Module, size: int, warm: int = 64) -> int:
    """Resident memory a forward at ``size`` px adds at its peak (``benchmarks.throughput.peak_bytes``: Linux's VmHWM,
    reset just before it), after a first call at ``warm`` px."""
    images = torch.randn(1, 3, size, size)
    with torch.inference_mode():
        model(torch.randn(1, 3, warm, warm))  # first-call allocations
        return throughput.peak_bytes(lambda: model(images), torch.device("cpu"))


@pytest.mark.skipif(not throughput.CLEAR_REFS.exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("name,kwargs", [
    ("vit_rope_tiny_patch16_axial_224", {}), ("vit_rope_tiny_patch16_fire_224", {}),
    ("vit_rope_tiny_patch16_lookhere_224", {}), ("vit_rope_tiny_patch16_liere_224", {}),
    ("vit_rope_tiny_patch16_comrope_ld_224", {}), ("vit_tiny_patch16_224", {}),
    ("vit_rope_tiny_patch16_mixed_224", {"fused_attn": False}),
])
def test_the_estimate_is_above_a_real_forwards_peak(name: str, kwargs: dict) -> None:
    """One image at 768 px (2,304 tokens; the bias kinds' chunked path, LieRE's table chunks): the measured peak is
    within the estimate plus its fixed part, for fused attention and for materialised scores alike."""
    torch.manual_seed(0)
    model = timm.create_model(name, dynamic_img_size=True, depth=1).eval()  # the peak is one block's
    if kwargs.get("fused_attn") is False:
        for block in model.blocks:
            block.attn.fused_attn = False
    assert peak_bytes(model, 768) <= image_bytes(model, {"img_size": 768}, 4) + FIXED_BYTES


@pytest.mark.skipif(not throughput.CLEAR_REFS.exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.slow  # two Swin forwards at 1344 px
@pytest.mark.parametrize("name,fused", [("swin_rope_mixed_tiny_patch4_window7_224", True),
                                        ("swin_tiny_patch4_window7_224", False)])
def test_a_swins_estimate_is_above_a_real_forwards_peak(name: str, fused: bool) -> None:
    """A Swin at 1344 px (112,896 tokens in the first stage, 7x7 windows): the measured peak is within the estimate of
    its costliest stage, with fused attention (RoPE-Swin) and with the windows' scores materialised (timm's)."""
    torch.manual_seed(0)
    # 64 wide, not Swin-T's 96, and two stages of Swin-T's four (each stage costs as many multiply-adds, the first
    # holds the peak): a quarter of the work, and a peak (430-440 MiB measured) well above the fixed part
    model = timm.create_model(name, depths=(1, 1), embed_dim=64, num_heads=(2, 4)).eval()
    model.set_input_size(img_size=(1344, 1344), window_size=7)
    for stage in model.layers:
        for block in stage.blocks:
            block.attn.fused_attn = fused
    need = image_bytes(model, {"img_size": 1344}, 4)
    peak = peak_bytes(model, 1344, warm=1344)
    assert FIXED_BYTES < peak <= need + FIXED_BYTES  # a peak above the fixed part: the bound says something
    assert image_bytes(model, {"img_size": 448}, 4) < need  # tokens grow with the size


def test_the_estimate_grows_with_the_tokens_and_with_their_square_where_scores_are_materialised() -> None:
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    small, large = (image_bytes(model, {"img_size": size}, 4) for size in (512, 1024))
    assert large / small == pytest.approx(4, rel=0.01)  # fused attention: linear in the tokens
    # a budget of as many tokens as 512 px, fused attention still: its masks materialise the scores
    assert image_bytes(model, {"seq_len": 1024}, 4) - small == 2 * 3 * (32 * 32 + 1) ** 2 * 4
    model.blocks[0].attn.fused_attn = False  # the [heads, N, N] scores added, with the class token's row
    assert image_bytes(model, {"img_size": 512}, 4) - small == 2 * 3 * (32 * 32 + 1) ** 2 * 4
    assert image_bytes(model, {"img_size": 1024}, 4) - large == 2 * 3 * (64 * 64 + 1) ** 2 * 4
    assert image_bytes(timm.create_model("resnet18"), {"img_size": 512}, 4) is None  # a CNN: not estimated
    assert image_bytes(model, {"img_size": 512}, 2) < image_bytes(model, {"img_size": 512}, 4)  # bf16 on CUDA


def test_the_batch_is_what_the_free_memory_holds_and_one_image_too_many_is_an_error() -> None:
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1)
    one = image_bytes(model, {"img_size": 1024}, 4)
    models = [("tiny", model), ("cnn", timm.create_model("resnet18"))]
    assert fit_batch(models, "1024 px", {"img_size": 1024}, 64, FIXED_BYTES + 5 * one + 1) == 5
    assert fit_batch(models, "1024 px", {"img_size": 1024}, 3, FIXED_BYTES + 5 * one) == 3  # never above the asked
    with pytest.raises(UserError, match=r"tiny at 1024 px needs about .* GiB for one image but .* GiB are free"):
        fit_batch(models, "1024 px", {"img_size": 1024}, 64, FIXED_BYTES + one - 1)


def test_the_harness_says_the_batch_it_runs_and_refuses_a_size_before_any_forward(image_root: Path, tmp_path: Path,
                                                                                  monkeypatch, capsys) -> None:
    """Free memory for two images at 64 px: that size runs in batches of two, said first, every image counted; with
    room for less than one, an error naming the size before anything is evaluated."""
    checkpoint = write_checkpoint(tmp_path / "best.pth")
    model = timm.create_model("vit_rope_tiny_patch16_mixed_224", depth=2, num_classes=3)
    need = image_bytes(model, {"img_size": 64}, 4, prefetch=0)
    monkeypatch.setattr(extraction, "free_bytes", lambda device: FIXED_BYTES + 2 * need)
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--img-sizes", "32", "64",
               "--output", str(tmp_path / "eval")) == 0
    printed = capsys.readouterr().out
    assert "64 px: batches of 2 images, as many as fit in the" in printed
    assert "32 px: batches of 2 " not in printed  # a quarter of the tokens: more images
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert {(r["img_size"], r["images"]) for r in results} == {(32, 12), (64, 12)}
    monkeypatch.setattr(extraction, "free_bytes", lambda device: FIXED_BYTES + need // 2)
    assert run("--checkpoint", str(checkpoint), "--data-dir", str(image_root), "--img-sizes", "32", "64",
               "--output", str(tmp_path / "again")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "at 64 px needs about" in err and not (tmp_path / "again").exists()
