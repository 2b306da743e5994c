"""End-to-end training runs of a tiny ViT on a generated ImageFolder (CPU): outputs, resume, bad input
(DDP: test_train_datasets' DDP test, one launch of its ranks for the folder's pipelines and the shards)."""

from __future__ import annotations

import runpy
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

import train
from helpers.training import REPO, TINY_MODEL, assert_same_weights, killed_at, metrics, tiny_args
from vit_rope.data import folders
from vit_rope.data.steps import SizeSchedule
from vit_rope.eval.loading import load_trained
from vit_rope.train import engine
from vit_rope.train.command_line import build_config
from vit_rope.train.state import save_checkpoint

MULTIRES = ("decoded_cache=true", "train_sizes=[32, 48]")  # variable resolution needs the batched tensor pipeline
NAFLEX = ("naflex=true", "naflex_seq_lens=[9, 16]")  # native aspect ratios: 3 or 4 patches a side, 8 images a step


def test_two_epochs_learn_and_write_every_output(image_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert train.main(tiny_args(image_root, out, "batch_size=4", "keep_every=2", "model_ema=true")) == 0
    assert {p.name for p in out.iterdir()} >= {"config.yaml", "metrics.csv", "last.pth", "best.pth", "epoch_2.pth"}
    assert not (out / "epoch_1.pth").exists()  # kept every 2 epochs only
    kept, last = (torch.load(out / name, weights_only=True) for name in ("epoch_2.pth", "last.pth"))
    assert kept["epoch"] == 2 and all(torch.equal(kept["model"][k], v) for k, v in last["model"].items())
    assert {"format", "model_name", "model_kwargs", "classes", "model", "model_ema", "optimizer", "scheduler",
            "scaler", "epoch", "best_top1", "rng", "config", "metrics"} <= set(last)  # weights_only loads it all
    assert last["classes"] == ["class_0", "class_1", "class_2"]
    model = timm.create_model(last["model_name"], **last["model_kwargs"])  # the checkpoint alone rebuilds the model
    model.load_state_dict(last["model"])
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 3)
    rows = metrics(out)
    assert [row["epoch"] for row in rows] == ["1", "2"]
    assert list(rows[0]) == ["epoch", "train_loss", "val_loss", "top1", "top5", "lr", "images_per_s", "seconds",
                             "ema_top1", "ema_top5", "tokens_per_s", "sizes"]  # newer columns last: older keep places
    assert rows[0]["sizes"] == "32:6"  # 24 images in batches of 4, all at img_size
    assert float(rows[0]["tokens_per_s"]) == pytest.approx(4 * float(rows[0]["images_per_s"]), rel=1e-4)  # 2x2 patches
    assert float(rows[1]["train_loss"]) < float(rows[0]["train_loss"])
    assert 0 <= float(rows[1]["top1"]) <= 100 and float(rows[1]["top5"]) == 100  # 3 classes: top-5 is everything
    assert "top1" in capsys.readouterr().out
    assert build_config(out / "config.yaml").data_dir == str(image_root)  # the resolved config repeats the run


SWIN = "swin_rope_mixed_tiny_patch4_window7_224"


def test_a_rope_swin_trains_and_its_checkpoint_rebuilds_with_its_learned_frequencies(image_root: Path,
                                                                                    tmp_path: Path) -> None:
    """train.py on a RoPE-Swin (configs/imagenette_swin.yaml's shape, smaller): the frequencies train without weight
    decay (RoPE-ViT), the loss falls, and the checkpoint rebuilds the model with the trained frequencies."""
    out = tmp_path / "swin"
    shape = "model_kwargs={embed_dim: 32, depths: [2, 2], num_heads: [1, 2], window_size: 4}"
    args = [arg for arg in tiny_args(image_root, out, "batch_size=4", "--model", SWIN, shape)
            if arg != "model_kwargs.depth=2"]
    assert train.main(args) == 0
    rows = metrics(out)
    assert float(rows[1]["train_loss"]) < float(rows[0]["train_loss"])
    state = torch.load(out / "last.pth", weights_only=True)
    torch.manual_seed(0)
    fresh = timm.create_model(SWIN, num_classes=3, img_size=32, embed_dim=32, depths=[2, 2], num_heads=[1, 2],
                              window_size=4)
    frequencies = [key for key in state["model"] if key.endswith("attn.rope.freqs")]
    assert len(frequencies) == 4 and not all(torch.equal(state["model"][k], fresh.state_dict()[k]) for k in frequencies)
    assert {n for n in fresh.no_weight_decay() if n.endswith("rope.freqs")} == set(frequencies)
    rebuilt = load_trained(out / "last.pth", use_ema=False).model.state_dict()
    assert all(torch.equal(rebuilt[k], state["model"][k]) for k in frequencies)


