"""The GPU check's fork server (``gpucheck.prestarted``), started once for the scripts' tests that run one: its start
(an interpreter importing torch, timm, vit_rope and train.py) was the largest fixed cost of each of their runs."""

from __future__ import annotations

import subprocess
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import gpu_check
import pytest
from gpucheck import prestarted, steps

from helpers.training import REPO


class Kept:
    """The shared server as one user sees it: it writes commands and reads replies, and its "close" (of stdin, which
    ends the server) leaves the server serving the next user."""

    def __init__(self, server: subprocess.Popen) -> None:
        self.stdout = server.stdout
        self.stdin = types.SimpleNamespace(write=server.stdin.write, flush=server.stdin.flush, close=lambda: None)

    def wait(self) -> int:
        return 0


@pytest.fixture(scope="session")
def fork_server() -> Iterator[Callable[[dict[str, str], Path], Kept]]:
    """``start(env, cwd)``, called as ``gpu_check.main`` calls ``prestarted.start`` (asserted, and the same each time):
    the one server, started on the first call; at the end its stdin is closed and it must exit with 0."""
    started, real_start = {}, prestarted.start

    def start(env: dict[str, str], cwd: Path) -> Kept:
        assert env == gpu_check.child_env(steps.TRACE_ONLY) and cwd == REPO
        env = {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}  # pytest's, per test
        if "server" not in started:
            started["server"], started["env"] = real_start(env, cwd), env
        assert env == started["env"], "a test asks for a server in another environment than the one started"
        return Kept(started["server"])

    yield start
    if "server" in started:
        started["server"].stdin.close()
        assert started["server"].wait(timeout=60) == 0
