"""Shared fixtures: for the training-side tests a tiny generated ImageFolder; for the benchmarks' smoke tests a run of a
benchmark's ``main`` that returns the JSON it wrote. The helpers the tests share are in helpers/."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# One thread: the test models are so small that thread hand-offs cost more than they save, and both the DDP test and
# make test (two pytest-xdist workers) run two processes on the two cores of the CI machine. The processes the tests
# start (torchrun, the GPU check's steps on the CPU, timm's test suite) inherit it: with torch's default of a thread
# per core, each one's threads wait spinning on the cores the other worker runs on.
os.environ["OMP_NUM_THREADS"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    """torch in the processes that run tests; not in pytest-xdist's controller, which only hands them out (importing
    torch, timm and vit_rope there would hold back the start of every worker by seconds)."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return
    import torch

    import vit_rope  # noqa: F401  (registers the vit_rope_* models)

    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: ``pytest -m cuda`` must see the marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cuda`` every test parametrised with the device ``"cuda"`` (as well as those marked by hand), so that
    ``pytest -m cuda`` selects all the GPU checks on a GPU machine, and skip them where PyTorch sees no GPU."""
    import torch

    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        params = getattr(item, "callspec", None)
        if params is not None and any(isinstance(value, str) and value == "cuda" for value in params.params.values()):
            item.add_marker(pytest.mark.cuda)
        if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def fork_server_exits_with_0() -> Iterator[None]:
    """The fork server that this process's DDP ranks and GPU-check runs shared (helpers.ddp), if one ran, exits with
    0 when its stdin closes at the end."""
    yield
    if "helpers.ddp" in sys.modules:
        assert sys.modules["helpers.ddp"].close_fork_server() in (None, 0)


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """A fresh tiny ImageFolder (train/ and val/) that a test may modify."""
    from helpers.training import write_image_folder

    return write_image_folder(tmp_path / "data")


@pytest.fixture
def run_benchmark(tmp_path: Path) -> Callable[[Callable[[list[str]], int], list[str]], dict[str, Any]]:
    """``run(main, argv)``: a benchmark script's ``main`` with ``argv`` and ``--json`` into a temporary file, checked
    to succeed and to mark its result complete (written after its last setting); the result."""
    def run(main: Callable[[list[str]], int], argv: list[str]) -> dict[str, Any]:
        out = tmp_path / "benchmark.json"
        assert main([*argv, "--json", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["complete"]
        return result

    return run
