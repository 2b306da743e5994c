"""Config loading: inheritance, validation, command-line overrides, and every shipped YAML."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import timm
import yaml

from vit_rope.errors import UserError
from vit_rope.train.command_line import build_config, parse_args
from vit_rope.train.config import Config, load_yaml, save_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates_and_names_a_registered_model(path: Path) -> None:
    model = build_config(path).model  # check_config ran
    if model.startswith("vit_rope_") and not timm.list_models("vit_rope*"):
        pytest.skip("vit_rope models are not registered yet")
    assert timm.is_model(model), f"{path.name}: unknown model {model}"


V3 = CONFIG_DIR / "imagenette_study" / "v3"


def test_v3_arms_share_one_recipe_and_validate_on_the_full_image() -> None:
    """Study v3 compares models, so its control arms differ in the model only and the remedy arm adds train_sizes
    (its coordinate augmentation is a model kwarg); training-time validation uses the study's crop 1.0 for every arm,
    whatever the model's default."""
    base = dataclasses.asdict(build_config(V3 / "mixed.yaml"))
    for path in sorted(set(V3.glob("*.yaml")) - {V3 / "base.yaml"}):  # the arms
        cfg = dataclasses.asdict(build_config(path))
        changed = {key for key in base if cfg[key] != base[key]} - {"model", "model_kwargs"}
        assert changed == ({"train_sizes"} if path.stem == "mixed_coord_sizes" else set()), (path, changed)
        assert (cfg["img_size"], cfg["crop_pct"], cfg["model_kwargs"]["patch_size"]) == (112, 1.0, 8), path


def test_base_yaml_lists_every_key_with_its_default_and_a_comment() -> None:
    base = CONFIG_DIR / "base.yaml"
    assert yaml.safe_load(base.read_text()) == dataclasses.asdict(Config())
    lines = base.read_text().splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith(("#", " ")):
            assert lines[index - 1].startswith("# "), f"base.yaml: key line '{line}' has no comment above it"


def test_experiment_configs_only_override_a_few_keys() -> None:
    for path in CONFIGS:
        if path.name != "base.yaml":
            raw = yaml.safe_load(path.read_text())
            assert "base" in raw, f"{path.name} should inherit with 'base:'"
            assert len(raw) < 25, f"{path.name} repeats base.yaml instead of overriding a few keys"


