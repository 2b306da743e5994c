"""The GPU check's fork server (scripts/gpucheck/prestarted.py): a command's exit code and output come back as a new
interpreter's would, and a command past its time is killed with everything it started, the server serving on (and
exiting with 0 when its stdin closes: conftest.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from gpucheck import prestarted

from helpers.ddp import fork_server


def _gone(pid: int) -> bool:
    """No such process, or one that has exited and waits only to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="fork and /proc")
def test_exit_codes_output_and_timeout_kill_the_commands_process_group(tmp_path):
    server = fork_server()  # as the GPU check starts it, with the tests' path: this process's (helpers.ddp)
    fails, sleeps = tmp_path / "fails.py", tmp_path / "sleeps.py"
    fails.write_text("import sys\nprint('to stdout')\nprint(sys.argv[1:], file=sys.stderr)\nsys.exit(3)\n")
    sleeps.write_text("import subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\n"
                      f"open({str(tmp_path / 'pid')!r}, 'w').write(str(child.pid))\ntime.sleep(60)\n")
    log = tmp_path / "log.txt"
    with log.open("w") as out:
        assert prestarted.execute(server, ["python", str(fails), "--flag"], out, 60) == 3
        assert log.read_text().splitlines() == ["to stdout", "['--flag']"]
        started = time.monotonic()
        assert prestarted.execute(server, ["python", str(sleeps)], out, 1) is None
        assert time.monotonic() - started < 30
        grandchild = int((tmp_path / "pid").read_text())
        deadline = time.monotonic() + 10
        while not _gone(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(grandchild), "the timed-out command's own child outlived it"
        assert prestarted.execute(server, ["python", str(fails)], out, 60) == 3  # the server still serves
