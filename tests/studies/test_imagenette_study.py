"""``scripts/imagenette_study.py``: runs seed by seed over the arms, evaluates each run as soon as it is done,
resumes, and rebuilds the report from the files. Training and evaluation are replaced by stand-ins that write what
they would."""

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from helpers.training import zero_inits
from studies.course import COURSE_END, course_begin
from studies.report import STUDY_END, study_begin
from vit_rope.eval.harness import protocol
from vit_rope.train.command_line import build_config
from vit_rope.train.config import save_config

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "imagenette_study.py"


@pytest.fixture
def script(monkeypatch):
    """The script as a module, with ``run`` recording commands and writing the files a real run leaves. The models it
    builds to read their policies (``evaluation_policies``) get zeros for their random inits: their structure is what
    is read, and drawing ViT-S weights for every arm was most of these tests' time."""
    zero_inits(monkeypatch)
    spec = importlib.util.spec_from_file_location("imagenette_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.calls = []

    def run(command: list[str]) -> float:
        module.calls.append(command)
        value = dict(zip(command, command[1:], strict=False))
        if command[1] == "train.py":
            out, cfg = Path(value["--output"]), build_config(value["-c"], [command[-1]])
            out.mkdir(parents=True, exist_ok=True)
            k = cfg.keep_every
            for name in ["last.pth", *(f"epoch_{e}.pth" for e in (range(k, cfg.epochs + 1, k) if k else ()))]:
                (out / name).write_bytes(b"")
            save_config(cfg, out / "config.yaml")
            if cfg.train_fraction < 1:
                (out / "train_subset.txt").write_text("train/a/1.jpg\n")
            with open(out / "metrics.csv", "w", newline="") as f:
                csv.writer(f).writerows([["epoch", "top1", "seconds"], [cfg.epochs, 45.0, 30.0]])
        else:  # vit_rope.evaluate: a RoPE model holds 50 at every size, APE falls by 5 per size step
            checkpoints = command[command.index("--checkpoint") + 1:command.index("--img-sizes")]
            after = command[command.index("--img-sizes") + 1:]
            sizes = [int(size) for size in after[:next(i for i, arg in enumerate(after) if arg.startswith("--"))]]
            given = after[after.index("--policy") + 1:] if "--policy" in after else ["extrapolate"]
            policies = given[:next((i for i, arg in enumerate(given) if arg.startswith("--")), len(given))]
            rows = [{"model": f"m ({path})", "policy": None if "ape" in path else policy, "img_size": size,
                     "train_size": sizes[1], "top1": (50.0 - 5 * i if "ape" in path else 50.0) + seed / 10,
                     "top5": 90.0}
                    for path in checkpoints for seed in [int(path.rsplit("_s", 1)[1].split("/")[0])]
                    for policy in (policies[:1] if "ape" in path else policies) for i, size in enumerate(sizes)]
            Path(value["--output"]).mkdir(parents=True, exist_ok=True)
            evaluation = {"protocol": protocol(float(value.get("--crop-pct", 1.0))), "results": rows}
            (Path(value["--output"]) / "results.json").write_text(json.dumps(evaluation))
        return 60.0

    monkeypatch.setattr(module, "run", run)
    drawn, module.plots = module.write_study, []  # each report's plots flag; what is drawn: test_study_goal's
    monkeypatch.setattr(module, "write_study", lambda *args: module.plots.append(args[-1]) or drawn(*args[:-1], False))
    monkeypatch.setattr(module, "finished", lambda path, epochs: path.exists())
    return module


def invoke(script, tmp_path: Path, *args: str) -> list[list[str]]:
    results = tmp_path / "results"
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(f"{study_begin(results)}\n{STUDY_END}\n")
    script.calls[:], script.plots[:] = [], []
    script.main(["--results", str(results), "--runs", str(tmp_path / "runs"), "--readme", str(readme), *args])
    return [command[1] if command[1] == "train.py" else command[-1].rsplit("/", 1)[1] for command in script.calls]


def test_runs_go_seed_by_seed_each_evaluated_when_done_then_resume(script, tmp_path):
    assert invoke(script, tmp_path, "--arms", "mixed", "ape") == ["train.py", "mixed_s0", "train.py", "ape_s0",
                                                                  "train.py", "mixed_s1", "train.py", "ape_s1"]
    runs = json.loads((tmp_path / "results" / "runs.json").read_text())
    assert [(run["name"], run["baseline"]) for run in runs] == [("mixed_s0", "ape"), ("ape_s0", None),
                                                                ("mixed_s1", "ape"), ("ape_s1", None)]
    readme = (tmp_path / "README.md").read_text()
    held = "| 50.05 ± 0.1 | 50.05 ± 0.1 (+0.0) | 50.05 ± 0.1 (+0.0) | +20.0 (apart) | +25.0 (apart) | yes |"
    assert f"| RoPE-Mixed {held}" in readme
    assert json.loads((tmp_path / "results" / "machine.json").read_text())["evaluate_s"] == dict.fromkeys(
        ["mixed_s0", "ape_s0", "mixed_s1", "ape_s1"], 60)
    assert "evaluation took 4 min" in readme
    assert script.plots == [False, False, False, True]  # drawn once, when the last run is reported
    commands = (tmp_path / "results" / "commands.sh").read_text().splitlines()
    assert len(commands) == 9 and commands[1].endswith("--output " + str(tmp_path / "runs" / "mixed_s0") + " seed=0")
    assert commands[2].endswith("--output " + str(tmp_path / "results" / "eval" / "mixed" / "mixed_s0"))

    assert invoke(script, tmp_path, "--arms", "mixed", "ape") == []  # everything done: nothing runs again
    assert invoke(script, tmp_path, "--arms", "mixed", "--seeds", "0", "1", "2") == ["train.py", "mixed_s2"]
    runs = json.loads((tmp_path / "results" / "runs.json").read_text())
    assert [run["name"] for run in runs] == ["mixed_s0", "ape_s0", "mixed_s1", "ape_s1", "mixed_s2"]
    assert len((tmp_path / "results" / "commands.sh").read_text().splitlines()) == 11
    (tmp_path / "results" / "eval" / "ape" / "ape_s1" / "results.json").unlink()  # one run's evaluation lost
    assert invoke(script, tmp_path, "--arms", "ape") == ["ape_s1"]
    lines = (tmp_path / "results" / "commands.sh").read_text().splitlines()
    assert len(lines) == 11 and sum("/ape_s1" in line for line in lines) == 2  # replaced, not repeated


def test_swin_scales_the_windows_where_the_policies_act_and_keeps_them_as_trained_beside(script, tmp_path):
    assert invoke(script, tmp_path, "--study", "swin", "--seeds", "0") == ["train.py", "mixed_s0", "mixed_s0",
                                                                           "train.py", "axial_s0", "axial_s0",
                                                                           "train.py", "rpb_s0", "rpb_s0"]
    main, kept = (call for call in script.calls if call[1] != "train.py" and "/mixed_s0" in call[-1])
    assert main[main.index("--window-size") + 1] == "scale" and "--policy" in main and "--pad-windows" not in main
    assert main[-1].endswith("/eval/mixed/mixed_s0")
    assert kept[kept.index("--window-size") + 1] == "keep" and "--pad-windows" in kept and "--policy" not in kept
    assert kept[-1].endswith("/eval_windows_keep/mixed/mixed_s0")
    page = (tmp_path / "README.md").read_text()
    assert "**Windows `--window-size keep`**" in page and "the relative-position-bias Swin model of the same" in page


def test_v3_runs_its_controls_seed_by_seed_before_the_remedy_and_evaluates_each_at_two_crops_and_over_the_course(
        script, tmp_path):
    results = tmp_path / "results"
    (tmp_path / "README.md").write_text(f"{study_begin(results)}\n{STUDY_END}\n{course_begin(results)}\n{COURSE_END}\n")
    invoke(script, tmp_path, "--study", "v3")
    trained = [Path(call[call.index("--output") + 1]).name for call in script.calls if call[1] == "train.py"]
    assert trained == ["mixed_s0", "ape_s0", "axial_s0", "mixed_s1", "ape_s1", "axial_s1", "mixed_coord_sizes_s0",
                       "mixed_coord_sizes_s1"]
    evaluations = [call for call in script.calls if call[1] != "train.py"]
    assert len(evaluations) == 24 and all(call.count("--checkpoint") == 1 for call in evaluations)
    assert {"--crop-pct" in call for call in evaluations[:2]} == {True, False}
    course = evaluations[2]  # v3 keeps epochs 10 and 20 (30 is last.pth): both, positions as trained, crop 1.0
    checkpoints = course[course.index("--checkpoint") + 1:course.index("--img-sizes")]
    assert checkpoints == [str(tmp_path / "runs" / "mixed_s0" / f"epoch_{e}.pth") for e in (10, 20)]
    assert "--policy" not in course and "--crop-pct" not in course
    assert (results / "eval_crop0.875" / "mixed" / "mixed_s1" / "results.json").exists()
    assert (results / "course" / "axial" / "axial_s1" / "results.json").exists()
    page = (tmp_path / "README.md").read_text()
    assert "8 training runs (4 models x 2 seeds)" in page and "**At crop 0.875**" in page
    assert "| RoPE-Mixed | 20 | 2 | 50.05 ± 0.1 | **50.05 ± 0.1** |" in page  # the course table, between its markers
    assert page.index("| APE | 30 | 2 |") < page.index(COURSE_END)
    for path in (tmp_path / "runs").rglob("epoch_*.pth"):  # kept checkpoints cleaned up once evaluated
        path.unlink()
    assert invoke(script, tmp_path, "--study", "v3") == []  # the kept checkpoints' evaluations are not repeated
    commands = (results / "commands.sh").read_text()  # and their command stays, named from the run's config
    assert f"--checkpoint {tmp_path / 'runs' / 'axial_s1' / 'epoch_10.pth'} " in commands


def test_v4_reads_dinov3_under_its_own_policies_and_skip_kept_leaves_the_kept_checkpoints(script, tmp_path):
    invoke(script, tmp_path, "--study", "v4", "--arms", "dinov3", "ape_sizes", "--seeds", "0", "--skip-kept")
    evaluations = [call for call in script.calls if call[1] != "train.py"]
    assert len(evaluations) == 4  # final checkpoint at crop 1.0 and 0.875 for each arm, no kept epoch
    assert all(not any("epoch_" in arg for arg in call) for call in evaluations)
    dinov3 = [call for call in evaluations if "dinov3_s0" in call[-1]]
    every, crop = (call[call.index("--policy") + 1:call.index("--limit")] for call in dinov3)
    assert every == ["normalized", "extrapolate"]  # the policies DINOv3's RoPE takes, not interpolate / ntk / yarn
    assert crop[:2] == ["normalized", "--crop-pct"]  # positions as trained: normalised coordinates
    runs = json.loads((tmp_path / "results" / "runs.json").read_text())
    assert [run.get("as_trained") for run in runs] == ["normalized", None]
    page = (tmp_path / "README.md").read_text()  # the goal names v3's APE, read from its committed results
    assert page.count("| minus APE of the same recipe at 256 | minus v3's APE at 256 | goal met |") == 2  # two crops
    invoke(script, tmp_path, "--study", "v4", "--arms", "mixed_third", "--seeds", "0", "--skip-kept")
    kept = tmp_path / "results" / "runs"  # stage 2's subset of the train images is committed with its run
    assert (kept / "mixed_third_s0" / "train_subset.txt").read_text() == "train/a/1.jpg\n"
    assert not (kept / "ape_sizes_s0" / "train_subset.txt").exists()


def test_encodings_study_evaluates_each_kind_under_the_policies_it_takes(script, tmp_path):
    """Biases take extrapolate and interpolate only, STRING its base kind's (all), APE and no encoding run once; every
    arm at two crops."""
    invoke(script, tmp_path, "--study", "encodings", "--arms", "lookhere", "string_mixed", "ape_p8", "nope", "--seeds",
           "0")
    evaluations = [call for call in script.calls if call[1] != "train.py" and "--crop-pct" not in call]
    policies = {call[-1].rsplit("/", 1)[1]: call[call.index("--policy") + 1:call.index("--limit")]
                for call in evaluations}
    assert policies == {"lookhere_s0": ["extrapolate", "interpolate"],
                        "string_mixed_s0": ["extrapolate", "interpolate", "ntk", "yarn", "normalized"],
                        "ape_p8_s0": ["extrapolate", "interpolate", "ntk", "yarn", "normalized"],
                        "nope_s0": ["extrapolate", "interpolate", "ntk", "yarn", "normalized"]}
    assert sum("--crop-pct" in call for call in script.calls) == 4


def test_report_before_any_run_or_without_a_docs_section_is_an_error_line(script, tmp_path, capsys):
    assert script.main(["--study", "v3", "--report", "--results", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'none'} holds no finished run of study v3 yet (no "
                                       "runs.json): run `python scripts/imagenette_study.py --study v3` first\n")
    invoke(script, tmp_path, "--arms", "ape", "--seeds", "0")
    (tmp_path / "README.md").write_text("no markers\n")
    capsys.readouterr()
    assert script.main(["--report", "--results", str(tmp_path / "results"), "--readme", str(tmp_path / "README.md")]) \
        == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "has no study section to update" in err and err.count("\n") == 1


def test_unknown_arm_is_named(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        invoke(script, tmp_path, "--arms", "mixed_p16")
    assert exit_info.value.code == 2
    assert "no arm mixed_p16; its arms are mixed, ape" in capsys.readouterr().err


def test_arms_resumed_on_another_machine_are_recorded_and_reported_with_it(script, tmp_path, monkeypatch):
    def host(cpu: str) -> dict:
        return {"cpu": cpu, "cores": 2, "gpu": None, "python": "3", "torch": "2", "timm": "1", "date": "today"}

    monkeypatch.setattr(script, "describe_machine", lambda: host("first cpu"))
    invoke(script, tmp_path, "--arms", "ape", "mixed")
    monkeypatch.setattr(script, "describe_machine", lambda: host("second cpu"))
    invoke(script, tmp_path, "--arms", "ape", "mixed", "axial")  # ape and mixed are done: only axial runs here
    recorded = json.loads((tmp_path / "results" / "machine.json").read_text())
    assert recorded["cpu"] == "first cpu"
    assert recorded["machines"] == {"axial_s0": host("second cpu"), "axial_s1": host("second cpu")}
    assert set(recorded["evaluate_s"]) == {f"{arm}_s{seed}" for arm in ("ape", "mixed", "axial") for seed in (0, 1)}
    line = next(line for line in (tmp_path / "README.md").read_text().splitlines() if "training runs" in line)
    assert "on first cpu (2 cores), torch 2, timm 1, today; RoPE-Axial on second cpu (2 cores)" in line

    invoke(script, tmp_path, "--arms", "mixed", "--seeds", "2")  # one seed of an arm elsewhere: named with its seed
    page = (tmp_path / "README.md").read_text()
    assert "; RoPE-Axial, RoPE-Mixed (seed 2) on second cpu (2 cores)" in page
    assert "| RoPE-Mixed | 3 | 45.00 ± 0.0 | 0.5 / 0.5 / 0.5 (2 machines) |" in page  # minutes per seed, not a mean
    assert "| RoPE-Axial | 2 | 45.00 ± 0.0 | 0.5 |" in page  # both seeds on the second machine

    monkeypatch.setattr(script, "describe_machine", lambda: host("first cpu"))
    shutil.rmtree(tmp_path / "runs" / "mixed_s2")  # mixed seed 2 trains again, on the first machine
    invoke(script, tmp_path, "--arms", "mixed", "--seeds", "2")
    assert set(json.loads((tmp_path / "results" / "machine.json").read_text())["machines"]) == {"axial_s0", "axial_s1"}
    shutil.rmtree(tmp_path / "runs")
    invoke(script, tmp_path, "--arms", "axial")  # and so does every run of axial
    assert "machines" not in json.loads((tmp_path / "results" / "machine.json").read_text())


def test_relative_paths_are_the_callers_not_the_repositorys(script, tmp_path, monkeypatch):
    """The script works from the repository's root (its configs), but --results, --runs, --readme and --data-dir
    name places relative to where it was started."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "page.md").write_text(f"{study_begin(tmp_path / 'out')}\n{STUDY_END}\n")
    (tmp_path / "data").mkdir()
    assert script.main(["--study", "v3", "--arms", "ape", "--seeds", "0", "--results", "out", "--runs", "runs",
                        "--readme", "page.md", "--data-dir", "data"]) == 0
    assert (tmp_path / "out" / "runs.json").exists() and (tmp_path / "runs" / "ape_s0" / "last.pth").exists()
    assert "| APE |" in (tmp_path / "page.md").read_text()
    train = next(command for command in script.calls if command[1] == "train.py")
    assert train[train.index("--data-dir") + 1] == str(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert script.main(["--study", "v3", "--report", "--results", "out", "--readme", "page.md"]) == 0


STUDY_NAMES = ["v1", "v2", "v3", "v4", "encodings", "vit_s", "swin"]


@pytest.mark.parametrize("study", STUDY_NAMES)
def test_every_arm_of_every_study_has_a_config_that_validates_and_builds(script, study):
    assert set(script.STUDIES) == set(STUDY_NAMES), "a study is missing from this test"
    configs, _, _, arms = script.STUDIES[study]
    assert set(arms) <= {path.stem for path in (SCRIPT.parents[1] / configs).glob("*.yaml")}, "an arm has no config"
    for arm, (_, baseline) in arms.items():
        assert baseline is None or baseline in arms
        # loads, validates and builds the model; its positions as trained are among the policies it is evaluated under
        policies, trained = script.evaluation_policies(str(SCRIPT.parents[1] / configs / f"{arm}.yaml"))
        assert trained in policies and set(policies) <= set(script.POLICIES)