def test_child_and_command_line_override_the_parent(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text("lr: 4e-3\nepochs: 5\nmodel_kwargs:\n  depth: 6\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\nepochs: 7\nmodel_kwargs: {patch_size: 8}\n")
    cfg = build_config(tmp_path / "child.yaml", ["batch_size=64"])
    assert (cfg.lr, cfg.epochs, cfg.batch_size) == (4e-3, 7, 64)  # '4e-3' is a string to YAML; coerced to float
    assert cfg.model_kwargs == {"patch_size": 8}  # a child's dict replaces the parent's
    assert cfg.weight_decay == Config().weight_decay
    assert build_config(tmp_path / "child.yaml", ["model_kwargs.depth=3"]).model_kwargs == {"patch_size": 8, "depth": 3}
    assert build_config(tmp_path / "child.yaml", ["model_kwargs={depth: 3}"]).model_kwargs == {"depth": 3}


def test_unknown_key_in_file_names_key_file_and_closest_match(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("learning_rat: 0.1\n")
    with pytest.raises(UserError, match=r"unknown config key 'learning_rat' in .*bad\.yaml.*did you mean"):
        load_yaml(tmp_path / "bad.yaml")
    # a typo: the closest spelling; another trainer's name: ours, not the closest spelling
    for other, ours in (("epoch", "epochs"), ("learning_rate", "lr"), ("aa", "auto_augment"),
                        ("drop_path_rate", "drop_path")):
        (tmp_path / "other.yaml").write_text(f"{other}: 1\n")
        with pytest.raises(UserError, match=f"did you mean '{ours}'"):
            load_yaml(tmp_path / "other.yaml")


@pytest.mark.parametrize("overrides, message", [
    ("batchsize=4", "unknown config key 'batchsize' on the command line; did you mean 'batch_size'"),
    ("epochs=abc", "'epochs' on the command line must be int, got 'abc'"),
    ("device=gpu", "must be 'auto' or 'cuda' or 'cpu', got 'gpu'"),
    ("img_size=0", "'img_size' must be > 0, got 0"),
    ("hflip=2", "'hflip' must be between 0 and 1"),
    ("batch_size=7", "batch_size must be even when mixup or cutmix is on"),
    ("lr", "not of the form key=value"),
    ("epochs.x=1", "only dict keys such as model_kwargs take a '.'"),
    ("lr=[1,", "command-line override 'lr=[1,' is not valid YAML (expected the node content, but found '<stream "
               "end>'); write lists as [1, 2]"),
    ("model_kwargs.depth={a", "command-line override 'model_kwargs.depth={a' is not valid YAML"),
    ("batch_size=1.5", "'batch_size' on the command line must be int, got 1.5"),
    ("scale=3", "'scale' on the command line must be a list of float, got 3"),
    ("train_sizes=[32, 0]", "'train_sizes' must list sizes > 0 (pixels), got 0"),
    ("train_sizes=[32, a]", "'train_sizes' on the command line must be int, got 'a' (an entry of [32, 'a'])"),
    ("model_kwargs=[1]", "'model_kwargs' on the command line must be a mapping such as {depth: 6}, got [1]"),
    ("lr=nan", "'lr' on the command line must be a finite number, got 'nan'"),
    ("crop_pct=abc", "'crop_pct' on the command line must be a finite number or null, got 'abc'"),
    ("amp=maybe", "'amp' on the command line must be true or false, got 'maybe'"),
    ("seed=-1", "'seed' must be >= 0, got -1"),
    ("epochs=-3", "'epochs' must be > 0, got -3"),
    ("drop_path=1", "'drop_path' must be in [0, 1) (the probability that a block is skipped), got 1.0"),
    ("crop_pct=0", "'crop_pct' must be in (0, 1] (the fraction of the resized image that the center crop keeps), got "
                   "0.0"),
    ("crop_pct=1.2", "'crop_pct' must be in (0, 1]"),
    ("model_ema_decay=2", "'model_ema_decay' must be between 0 and 1, got 2.0"),
    ("clip_grad=0", "'clip_grad' must be > 0, got 0.0"),
    ("scale=[0.5, 2]", "'scale' must be [min, max] crop area fractions with 0 < min <= max <= 1, got [0.5, 2.0]"),
    ("opt=adamx", "unknown optimizer opt=adamx; did you mean opt=adamax? (timm.optim.list_optimizers() lists them"),
    ("opt=foo_adamw", "unknown optimizer opt=foo_adamw; did you mean opt=adamw?"),
    ("sched=cosin", "unknown scheduler sched=cosin; did you mean sched=cosine?"),
    ("sched=none", "sched=none builds no schedule, and train.py steps one every update"),
    ("interpolation=bicubik", "'interpolation' must be one of nearest, bilinear, bicubic, box, hamming, lanczos or "
                              "null (the model's default), got 'bicubik'"),
    ("auto_augment=bogus", "auto_augment=bogus is not a timm auto-augment string (Unknown AA policy bogus); use e.g."),
    (("naflex=true", "train_sizes=[32, 48]"), "naflex=true does not go with train_sizes (NaFlex draws each step's "
                                              "sequence length from naflex_seq_lens): set train_sizes=[]"),
    (("naflex=true", "repeated_aug=true"), "naflex=true does not go with repeated_aug"),
    (("naflex=true", "pipeline=tensor"), "naflex=true does not go with pipeline=tensor"),
    (("naflex=true", "train_crop_mode=rkrc"), "naflex=true does not go with train_crop_mode=rkrc"),
    (("naflex=true", "naflex_seq_lens=[]"), "config key 'naflex_seq_lens' must list sequence lengths >= 1"),
    (("naflex=true", "naflex_seq_lens=[0, 16]"), "config key 'naflex_seq_lens' must list sequence lengths >= 1"),
    ("naflex_val_seq_len=-1", "config key 'naflex_val_seq_len' must be >= 1 patches, or 0"),
])
def test_bad_values_name_the_key_the_value_and_the_fix(overrides: str | tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError) as info:
        build_config(None, [overrides] if isinstance(overrides, str) else list(overrides))
    assert message in str(info.value)


@pytest.mark.parametrize("key", [field.name for field in dataclasses.fields(Config)])
def test_every_key_is_type_checked_on_the_command_line_and_in_files(key: str, tmp_path: Path) -> None:
    """A mapping is the wrong type for every key but model_kwargs, which a list is wrong for; the message names the
    key, the value and the type the key takes (text keys take command-line text verbatim, so only files test them)."""
    wrong = "[1]" if key == "model_kwargs" else "{a: 1}"
    (tmp_path / "bad.yaml").write_text(f"{key}: {wrong}\n")
    with pytest.raises(UserError, match=rf"^config key '{key}' in .*bad\.yaml must be .+, got (\[1\]|\{{'a': 1\}})$"):
        build_config(tmp_path / "bad.yaml")
    if key not in ("output", "data_dir", "dataset", "train_split", "val_split", "input_key", "target_key", "resume",
                   "finetune", "model", "cache_dir", "interpolation", "auto_augment", "opt", "sched"):  # str keys
        with pytest.raises(UserError, match=rf"^config key '{key}' on the command line must be .+, got"):
            build_config(None, [f"{key}={wrong}"])


def test_lookahead_optimizers_and_every_documented_scheduler_are_accepted() -> None:
    assert build_config(None, ["opt=lookahead_adamw"]).opt == "lookahead_adamw"
    for sched in ("cosine", "tanh", "step", "multistep", "plateau", "poly"):
        assert build_config(None, [f"sched={sched}"]).sched == sched


def test_keep_every_beyond_the_run_and_warmup_as_long_as_the_run_warn_with_the_fix() -> None:
    with pytest.warns(UserWarning, match="keep_every 50 is more than the 30 epochs.*set keep_every to 30 or less"):
        build_config(None, ["epochs=30", "keep_every=50"])
    with pytest.warns(UserWarning, match=r"warmup_epochs 5 is not less than the 5 epochs.*never reaches lr=0.001"):
        build_config(None, ["epochs=5", "warmup_epochs=5", "lr=1e-3"])


def test_inheritance_loop_and_missing_file_are_user_errors(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(UserError, match="loops back"):
        load_yaml(tmp_path / "a.yaml")
    with pytest.raises(UserError, match="does not exist; pass an existing YAML file with -c"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="is a folder"):
        load_yaml(tmp_path)
    (tmp_path / "child.yaml").write_text("base: gone.yaml\n")  # the line to fix is in the child, not -c
    with pytest.raises(UserError, match=r"gone\.yaml does not exist; named by 'base:' in .*child\.yaml; fix that line"):
        load_yaml(tmp_path / "child.yaml")


@pytest.mark.filterwarnings("ignore:warmup_epochs 5 is not less than the 3 epochs")  # the defaults' warmup
def test_cli_flags_and_overrides_mix_and_text_values_stay_verbatim(tmp_path: Path) -> None:
    cfg = parse_args(["--epochs", "3", "crop_pct=null", "--output", str(tmp_path / "a: b #1"), "--model", "m",
                      "scale=[0.5, 1.0]", "--resume", "null"])
    assert (cfg.epochs, cfg.crop_pct, cfg.output, cfg.model, cfg.scale, cfg.resume) == (
        3, None, str(tmp_path / "a: b #1"), "m", [0.5, 1.0], None)


def test_saved_config_reloads_to_the_same_config(tmp_path: Path) -> None:
    cfg = build_config(CONFIG_DIR / "base.yaml", ["lr=0.01", "model_kwargs.depth=2"])
    save_config(cfg, tmp_path / "config.yaml")
    assert build_config(tmp_path / "config.yaml") == cfg


def test_output_that_is_a_file_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "best.pth").write_bytes(b"weights")
    with pytest.raises(UserError, match=r"output .*best.pth is a file, not a folder"):
        build_config(None, [f"output={tmp_path / 'best.pth'}"])
    assert build_config(None, [f"output={tmp_path / 'new'}"]).output == str(tmp_path / "new")  # made later

