"""The GPU check's fork server (``gpucheck.prestarted``), started once for the scripts' tests that run one: its start
(an interpreter importing torch, timm, vit_rope and train.py) was the largest fixed cost of each of their runs."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from pathlib import Path

import gpu_check
import pytest
from gpucheck import prestarted, steps

from helpers.training import REPO


@pytest.fixture(scope="session")
def fork_server() -> Iterator[Callable[[dict[str, str], Path], types.SimpleNamespace]]:
    """``start(env, cwd)``, called as ``gpu_check.main`` calls ``prestarted.start`` (asserted, and the same each time):
    the one server, started on the first call, as each caller sees it: commands written and replies read, and its
    "close" of stdin (which ends the server) a no-op. At the end its stdin is closed and it must exit with 0."""
    started, real_start = {}, prestarted.start

    def start(env: dict[str, str], cwd: Path) -> types.SimpleNamespace:
        assert env == gpu_check.child_env(steps.TRACE_ONLY) and cwd == REPO
        env = {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}  # pytest's, per test
        if "server" not in started:
            started["server"], started["env"] = real_start(env, cwd), env
        assert env == started["env"], "a test asks for a server in another environment than the one started"
        server = started["server"]
        return types.SimpleNamespace(stdout=server.stdout, wait=lambda: 0, stdin=types.SimpleNamespace(
            write=server.stdin.write, flush=server.stdin.flush, close=lambda: None))

    yield start
    if "server" in started:
        started["server"].stdin.close()
        assert started["server"].wait(timeout=60) == 0
