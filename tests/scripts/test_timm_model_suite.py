"""``scripts/timm_model_suite.py`` on a stand-in for timm's source release (no download): it unpacks the release's
tests once and runs its ``test_models.py`` with the vit_rope models registered, selecting the vit_rope tests only."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import timm
import timm_model_suite

STAND_IN = '''
import timm

def test_vit_rope_models_are_registered_before_collection():
    assert "vit_rope_tiny_patch16_mixed_224" in timm.list_models("vit_rope_*")

def test_vit_rope_pretrained_is_left_out():
    raise AssertionError("the hub tests are deselected")

def test_resnet_is_left_out():
    raise AssertionError("only vit_rope tests run")
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
    release's folder."""
    write_release(tmp_path / "output")
    monkeypatch.chdir(tmp_path)
    tests = timm_model_suite.timm_tests(Path("output"))
    assert (tests / "test_models.py").read_text() == STAND_IN
    assert timm_model_suite.main(["--out", "output"]) == 0
    assert timm_model_suite.main(["--out", "output", "--match", "no_such_model"]) != 0  # nothing selected