def test_a_crash_while_writing_last_pth_loses_no_kept_checkpoint(image_root: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    # best.pth and epoch_E.pth are written before last.pth: a crash in between leaves last.pth an epoch behind, and
    # the resumed run redoes that epoch and writes them again
    out, real_save = tmp_path / "run", train.train_state.save_checkpoint

    def crash_on_last_of_epoch_2(state: dict, path: Path) -> None:
        if path.name == "last.pth" and state["epoch"] == 2:
            raise KeyboardInterrupt
        real_save(state, path)

    monkeypatch.setattr(train.train_state, "save_checkpoint", crash_on_last_of_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train.main(tiny_args(image_root, out, "keep_every=2"))
    monkeypatch.setattr(train.train_state, "save_checkpoint", real_save)
    assert torch.load(out / "last.pth", weights_only=True)["epoch"] == 1
    assert torch.load(out / "epoch_2.pth", weights_only=True)["epoch"] == 2
    assert train.main(tiny_args(image_root, out, "keep_every=2", "--resume", str(out / "last.pth"))) == 0
    kept, last = (torch.load(out / name, weights_only=True) for name in ("epoch_2.pth", "last.pth"))
    assert kept["epoch"] == last["epoch"] == 2
    assert all(torch.equal(kept["model"][k], v) for k, v in last["model"].items())  # rewritten by the resumed run
    assert [row["epoch"] for row in metrics(out)] == ["1", "2"]


TENSOR = ("decoded_cache=true", "auto_augment=null", "reprob=0", "train_sizes=[32, 48, 64]")  # a size per step
KILLED = {  # step: killed after step 1 of epoch 2 (resumed from epoch 1's end) or 3 (from epoch 2's step-2 checkpoint)
    "workers0": (("workers=0",), 1),  # augmentation in this process
    "workers1": (("workers=1",), 1),  # augmentation in a loader worker process
    "tensor": (TENSOR, 1),
    "naflex": (("workers=1", *NAFLEX), 1),  # timm's NaFlex loader: transforms, Mixup in a worker, erasing on the device
    "per_image_mid_epoch": (("workers=1", "train_sizes=[32, 48, 64]"), 3),
    "tensor_mid_epoch": (TENSOR, 3),
    "naflex_mid_epoch": (NAFLEX, 3),  # in this process
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, tuple[str, ...]], Path]:
    """``run(image_root, args)``: the folder of an uninterrupted run with ``args``, trained once for the killed runs
    that share them (tensor and tensor_mid_epoch): every tiny folder holds the same images in the same order."""
    runs: dict[tuple[str, ...], Path] = {}

    def run(image_root: Path, args: tuple[str, ...]) -> Path:
        if args not in runs:
            runs[args] = tmp_path_factory.mktemp("straight")
            assert train.main(tiny_args(image_root, runs[args], *args)) == 0
        return runs[args]

    return run


@pytest.mark.parametrize("case, device", [(case, device) for case, (_, step) in KILLED.items()  # cuda: bf16 autocast,
                                          for device in ("cpu", "cuda")[:4 - step]])  # channels-last, CUDA RNG
def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_run(image_root: Path, tmp_path: Path, capsys,
                                                                      monkeypatch, uninterrupted, case: str,
                                                                      device: str) -> None:
    # 24 images in steps of 8 at 32 px: 3 steps per epoch, a checkpoint after step 2; the kill comes before any
    # checkpoint of its step, so the resumed run redoes it; every source of randomness on: data order, RandAugment,
    # random erasing, Mixup/CutMix, drop-path, EMA, and the CUDA RNG's state
    extra, step = KILLED[case]
    args = ("checkpoint_interval=2", "mixup=0.8", "cutmix=1.0", "drop_path=0.1", "auto_augment=rand-m9-mstd0.5-inc1",
            "reprob=0.25", "model_ema=true", "warmup_epochs=1", "--device", device, *extra)
    straight, resumed = uninterrupted(image_root, args), tmp_path / "resumed"
    with monkeypatch.context() as patch:
        patch.setattr(engine.Progress, "update", killed_at(2, step))
        with pytest.raises(KeyboardInterrupt):
            train.main(tiny_args(image_root, resumed, *args))
    ckpt = torch.load(resumed / "last.pth", weights_only=True)
    assert (ckpt["epoch"], ckpt.get("step", 0), ckpt.get("epoch_totals", {}).get("steps")) == (
        (1, 2, 2) if step == 3 else (1, 0, None))  # epoch 2 in progress, or epoch 1 done
    capsys.readouterr()
    assert train.main(tiny_args(image_root, resumed, *args, "--resume", str(resumed / "last.pth"))) == 0
    assert ("at epoch 1, step 2\n" if step == 3 else "at epoch 1\n") in capsys.readouterr().out
    assert_same_weights(straight, resumed)
    rows = metrics(straight)
    assert [{key: row[key] for key in ("epoch", "train_loss", "sizes", "lr")} for row in metrics(resumed)] == [
        {key: row[key] for key in ("epoch", "train_loss", "sizes", "lr")} for row in rows]
    assert " " in rows[1]["sizes"] or "train_sizes=[32, 48, 64]" not in extra  # several sizes drawn in epoch 2


@pytest.mark.parametrize("extra", [
    (),  # timm's per-image transforms: iterating a DataLoader draws its workers' base seed from the global RNG
    ("decoded_cache=true", "auto_augment=null", "reprob=0", "train_sizes=[32, 48]"),  # the tensor pipeline
], ids=["per_image", "tensor"])
def test_validating_less_often_trains_the_same_weights(image_root: Path, tmp_path: Path,
                                                      extra: tuple[str, ...]) -> None:
    # every source of randomness on; 3 epochs, validated every 2 epochs and after the last: epochs 2 and 3
    args = ("--epochs", "3", "mixup=0.8", "cutmix=1.0", "drop_path=0.1", "auto_augment=rand-m9-mstd0.5-inc1",
            "reprob=0.25", "model_ema=true", "model_kwargs.depth=1", *extra)
    every, sparse = tmp_path / "every", tmp_path / "sparse"
    assert train.main(tiny_args(image_root, every, *args)) == 0
    assert train.main(tiny_args(image_root, sparse, *args, "val_interval=2")) == 0
    assert_same_weights(every, sparse)
    full, rows = metrics(every), metrics(sparse)
    assert [row["top1"] != "" for row in rows] == [False, True, True]
    for row, reference in zip(rows, full, strict=True):
        assert row["train_loss"] == reference["train_loss"]
        assert row["top1"] in ("", reference["top1"]) and row["val_loss"] in ("", reference["val_loss"])
    best = torch.load(sparse / "best.pth", weights_only=True)
    validated = {int(row["epoch"]): float(row["top1"]) for row in rows if row["top1"]}
    first_best = min(epoch for epoch, top1 in validated.items() if top1 == max(validated.values()))
    assert best["epoch"] == first_best and best["best_top1"] == pytest.approx(validated[first_best], abs=1e-4)


@pytest.mark.parametrize("model, kwargs", [
    (TINY_MODEL, "{depth: 1}"),  # ours
    ("vit_tiny_patch16_224", "{depth: 1}"),  # timm ViT with a learned position embedding (APE), resampled per step
    ("vit_small_patch16_rope_mixed_224", "{depth: 1, embed_dim: 96, num_heads: 2}"),  # timm's RoPE port
    ("resnet10t", "{channels: [8, 16, 32, 64], stem_width: 8}"),  # a CNN: any size runs, no dynamic_img_size to pass
])
def test_train_sizes_draw_a_size_per_step_under_the_token_budget(image_root: Path, tmp_path: Path, capsys,
                                                                  model: str, kwargs: str) -> None:
    out = tmp_path / "run"
    assert train.main(tiny_args(image_root, out, "--epochs", "1", "--model", model, f"model_kwargs={kwargs}",
                                "model_ema=true", *MULTIRES)) == 0
    schedule = SizeSchedule((32, 48), 32, 8)
    drawn = [schedule(0, step) for step in range(3)]  # 24 images: 3 steps, as without train_sizes
    row = metrics(out)[0]
    assert row["sizes"] == "32:2 48:1" and [size for size, _ in drawn] == [32, 32, 48]
    patches = sum(batch * (size / 16) ** 2 for size, batch in drawn) / sum(batch for _, batch in drawn)
    if model != "resnet10t":  # CNNs count pixels / 256 as tokens, which for 16 px patches is the same number
        assert float(row["tokens_per_s"]) == pytest.approx(patches * float(row["images_per_s"]), rel=1e-4)
    printed = capsys.readouterr().out
    assert "sizes 32:2 48:1" in printed and "32 px x 8, 48 px x 3 images (token budget of 8 x 32 px)" in printed
    ckpt = torch.load(out / "last.pth", weights_only=True)
    assert bool(ckpt["model_kwargs"].get("dynamic_img_size")) is (model != "resnet10t")
    net = timm.create_model(ckpt["model_name"], **ckpt["model_kwargs"])
    net.load_state_dict(ckpt["model"])
    if model == "vit_tiny_patch16_224":
        assert ckpt["model"]["pos_embed"].shape[1] == 5  # still the 2x2 grid of img_size (+ class token)
    assert net(torch.zeros(1, 3, 48, 48)).shape == (1, 3)


@pytest.mark.parametrize("extra, message", [
    (("train_sizes=[32, 40]",), f"train_sizes entry 40 is not a positive multiple of the patch size 16 of "
                                f"'{TINY_MODEL}': use 32 or 48"),
    (("--img-size", "36"), f"img_size 36 is not a positive multiple of the patch size 16 of '{TINY_MODEL}': "
                           "use 32 or 48"),
    (("model_kwargs.embed_dim=100",), f"model '{TINY_MODEL}' cannot be built with {{'num_classes': 3, 'img_size': 32, "
                                      "'drop_path_rate': 0.0, 'depth': 2, 'embed_dim': 100} (ValueError: embed_dim=100 "
                                      "must be divisible by num_heads=3.); fix model_kwargs"),
    (("model_kwargs.foo=1",), "got an unexpected keyword argument 'foo'); fix model_kwargs"),
    (("model_kwargs.patch_size=0",), "(ZeroDivisionError: integer division or modulo by zero); fix model_kwargs"),
    (("model_kwargs.pretrained=true", "model_kwargs.pretrained_cfg_overlay={file: missing.pth}"),
     f"model '{TINY_MODEL}' builds, but its pretrained weights (missing.pth) do not load (FileNotFoundError); check "
     "the weights file, or fix model_kwargs to match it"),
    (("workers=-2",), "config key 'workers' must be >= 0, got -2"),
    (("val_interval=0",), "config key 'val_interval' must be > 0, got 0"),
    (("sched=plateau", "val_interval=2"), "sched=plateau steps on every epoch's val top-1, so it needs val_interval=1, "
                                          "got val_interval=2"),
    (("naflex=true", "naflex_seq_lens=[4, 9, 16]", "--model", "resnet10t", "model_kwargs={}"),
     "naflex=true needs a model that takes NaFlex batches with square patches, and 'resnet10t' (ResNet) does not"),
])
def test_bad_input_exits_2_naming_it_before_any_image_is_decoded(image_root: Path, tmp_path: Path, capsys,
                                                                  extra: tuple[str, ...], message: str) -> None:
    cache = tmp_path / "cache"
    assert train.main(tiny_args(image_root, tmp_path / "run", "decoded_cache=true", f"cache_dir={cache}", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists() and not cache.exists()


def test_weights_of_another_architecture_are_listed_key_by_key(image_root: Path, tmp_path: Path, capsys) -> None:
    """--resume and finetune= with a 4-block checkpoint into a 2-block run: the keys that do not fit, shortened."""
    deeper = timm.create_model(TINY_MODEL, depth=4, num_classes=3, img_size=32).state_dict()
    extra = [key for key in deeper if key.startswith(("blocks.2.", "blocks.3.", "pos_encoding.2.", "pos_encoding.3."))]
    save_checkpoint({"model_name": TINY_MODEL, "model": deeper}, tmp_path / "deeper.pth")
    cache = tmp_path / "cache"
    listed = f"({len(extra)} unexpected keys: {', '.join(extra[:10])}, ... ({len(extra) - 10} more))"
    for option, fix in ((("--resume", str(tmp_path / "deeper.pth")), "resume with the model and optimizer settings of "
                                                                      "the run that wrote it"),
                        ((f"finetune={tmp_path / 'deeper.pth'}",), "start from a checkpoint of this model")):
        assert train.main(tiny_args(image_root, tmp_path / "run", "decoded_cache=true", f"cache_dir={cache}",
                                    *option)) == 2
        err = capsys.readouterr().err
        assert err == f"error: the model weights in {tmp_path / 'deeper.pth'} does not fit this run {listed}; {fix}" + (
            " (model and model_kwargs of the run that wrote it)\n" if "finetune" in option[0] else "\n")
        assert not cache.exists()


def test_unreadable_image_is_skipped_and_counted_in_the_epoch_summary(image_root: Path, tmp_path: Path,
                                                                        capsys) -> None:
    bad = image_root / "train" / "class_1" / "5.jpg"
    bad.write_bytes(b"not an image at all")
    assert train.main(tiny_args(image_root, tmp_path / "run", "--epochs", "1")) == 0
    assert "(1 unreadable image(s) skipped)" in capsys.readouterr().out  # any pipeline's count (tests/data: each)


def test_diverging_loss_stops_naming_epoch_and_step_and_keeps_last_checkpoint(image_root: Path, tmp_path: Path,
                                                                               capsys) -> None:
    # a step schedule that multiplies the lr by 1e30 after epoch 1 makes epoch 2 blow up
    out = tmp_path / "run"
    code = train.main(tiny_args(image_root, out, "sched=step", "decay_epochs=1", "decay_rate=1e30", "opt=sgd",
                                "lr=0.1"))
    err = capsys.readouterr().err
    assert code == 1
    assert "at epoch 2, step 2 of 3" in err and "last.pth (epoch 1) is the last good checkpoint" in err
    assert torch.load(out / "last.pth", weights_only=True)["epoch"] == 1


@pytest.mark.parametrize("breakage, message", [
    (lambda root: (root / "train").rename(root / "training"), "/train does not exist"),
    (lambda root: [p.unlink() for p in (root / "val" / "class_0").iterdir()], "val/class_0 holds no images"),
    (lambda root: [shutil.rmtree(d) for split in ("train", "val") for d in (root / split).iterdir()
                   if d.name != "class_0"], "/train has 1 class (class_0); a classifier needs two or more"),
    (lambda root: [p.write_bytes(b"broken") for p in (root / "val").rglob("*.*")], "images under"),
])
def test_bad_data_folder_exits_2_with_one_line(image_root: Path, tmp_path: Path, capsys, breakage,
                                               message: str) -> None:
    breakage(image_root)
    assert train.main(tiny_args(image_root, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_val_split_names_the_evaluation_folder(image_root: Path, tmp_path: Path, capsys) -> None:
    (image_root / "val").rename(image_root / "test")  # CIFAR-10 as an ImageFolder ships train/ and test/
    assert train.main(tiny_args(image_root, tmp_path / "run", "--epochs", "1")) == 2
    err = capsys.readouterr().err
    assert "val does not exist" in err and "it has test/: set val_split=test" in err
    assert train.main(tiny_args(image_root, tmp_path / "run", "--epochs", "1", "val_split=test")) == 0
    assert build_config(tmp_path / "run" / "config.yaml").val_split == "test"
    assert 0 <= float(metrics(tmp_path / "run")[0]["top1"]) <= 100


def test_resume_from_something_else_is_a_clear_error(image_root: Path, tmp_path: Path, capsys) -> None:
    """Exit 2 and load_checkpoint's message (each kind of file it refuses: test_state.py)."""
    (tmp_path / "notes.pth").write_text("hello")
    assert train.main(tiny_args(image_root, tmp_path / "run", "--resume", str(tmp_path / "notes.pth"))) == 2
    assert "is not a vit-rope training checkpoint: torch.load failed" in capsys.readouterr().err


def test_an_unknown_model_suggests_the_closest_name(image_root: Path, tmp_path: Path, capsys) -> None:
    assert train.main(tiny_args(image_root, tmp_path / "run", "--model", "vit_tiny_patch16_22")) == 2
    assert "did you mean 'vit_tiny_patch16_224'" in capsys.readouterr().err


def test_finetune_at_a_higher_resolution_resamples_the_position_embedding(image_root: Path, tmp_path: Path) -> None:
    model = TINY_MODEL.replace("mixed", "mixed_ape")
    assert train.main(tiny_args(image_root, tmp_path / "low", "--model", model, "--epochs", "1")) == 0
    assert train.main(tiny_args(image_root, tmp_path / "high", "--model", model, "--epochs", "1", "--img-size", "48",
                                f"finetune={tmp_path / 'low' / 'last.pth'}")) == 0
    pos_embed = torch.load(tmp_path / "high" / "last.pth", weights_only=True)["model"]["pos_embed"]
    assert pos_embed.shape[1] in (9, 10)  # 3x3 patches (+ class token unless no_embed_class)


def test_mixed_rope_frequencies_get_no_weight_decay(image_root: Path, tmp_path: Path, monkeypatch) -> None:
    built = {}

    def spy(model, **kwargs):
        built.update(model=model, optimizer=create_optimizer_v2(model, **kwargs))
        return built["optimizer"]

    monkeypatch.setattr(train, "create_optimizer_v2", spy)
    assert train.main(tiny_args(image_root, tmp_path / "run", "--epochs", "1", "opt=lamb", "weight_decay=0.05")) == 0
    decay = {id(p): group["weight_decay"] for group in built["optimizer"].param_groups for p in group["params"]}
    freqs = [p for name, p in built["model"].named_parameters() if name.startswith("pos_encoding.")]
    assert len(freqs) == 2 and all(decay[id(p)] == 0 for p in freqs)  # one frequency tensor per block
    assert decay[id(built["model"].blocks[0].attn.qkv.weight)] == 0.05


def test_run_log_drops_rows_past_the_resumed_epoch_and_feeds_tensorboard(tmp_path: Path, monkeypatch) -> None:
    scalars = []

    class FakeWriter:  # tensorboard is optional and not installed in CI
        def __init__(self, logdir: str) -> None:
            assert logdir == str(tmp_path / "tensorboard")

        def add_scalar(self, key: str, value: float, step: int) -> None:
            scalars.append((key, value, step))

        flush = close = lambda self: None

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    log = engine.RunLog(tmp_path, ["epoch", "top1"], resume_epoch=None)
    for epoch in (1, 2, 3):
        log.write({"epoch": epoch, "top1": 10.0 * epoch})
    log.close()
    engine.RunLog(tmp_path, ["epoch", "top1"], resume_epoch=2).close()
    assert [row["epoch"] for row in metrics(tmp_path)] == ["1", "2"]
    assert ("top1", 30.0, 3) in scalars


def test_command_line_exit_code_and_single_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """train.py run as a script exits with main's code (a fresh interpreter's clean stderr: the torchrun test)."""
    monkeypatch.setattr(sys, "argv", ["train.py", "--data-dir", str(tmp_path / "nowhere"), "--device", "cpu"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path / 'nowhere' / 'train'} does not exist; the data dir needs train/ with one folder per class"]


def test_finetune_onto_other_classes_starts_a_new_classifier(image_root: Path, tmp_path: Path, capsys) -> None:
    """As many other classes (Imagenette to Imagewoof: the checkpoint's saved class names tell), the same ones (the
    classifier is kept), and fewer (a new, smaller classifier on the checkpoint's body)."""
    assert train.main(tiny_args(image_root, tmp_path / "three", "--epochs", "1")) == 0
    replaced = "its classifier (head.weight, head.bias) is replaced by a new one"
    for split in ("train", "val"):
        (image_root / split / "class_0").rename(image_root / split / "class_9")
    assert train.main(tiny_args(image_root, tmp_path / "renamed", "--epochs", "1",
                                f"finetune={tmp_path / 'three' / 'last.pth'}")) == 0
    assert replaced in capsys.readouterr().out
    assert train.main(tiny_args(image_root, tmp_path / "same", "--epochs", "1",
                                f"finetune={tmp_path / 'renamed' / 'last.pth'}")) == 0
    assert "classifier" not in capsys.readouterr().out  # the same classes: it is kept
    shutil.rmtree(image_root / "train" / "class_2")
    shutil.rmtree(image_root / "val" / "class_2")
    assert train.main(tiny_args(image_root, tmp_path / "two", "--epochs", "1", "lr=1e-12", "min_lr=1e-13",
                                f"finetune={tmp_path / 'three' / 'last.pth'}")) == 0  # a step too small to move
    assert f"was trained on other classes than this data set's 2: {replaced}" in capsys.readouterr().out
    three = torch.load(tmp_path / "three" / "last.pth", weights_only=True)["model"]
    two = torch.load(tmp_path / "two" / "last.pth", weights_only=True)["model"]
    assert two["head.weight"].shape[0] == 2 and three["head.weight"].shape[0] == 3
    body = [key for key in three if not key.startswith("head.")]
    assert all(torch.allclose(two[key], three[key], atol=1e-6) for key in body)  # the body came from the checkpoint


def test_train_fraction_trains_on_the_same_class_balanced_subset_whatever_the_seed(image_root: Path,
                                                                                   tmp_path: Path) -> None:
    samples, _ = folders.find_images(image_root / "train")  # 8 images per class
    third = folders.balanced_subset(samples, 1 / 3, seed=0)
    assert [sum(target == c for _, target in third) for c in range(3)] == [3, 3, 3]  # round(8 / 3) each
    assert third == folders.balanced_subset(samples, 1 / 3, seed=0) != folders.balanced_subset(samples, 1 / 3, seed=1)
    assert third == sorted(third, key=samples.index)  # in the split's order
    for seed in (0, 1):  # the run's seed does not change the subset; train_subset_seed does
        out = tmp_path / f"run{seed}"
        assert train.main(tiny_args(image_root, out, "--epochs", "1", "--batch-size", "4", f"seed={seed}",
                                    "train_fraction=0.34")) == 0
        listed = (out / "train_subset.txt").read_text().split()
        assert listed == [Path(path).relative_to(image_root).as_posix() for path, _ in third]
        assert metrics(out)[0]["sizes"] == "32:2"  # 9 images in steps of 4
