"""Twin of transformers' Qwen2.5-VL vision tower (vit_rope_qwen2_5_vl_vit): transformers' tokens before the merger and
the merger's tokens at a square and a non-square size (partial windows at the edges), through from_timm, load_weights
and create_from_checkpoint (folders saved by transformers: the tower's own, and the VLM's with its language model); a
NaFlex batch of mixed sizes sample by sample against transformers' packed grid_thw; bad inputs refused by name.
Depth 4, width 64, random weights, windows of 4x4 patches (window_size 56 px), full attention in blocks 1 and 3."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import vit_rope
from helpers.models import onnx_sizes, randomize_, rel
from helpers.naflex import pack
from vit_rope.eval.loading import create_from_checkpoint
from vit_rope.layers.attention import BlockInput
from vit_rope.models import qwen2_5_vl

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf  # noqa: E402
from transformers.vision_utils import get_vision_window_index  # noqa: E402

TINY = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=2, out_hidden_size=48, window_size=56,
            fullatt_block_indexes=[1, 3])
P, M, T = 14, 2, 2  # patch, merge and temporal patch sizes
SIZES = [(112, 112), (84, 140)]  # 8x8 patches (2x2 windows), 6x10 (partial windows at the bottom and right)
TOL = 1e-4


def hf_tower(**overrides) -> torch.nn.Module:
    model = hf.Qwen2_5_VisionTransformerPretrainedModel(transformers.Qwen2_5_VLVisionConfig(**{**TINY, **overrides}))
    randomize_(model)
    return model.eval()


def hf_inputs(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[3, H, W]`` as Qwen2-VL's image processor packs them: the frame repeated in time, patches in 2x2
    merge-block order, one row per patch; and their ``grid_thw``."""
    rows, grids = [], []
    for image in images:
        C, H, W = image.shape
        h, w = H // P, W // P
        x = image[None].expand(T, -1, -1, -1).reshape(T, C, h // M, M, P, w // M, M, P)
        rows.append(x.permute(2, 5, 3, 6, 1, 0, 4, 7).reshape(h * w, C * T * P * P))
        grids.append((1, h, w))
    return torch.cat(rows), torch.tensor(grids)


@torch.no_grad()
def hf_outputs(model: torch.nn.Module, images: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' tokens before the merger (back from window order to row-major) and merged tokens, per image."""
    pixels, grid_thw = hf_inputs(images)
    out = model(pixels, grid_thw=grid_thw)
    order, _ = get_vision_window_index(grid_thw, M, model.config.window_size, P)
    tokens = out.last_hidden_state.unflatten(0, (-1, M * M))[order.argsort()]  # [blocks, 4, C], block order
    results, start, merged_start = [], 0, 0
    for _, h, w in grid_thw.tolist():
        blocks = tokens[start:start + h * w // 4].reshape(h // M, w // M, M, M, -1).permute(0, 2, 1, 3, 4)
        results.append((blocks.reshape(h * w, -1), out.pooler_output[merged_start:merged_start + h * w // 4]))
        start, merged_start = start + h * w // 4, merged_start + h * w // 4
    return results


@torch.no_grad()
def assert_parity(theirs: torch.nn.Module, ours: torch.nn.Module, size: tuple[int, int]) -> None:
    image = torch.randn(3, *size, generator=torch.Generator().manual_seed(1))
    (tokens, merged), = hf_outputs(theirs, [image])
    assert rel(tokens, ours.forward_features(image[None])[0]) < TOL, size
    assert rel(merged, ours(image[None])[0]) < TOL, size


def test_twin_equals_transformers_through_from_timm_and_the_loader(tmp_path):
    theirs = hf_tower()
    twin = vit_rope.from_timm(theirs)
    assert type(twin).__name__ == "Qwen25VisionTransformer" and twin.window == 4
    assert any("summed over time" in line for line in twin.load_report.converted)
    theirs.save_pretrained(tmp_path / "tower")  # config.json (qwen2_5_vl_vision) + model.safetensors
    loaded = create_from_checkpoint(tmp_path / "tower").eval()
    assert not loaded.load_report.initialised, loaded.load_report.summary()
    assert loaded.fullatt_block_indexes == (1, 3) and loaded.patch_merger.out_features == 48
    for size in SIZES:
        assert_parity(theirs, twin, size)
    assert_parity(theirs, loaded, SIZES[1])
    ours = timm.create_model("vit_rope_qwen2_5_vl_vit", **vit_rope.models.qwen2_5_vl.args_from_config(
        json.loads((tmp_path / "tower" / "config.json").read_text()))[1]).eval()
    report = vit_rope.load_weights(ours, tmp_path / "tower")
    assert not report.initialised
    assert_parity(theirs, ours, SIZES[0])
    ours = timm.create_model("vit_rope_qwen2_5_vl_vit", **{**TWIN, "merger_out_features": 0})  # a merger without fc2
    notes = " ".join(vit_rope.load_weights(ours, theirs.state_dict()).converted)
    assert "merger.fc2.weight, merger.fc2.bias dropped: this model has no merger fc2" in notes


def test_vlm_folder_loads_its_tower_and_drops_the_language_model(tmp_path):
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=64, bos_token_id=0, eos_token_id=1,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})
    config = transformers.Qwen2_5_VLConfig(vision_config={**TINY, "out_hidden_size": 32}, text_config=text)
    vlm = transformers.Qwen2_5_VLForConditionalGeneration(config)
    randomize_(vlm)
    vlm.save_pretrained(tmp_path / "vlm")
    loaded = create_from_checkpoint(tmp_path / "vlm").eval()  # saved in the hub's layout: visual.*, model.*
    notes = " ".join(loaded.load_report.converted)
    assert "prefix 'visual.'" in notes and "language model" in notes and not loaded.load_report.initialised
    assert_parity(vlm.model.visual.eval(), loaded, SIZES[1])
    report = vit_rope.load_weights(loaded, vlm.state_dict())  # in memory: model.visual.*, model.language_model.*
    assert any("prefix 'model.visual.'" in line for line in report.converted) and not report.initialised
    # the hub's sharded layout: the shards' tower read through the index, the language model's tensors not read
    vlm.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 2 and any(key.startswith("model.") for key in index)
    sharded = create_from_checkpoint(tmp_path / "sharded").eval()
    assert not sharded.load_report.initialised and "0 keys outside it" in " ".join(sharded.load_report.converted)
    assert_parity(vlm.model.visual.eval(), sharded, SIZES[1])
    with pytest.raises(FileNotFoundError, match="lists the shard .* which is not in"):
        (tmp_path / "sharded" / sorted(set(index.values()))[0]).unlink()
        vit_rope.load_weights(sharded, tmp_path / "sharded")


def test_naflex_batch_sample_by_sample_equals_transformers_packed_grid_thw():
    theirs = hf_tower()
    twin = vit_rope.from_timm(theirs)
    torch.manual_seed(1)
    images = [torch.randn(3, P * h, P * w) for h, w in ((6, 10), (8, 4), (2, 2))]
    batch = pack(images, length=64, patch=P)
    with torch.no_grad():
        tokens, merged = twin.forward_features(batch), twin(batch)
    for b, (ref_tokens, ref_merged) in enumerate(hf_outputs(theirs, images)):  # one packed call, grid_thw of three
        assert rel(ref_tokens, tokens[b, :len(ref_tokens)]) < TOL, b
        assert rel(ref_merged, merged[b, :len(ref_merged)]) < TOL, b


def test_windows_change_the_features_and_tools_apply():
    twin = vit_rope.from_timm(hf_tower())
    x = torch.randn(1, 3, 84, 140)
    with torch.no_grad():
        windowed = twin.forward_features(x)
        _, inter = twin.forward_intermediates(x, indices=[0, 3])
        assert inter[1].shape == (1, 64, 6, 10) and rel(windowed, inter[1].flatten(2).transpose(1, 2)) < TOL
        twin.fullatt_block_indexes = (0, 1, 2, 3)  # every block full: no longer transformers' model
        assert rel(windowed, twin.forward_features(x)) > 1e-3
        twin.set_resolution_policy("interpolate")  # a policy applies as to any axial RoPE twin
        assert rel(twin(x), twin.set_resolution_policy("extrapolate") or twin(x)) > 1e-3


def test_refused_inputs_name_what_and_where(tmp_path):
    tower = hf_tower()
    state = tower.state_dict()
    with pytest.raises(ValueError, match="Qwen2.5-VL vision encoder.*vit_rope_qwen2_5_vl_vit.*Qwen3VisionTransformer"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen3_vit_88m_enc", depth=1, device="meta"), state)
    qwen3 = timm.create_model("qwen3_vit_88m_enc", depth=1, device="meta").state_dict()
    ours = timm.create_model("vit_rope_qwen2_5_vl_vit", depth=1, fullatt_block_indexes=(0,), device="meta")
    with pytest.raises(ValueError, match="Qwen3-VL ViT.*Qwen25VisionTransformer"):
        vit_rope.load_weights(ours, qwen3)
    qwen2 = dict(state, **{"merger.ln_q.bias": torch.zeros(64)})
    with pytest.raises(ValueError, match="Qwen2-VL.*no vit_rope twin"):
        vit_rope.load_weights(ours, qwen2)
    with pytest.raises(ValueError, match="rotate_half.*qk_layout='interleaved'"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen2_5_vl_vit", **TWIN, qk_layout="interleaved"), state)
    tower.save_pretrained(tmp_path / "tower")
    with pytest.raises(ValueError, match="window_size is 56 in the file, 112 in the model"):
        vit_rope.load_weights(timm.create_model("vit_rope_qwen2_5_vl_vit", **{**TWIN, "window_size": 112}),
                              tmp_path / "tower")
    config = json.loads((tmp_path / "tower" / "config.json").read_text())
    (tmp_path / "tower" / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1}))
    with pytest.raises(ValueError, match="num_key_value_heads=1.*does not model"):
        create_from_checkpoint(tmp_path / "tower")
    with pytest.raises(ValueError, match="fullatt_block_indexes=\\[7, 15, 23, 31\\].*depth 2"):
        timm.create_model("vit_rope_qwen2_5_vl_vit", depth=2)
    with pytest.raises(ValueError, match="class or register tokens.*class_token"):
        timm.create_model("vit_rope_qwen2_5_vl_vit", class_token=True)


TWIN = dict(embed_dim=64, depth=4, num_heads=2, mlp_ratio=1.5, window_size=56, fullatt_block_indexes=(1, 3),
            merger_out_features=48)


@pytest.mark.slow  # ONNX export and two ORT sessions
def test_twin_exports_to_onnx_at_two_sizes(tmp_path):
    # a windowed block: a full-attention one takes a plain ViT block's inputs (every other ViT's export)
    model = timm.create_model("vit_rope_qwen2_5_vl_vit", **{**TWIN, "depth": 1, "fullatt_block_indexes": ()})
    randomize_(model)
    onnx_sizes(model, tmp_path / "qwen25.onnx", (112, 56))  # windows and the merger's 2x2 blocks follow the grid


def test_image_batches_gather_windows_and_match_the_window_mask(monkeypatch):
    """An image batch attends window by window (no [N, N] mask is built; the edge windows' key mask once per forward,
    shared by the windowed blocks), partial windows included, to the masked form's output and gradients."""
    model = vit_rope.from_timm(hf_tower()).train()
    x = torch.randn(2, 3, 84, 140, requires_grad=True)  # 6x10 patches: windows of 4x4, partial at the edges
    with torch.no_grad():
        inputs = model._block_inputs(model._embed(x))  # blocks 0 and 2 windowed
    assert inputs[0].keys is inputs[2].keys is not None and inputs[0].keys.shape == (2 * 6, 1, 1, 16)

    def step() -> tuple[torch.Tensor, ...]:
        model.zero_grad(), x.grad.zero_() if x.grad is not None else None
        out = model(x)
        out.square().sum().backward()
        return out.detach(), x.grad.clone(), model.patch_embed.proj.weight.grad.clone()

    def no_mask(*args):
        raise AssertionError("an image batch built the window mask")

    monkeypatch.setattr(qwen2_5_vl, "window_bias", no_mask)
    gathered = step()
    monkeypatch.undo()
    monkeypatch.setattr(qwen2_5_vl.Windowed, "attend", BlockInput.attend)  # every windowed block through the mask
    for ours, masked in zip(gathered, step(), strict=True):  # the order of the sums differs: to the scale of each
        torch.testing.assert_close(ours, masked, rtol=1e-4, atol=1e-5 * float(masked.abs().max()))
