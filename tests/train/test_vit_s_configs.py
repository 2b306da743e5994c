"""The ViT-S 14x14-grid study for CUDA users (configs/imagenette_vit_s, ``make study-vit-s``), checked on the CPU.

Nobody on this project has a GPU to try it on, so a config that fails to parse, a model that does not build or a
pipeline that falls back to timm's per-image loader would first be found by a user: these catch that here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from vit_rope.models.registry import create_model
from vit_rope.train.command_line import build_config
from vit_rope.train.loaders import choose_pipeline

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs" / "imagenette_vit_s"
CONFIGS = sorted(path for path in CONFIG_DIR.glob("*.yaml") if path.name != "base.yaml")
PER_MODEL_KEYS = {"model", "model_kwargs", "output"}  # what each file may set beside base.yaml's recipe


def test_one_config_per_position_encoding_with_one_recipe():
    assert {path.stem for path in CONFIGS} == {"ape", "axial", "mixed"}
    recipes = [{key: value for key, value in dataclasses.asdict(build_config(path)).items()
                if key not in PER_MODEL_KEYS} for path in CONFIGS]
    assert all(recipe == recipes[0] for recipe in recipes), "the arms must differ only in the model"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_config_builds_vit_s_on_a_14x14_grid_with_the_tensor_pipeline(path):
    cfg = build_config(path)
    assert choose_pipeline(cfg)[0] == "tensor"
    assert (cfg.amp, cfg.amp_dtype, cfg.compile, cfg.channels_last) == (True, "bfloat16", True, True)
    assert cfg.decoded_cache and cfg.data_dir is None  # ../shared/data/imagenette, or the study's --data-dir
    torch.manual_seed(0)
    model, _ = create_model(cfg.model, {"num_classes": 10, "img_size": cfg.img_size, "drop_path_rate": cfg.drop_path,
                                        **cfg.model_kwargs})
    patch = model.patch_embed.patch_size
    assert patch == (8, 8) and cfg.img_size % patch[0] == 0 and cfg.img_size // patch[0] == 14
    assert tuple(model.patch_embed.grid_size) == (14, 14)
    assert model.embed_dim == 384 and len(model.blocks) == 12  # ViT-S
    # the same block as the RoPE models: class token, LayerScale at 1e-5, no position embedding on the class token
    assert model.cls_token is not None and model.num_prefix_tokens == 1
    assert torch.allclose(model.blocks[0].ls1.gamma, torch.full_like(model.blocks[0].ls1.gamma, 1e-5))
    if getattr(model, "pos_embed", None) is not None:
        assert model.no_embed_class and model.pos_embed.shape[1] == 14 * 14
    with torch.inference_mode():
        assert model.eval()(torch.randn(1, 3, cfg.img_size, cfg.img_size)).shape == (1, 10)


def study_script():
    spec = importlib.util.spec_from_file_location("imagenette_study", REPO / "scripts" / "imagenette_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_study_evaluates_0_7x_to_2_3x_in_whole_patches():
    script = study_script()
    sizes, train_size = script.SIZES["vit_s"], build_config(CONFIGS[0]).img_size
    assert script.STUDIES["vit_s"][0] == "configs/imagenette_vit_s"
    assert set(script.STUDIES["vit_s"][3]) == {path.stem for path in CONFIGS}
    assert sizes == sorted(sizes) and train_size in sizes and all(size % 8 == 0 for size in sizes)
    assert 0.65 <= sizes[0] / train_size <= 0.75 and 2.25 <= sizes[-1] / train_size <= 2.35


def test_study_trains_with_torchrun_on_several_gpus_keeping_the_global_batch(tmp_path, monkeypatch):
    script, calls = study_script(), []
    monkeypatch.setattr(script, "run", lambda command: calls.append(command) or 0.0)
    monkeypatch.setattr(script, "finished", lambda path, epochs: False)
    with pytest.raises(FileNotFoundError):  # the stand-in trains nothing, so there is no metrics.csv to copy
        script.main(["--study", "vit_s", "--arms", "ape", "--seeds", "0", "--gpus", "4", "--data-dir", "/data/in",
                     "--results", str(tmp_path / "results"), "--runs", str(tmp_path / "runs")])
    command = calls[0]
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "train.py"]
    assert "batch_size=64" in command and command[command.index("--data-dir") + 1] == "/data/in"
