"""``scripts/imagenette_study.py``: runs each arm once, evaluates it as soon as its seeds are done, resumes, and
rebuilds the report from the files. Training and evaluation are replaced by stand-ins that write what they would."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from vit_rope.study import STUDY_END, study_begin

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "imagenette_study.py"


@pytest.fixture
def script(monkeypatch):
    """The script as a module, with ``run`` recording commands and writing the files a real run leaves."""
    spec = importlib.util.spec_from_file_location("imagenette_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.calls = []

    def run(command: list[str]) -> float:
        module.calls.append(command)
        value = dict(zip(command, command[1:], strict=False))
        if command[1] == "train.py":
            out = Path(value["--output"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "last.pth").write_bytes(b"")
            (out / "config.yaml").write_text(f"seed: {command[-1]}\n")
            with open(out / "metrics.csv", "w", newline="") as f:
                csv.writer(f).writerows([["epoch", "top1", "seconds"], [10, 45.0, 30.0]])
        else:  # vit_rope.evaluate: a RoPE model holds 50 at every size, APE falls by 5 per size step
            checkpoints = command[command.index("--checkpoint") + 1:command.index("--img-sizes")]
            sizes = [int(size) for size in command[command.index("--img-sizes") + 1:command.index("--policy")]]
            rows = [{"model": f"m ({path})", "policy": None if "ape" in path else "extrapolate", "img_size": size,
                     "train_size": 64, "top1": (50.0 - 5 * i if "ape" in path else 50.0) + n / 10, "top5": 90.0}
                    for n, path in enumerate(checkpoints) for i, size in enumerate(sizes)]
            Path(value["--output"]).mkdir(parents=True, exist_ok=True)
            (Path(value["--output"]) / "results.json").write_text(json.dumps({"protocol": "p", "results": rows}))
        return 60.0

    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr(module, "finished", lambda path, epochs: path.exists())
    return module


def invoke(script, tmp_path: Path, *args: str) -> list[list[str]]:
    results = tmp_path / "results"
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(f"{study_begin(results)}\n{STUDY_END}\n")
    script.calls.clear()
    script.main(["--results", str(results), "--runs", str(tmp_path / "runs"), "--readme", str(readme), *args])
    return [command[1] if command[1] == "train.py" else command[-1].rsplit("/", 1)[1] for command in script.calls]


def test_arms_train_then_evaluate_then_resume(script, tmp_path):
    assert invoke(script, tmp_path, "--arms", "mixed", "ape") == ["train.py", "train.py", "mixed",
                                                                  "train.py", "train.py", "ape"]
    runs = json.loads((tmp_path / "results" / "runs.json").read_text())
    assert [(run["name"], run["baseline"]) for run in runs] == [("mixed_s0", "ape"), ("mixed_s1", "ape"),
                                                                ("ape_s0", None), ("ape_s1", None)]
    readme = (tmp_path / "README.md").read_text()
    held = "| 50.05 ± 0.1 | 50.05 ± 0.1 (+0.0) | 50.05 ± 0.1 (+0.0) | +20.0 (apart) | +25.0 (apart) | yes |"
    assert f"| RoPE-Mixed {held}" in readme
    assert json.loads((tmp_path / "results" / "machine.json").read_text())["evaluate_s"] == {"mixed": 60, "ape": 60}
    commands = (tmp_path / "results" / "commands.sh").read_text().splitlines()
    assert len(commands) == 7 and commands[1].endswith("--output " + str(tmp_path / "runs" / "mixed_s0") + " seed=0")

    assert invoke(script, tmp_path, "--arms", "mixed", "ape") == []  # everything done: nothing runs again
    assert invoke(script, tmp_path, "--arms", "mixed", "--seeds", "0", "1", "2") == ["train.py", "mixed"]
    assert len(json.loads((tmp_path / "results" / "runs.json").read_text())) == 5
    assert len((tmp_path / "results" / "commands.sh").read_text().splitlines()) == 8  # mixed's lines replaced


def test_unknown_arm_is_named(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        invoke(script, tmp_path, "--arms", "mixed_p16")
    assert exit_info.value.code == 2
    assert "no arm mixed_p16; its arms are mixed, ape" in capsys.readouterr().err


def test_arms_resumed_on_another_machine_are_recorded_and_reported_with_it(script, tmp_path, monkeypatch):
    def host(cpu: str) -> dict:
        return {"cpu": cpu, "cores": 2, "gpu": None, "python": "3", "torch": "2", "timm": "1", "date": "today"}

    monkeypatch.setattr(script, "machine", lambda: host("first cpu"))
    invoke(script, tmp_path, "--arms", "ape", "mixed")
    monkeypatch.setattr(script, "machine", lambda: host("second cpu"))
    invoke(script, tmp_path, "--arms", "ape", "mixed", "axial")  # ape and mixed are done: only axial runs here
    recorded = json.loads((tmp_path / "results" / "machine.json").read_text())
    assert recorded["cpu"] == "first cpu" and recorded["machines"] == {"axial": host("second cpu")}
    assert set(recorded["evaluate_s"]) == {"ape", "mixed", "axial"}
    line = next(line for line in (tmp_path / "README.md").read_text().splitlines() if "training runs" in line)
    assert "on first cpu (2 cores), torch 2, timm 1, today; RoPE-Axial on second cpu (2 cores)" in line

    monkeypatch.setattr(script, "machine", lambda: host("first cpu"))
    invoke(script, tmp_path, "--arms", "axial", "--seeds", "0", "1", "2")  # axial runs again on the first machine
    assert "machines" not in json.loads((tmp_path / "results" / "machine.json").read_text())
