"""``scripts/gpu_tools.py`` and ``benchmarks/tune_rope_kernel.py``, the Python that scripts/gpu_session.sh runs on
the lent GPU machine, checked here on the CPU: a wrong epoch count or a broken check would cost a device call."""

from __future__ import annotations

import importlib.util
import json
import re
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from vit_rope import triton_rope

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "imagenette_vit_s" / "mixed.yaml"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tools() -> ModuleType:
    return load(REPO / "scripts" / "gpu_tools.py")


def test_projection_counts_the_first_epoch_once_and_later_ones_at_the_last_epochs_time(tools, tmp_path):
    assert tools.projected_seconds([50.0, 6.0, 5.0], 10) == 50 + 9 * 5
    assert tools.projected_seconds([40.0], 10) == 400  # one epoch: its compile time counted every epoch
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("epoch,train_loss,images_per_s,seconds\n1,2.3,1000,50.0\n2,2.1,4000,5.0\n")
    epochs = tools.config_epochs(CONFIG)
    line = tools.projection(metrics, CONFIG)
    assert f"{epochs} epochs = first epoch 50.0s" in line and f"{epochs - 1} x 5.0s" in line
    assert f"= {(50 + (epochs - 1) * 5) / 60:.1f} min of epochs" in line and "4000 images/s" in line
    assert "overestimate" not in line


def test_config_epochs_take_overrides(tools):
    assert tools.config_epochs(CONFIG, ["epochs=3", "seed=1"]) == 3


def test_annotate_adds_the_machine_and_the_command_keeping_the_benchmarks_keys(tools, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"machine": {"batch_size": 128}, "rows": [{"us": 1.0}]}))
    tools.annotate(path, "python benchmarks/rope_kernel.py --json results/performance/x.json")
    data = json.loads(path.read_text())
    assert data["rows"] == [{"us": 1.0}] and data["machine"]["batch_size"] == 128
    assert data["machine"]["command"] == "python benchmarks/rope_kernel.py --json results/performance/x.json"
    assert {"torch", "timm", "triton", "cuda", "gpu", "nvidia_smi", "cores"} <= set(data["machine"])


def test_checkpoint_epoch_reads_a_saved_dict_and_is_0_without_a_file(tools, tmp_path, capsys):
    path = tmp_path / "last.pth"
    assert tools.checkpoint_epoch(path) == 0
    torch.save({"epoch": 7, "model": {"w": torch.zeros(3)}}, path)
    assert tools.checkpoint_epoch(path) == 7
    assert tools.main(["ckpt-epoch", str(path)]) == 0 and capsys.readouterr().out == "7\n"


def test_run_json_turns_digits_into_ints_and_adds_the_machine(tools, tmp_path):
    path = tmp_path / "run.json"
    tools.main(["run-json", str(path), "run=mixed_s0", "epochs=60", "train_command=python train.py -c x.yaml seed=0"])
    data = json.loads(path.read_text())
    assert data["run"] == "mixed_s0" and data["epochs"] == 60
    assert data["train_command"] == "python train.py -c x.yaml seed=0" and "torch" in data["machine"]
    with pytest.raises(ValueError, match="key=value"):
        tools.parse_fields(["epochs"])


def test_pack_keeps_8_files_as_they_are_and_tars_the_rest_past_that(tools, tmp_path):
    for name in ("session.log", "env.txt", "machine.json", "perf/a.json", "perf/b.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    assert tools.pack(tmp_path) == []
    for index in range(4):
        (tmp_path / f"run/f{index}.csv").parent.mkdir(exist_ok=True)
        (tmp_path / f"run/f{index}.csv").write_text(str(index))
    packed = tools.pack(tmp_path)
    assert packed == ["perf/a.json", "perf/b.json"] + [f"run/f{index}.csv" for index in range(4)]
    left = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*"))
    assert left == ["env.txt", "files.tar.gz", "machine.json", "session.log"]
    with tarfile.open(tmp_path / "files.tar.gz") as tar:
        assert sorted(tar.getnames()) == packed
        assert tar.extractfile("run/f3.csv").read() == b"3"


@pytest.mark.skipif(not triton_rope.AVAILABLE, reason="triton is not installed")
def test_tune_sweep_matches_the_default_launch_through_the_interpreter(tmp_path, capsys, monkeypatch):
    """Every swept (BLOCK_T, num_warps) gives _launch's output on CPU, and a launch that differs is caught."""
    tune = load(REPO / "benchmarks" / "tune_rope_kernel.py")
    out = tmp_path / "tune.json"
    assert tune.main(["--device", "cpu", "--block-t", "4", "16", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    passes = {"infer_in_place", "train_forward", "backward", "backward_table_grad"}
    assert {row["pass"] for row in data["rows"]} == passes and len(data["rows"]) == 2 * (3 + 4)
    assert all(row["matches_default"] and row["us"] is None for row in data["rows"])
    assert data["machine"]["triton"] and "--device cpu" in data["machine"]["command"]

    launch = tune.launch

    def off_by_one(src, dst, *args):  # a config whose output differs from the default launch
        grads = launch(src, dst, *args)
        dst[0, 1, 0, 0, 0] += 1
        return grads

    monkeypatch.setattr(tune, "launch", off_by_one)
    capsys.readouterr()
    assert tune.main(["--device", "cpu", "--kinds", "axial"]) == 1
    assert capsys.readouterr().out.count("MISMATCH") == 2 * 3


def test_session_calls_only_subcommands_and_files_that_exist(tools):
    """A typo in a subcommand or a path of gpu_session.sh shows only on the GPU machine, one device call later."""
    session = (REPO / "scripts" / "gpu_session.sh").read_text()
    names = set(re.findall(r'(?:\$\{TOOLS\[@\]\}"|tools_logged|scripts/gpu_tools\.py) ([a-z][a-z-]+)', session))
    assert {"env", "machine", "pack", "annotate", "ckpt-epoch", "cfg-epochs", "projection", "run-json", "policies",
            "nccl"} <= names
    for name in names:
        with pytest.raises(SystemExit) as exit_:
            tools.main([name, "--help"])
        assert exit_.value.code == 0, name
    for path in set(re.findall(r"\b((?:benchmarks|scripts|tests|configs)/[\w/.]+\.(?:py|yaml))\b", session)):
        assert (REPO / path).is_file(), path
