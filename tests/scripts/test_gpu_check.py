"""``make gpu-check`` / ``make gpu-bench`` (scripts/gpu_check.py) on a CPU: every step of both suites at tiny sizes, so
that a typo in a step cannot cost GPU time, and each refusal as one line naming the problem and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import gpu_check
import pytest
from gpucheck import preflight, prestarted, steps
from PIL import Image

from helpers.ddp import fork_server
from helpers.training import REPO, write_image_folder
from vit_rope._requires import TIMM_MIN


@pytest.fixture(scope="module")
def tarball_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as the 160 px tarball unpacks: ``DIR/imagenette-160/{train,val}/<class>/*.webp``."""
    root = tmp_path_factory.mktemp("unpacked")
    for path in list(write_image_folder(root / "imagenette-160").rglob("*.*")):
        Image.open(path).convert("RGB").save(path.with_suffix(".webp"))
        path.unlink()
    return root


def shared_start(env: dict[str, str], cwd: Path) -> types.SimpleNamespace:
    """``prestarted.start`` for both suites' runs: this process's fork server (helpers.ddp: an interpreter importing
    torch, timm, vit_rope and train.py, the largest fixed cost of a run), asked for in the environment and folder that
    main gives (asserted); closing its stdin a no-op (conftest.py closes it at the end, where it must exit with 0)."""
    assert env == gpu_check.child_env(steps.TRACE_ONLY) and cwd == REPO
    server = fork_server()
    return types.SimpleNamespace(stdout=server.stdout, wait=lambda: 0, stdin=types.SimpleNamespace(
        write=server.stdin.write, flush=server.stdin.flush, close=lambda: None))


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["check", "bench"])
def test_every_step_runs_at_tiny_sizes_on_the_cpu_and_the_summary_comes_last(tarball_folder, tmp_path, capsys,
                                                                             monkeypatch, suite):
    monkeypatch.setattr(prestarted, "start", shared_start)  # one server for both suites, as main starts its own
    out = tmp_path / "out"
    assert gpu_check.main(["--suite", suite, "--device", "cpu", "--data-dir", str(tarball_folder),
                           "--output", str(out)]) == 0
    result = json.loads((out / "summary.json").read_text())
    assert [step["name"] for step in result["steps"]] == [step.name for step in steps.SUITES[suite]]
    for step in result["steps"]:  # ran and was judged: targets may miss on a CPU, nothing may fail
        assert step["status"] in ("PASS", "MISS"), (step["name"], step["detail"])
        assert (out / step["log"]).stat().st_size > 0
    assert {"gpu", "driver", "torch", "triton", "timm"} <= set(result["machine"])
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(str(out / "summary.json"))
    assert printed.index("| step | result |") > printed.rindex("== ")  # the table after the last step's lines
    if suite == "check":  # the .webp images were read, the loss fell, every size x policy was evaluated
        targets = {t["target"]: t for step in result["steps"] for t in step["targets"]}
        assert targets["evaluations run (5 sizes x 5 policies)"]["value"] == 25
        assert all(t["pass"] is not False for name, t in targets.items() if not name.startswith("axial")
                   and not name.startswith("mixed"))


def refusal(capsys, argv: list[str]) -> str:
    assert gpu_check.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpu-check: ")
    return err


@pytest.mark.parametrize(("gpu", "named"), [(None, ("no CUDA GPU", "DEVICE=cpu")),  # unless the CPU is asked for
                                            (preflight.Gpu("Tesla V100-SXM2-16GB", (7, 0), False),
                                             ("Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16", "8.0"))])
def test_no_gpu_or_one_without_bf16_is_one_line_with_the_fix(monkeypatch, capsys, tarball_folder, gpu, named):
    monkeypatch.setattr(preflight, "find_gpu", lambda: gpu)
    err = refusal(capsys, ["--data-dir", str(tarball_folder)])
    assert all(part in err for part in named), err


@pytest.mark.parametrize("case", ["none", "missing", "file", "no_splits"])
def test_a_missing_or_wrong_data_folder_is_named_with_the_fix(capsys, tmp_path, case):
    folder = {"none": None, "missing": tmp_path / "nowhere", "file": tmp_path / "imagenette-160.tar.gz",
              "no_splits": tmp_path}[case]
    (tmp_path / "imagenette-160.tar.gz").write_bytes(b"")
    err = refusal(capsys, ["--device", "cpu", *(["--data-dir", str(folder)] if folder else [])])
    assert "tar -xzf imagenette-160.tar.gz" in err
    expected = {"none": "no data folder: pass DATA_DIR=DIR", "missing": f"DATA_DIR={folder} does not exist",
                "file": f"DATA_DIR={folder} is a file", "no_splits": f"DATA_DIR={folder} has no train/ and val/"}
    assert expected[case] in err


def test_the_unpacked_folder_or_the_one_it_holds_are_both_taken(tarball_folder):
    inner = tarball_folder / "imagenette-160"
    assert preflight.find_data(str(tarball_folder)) == preflight.find_data(str(inner)) == inner


def test_a_timm_older_than_the_floor_is_one_line_with_the_fix(tmp_path, tarball_folder):
    fake = tmp_path / "old" / "timm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "1.0.20"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu", "--data-dir",
                           str(tarball_folder)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    floor = ".".join(map(str, TIMM_MIN))
    assert f"needs timm >= {floor}, found timm 1.0.20" in done.stderr and "timm-*.whl" in done.stderr


def test_an_unknown_step_names_the_suites_steps(capsys, tarball_folder):
    err = refusal(capsys, ["--device", "cpu", "--data-dir", str(tarball_folder), "--steps", "trian"])
    assert "tests, parity, train, evaluate, rope_kernel" in err


@pytest.mark.parametrize("target", ["gpu-check", "gpu-bench", "bench-cuda", "study-vit-s"])
def test_gpu_targets_install_nothing_with_an_interpreter_named(target):
    def dry_run(*variables: str) -> str:
        return subprocess.run(["make", "-n", target, *variables], capture_output=True, text=True, cwd=REPO,
                              check=True).stdout

    assert "pip install" not in dry_run("PYTHON=python3", "DATA_DIR=/data")
    assert "pip install" in dry_run()  # the project's .venv: made and installed first, as make test does
    assert "pip install" in subprocess.run(["make", "-n", "test", "PYTHON=python3"], capture_output=True, text=True,
                                           cwd=REPO, check=True).stdout
