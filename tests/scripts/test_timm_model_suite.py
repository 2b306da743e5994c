"""``scripts/timm_model_suite.py`` on a stand-in for timm's source release (no download): it unpacks the release's
tests once and runs its ``test_models.py`` with the vit_rope models registered, selecting the vit_rope tests only."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from xml.etree import ElementTree

import timm
import timm_model_suite

STAND_IN = '''
import timm
def test_vit_rope_models_are_registered_before_collection():
    assert "vit_rope_tiny_patch16_mixed_224" in timm.list_models("vit_rope_*")
def test_vit_rope_matched_failure_is_the_exit_status():
    raise AssertionError("selected by --match: pytest's exit status is the script's")
def test_vit_rope_other(): pass  # left out by --match
def test_vit_rope_pretrained_matched(): pass  # left out: a hub test
def test_resnet_matched(): pass  # left out: not a vit_rope test
'''


def write_release(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / f"timm-{timm.__version__}.tar.gz", "w:gz") as tar:
        data = STAND_IN.encode()
        info = tarfile.TarInfo(f"timm-{timm.__version__}/tests/test_models.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_the_release_is_unpacked_once_and_its_vit_rope_tests_run(tmp_path: Path, monkeypatch) -> None:
    """From the default ``--out``'s kind of folder, a relative one (``output/timm-suite``): pytest runs from the
    release's folder. One run (a new interpreter): what ran is read from the JUnit report asked for after ``--``."""
    write_release(tmp_path / "output")
    monkeypatch.chdir(tmp_path)
    tests = timm_model_suite.timm_tests(Path("output"))
    assert (tests / "test_models.py").read_text() == STAND_IN
    assert timm_model_suite.main(["--out", "output", "--match", "registered or matched", "--", "--junitxml",
                                  "report.xml"]) == 1  # pytest's: a test failed; the report in the release's folder
    report = ElementTree.parse(tests.parent / "report.xml")
    ran = {case.get("name"): case.find("failure") is None for case in report.iter("testcase")}
    assert ran == {"test_vit_rope_models_are_registered_before_collection": True,
                   "test_vit_rope_matched_failure_is_the_exit_status": False}
