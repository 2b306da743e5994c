"""Commands forked from one Python that has imported torch, timm, vit_rope and train.py, in place of a new
interpreter per command: on a busy 2-core CPU the imports alone take 10-20 s, more than most tiny steps take to run.
``gpu_check`` starts it (``start``) for ``--device cpu`` with the environment of every command (torch.compile's
backend too, read when torch is imported) and runs each command through it (``execute``); a GPU run never uses it,
there each command is the new process it would be by hand. The tests' DDP ranks (tests/helpers/ddp.py) are forked
from it too.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO


def start(env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """The server, with the commands' environment (PYTHONPATH included) and working directory."""
    return subprocess.Popen([sys.executable, "-m", "gpucheck.prestarted"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)


def execute(server: subprocess.Popen, command: list[str], log: IO[str], seconds: float) -> int | None:
    """``command`` (``python -m MODULE ...`` or ``python SCRIPT ...``) run by a child of ``server`` with its output
    in ``log``; its exit code, or None when it ran past ``seconds`` (then its process group is killed)."""
    server.stdin.write(json.dumps([command[1:], log.name, max(seconds, 1)]) + "\n")
    server.stdin.flush()
    reply = server.stdout.readline()
    if not reply:
        raise RuntimeError(f"the fork server exited with {server.wait()} while running {' '.join(command)}")
    return json.loads(reply)


def run(args: list[str]) -> int:
    """``args`` as ``python ARGS`` runs them: ``sys.argv`` and ``sys.path[0]`` as it sets them, as ``__main__``."""
    module = args[1] if args[0] == "-m" else None
    sys.argv = [module, *args[2:]] if module else list(args)
    sys.path[0] = os.getcwd() if module else str(Path(args[0]).resolve().parent)
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as done:  # as the interpreter reads it: None is 0, an int itself, anything else printed and 1
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def child(args: list[str], log: str, replies: int) -> None:
    """In the forked child: a session of its own (so that a timeout kills what it starts too), stdin from /dev/null,
    stdout and stderr appended to ``log``; exits with the command's code after the exit handlers have run."""
    os.setsid()
    os.close(replies)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    code = run(args)
    atexit._run_exitfuncs()  # e.g. multiprocessing's, which stops the daemon workers the command started
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """One JSON line ``[args, log, seconds]`` per command on stdin; answers its exit code, or null when it ran past
    ``seconds`` and its process group was killed."""
    import timm  # noqa: F401  (what every command imports: the reason for this server)
    import torch  # noqa: F401

    import train  # noqa: F401
    import vit_rope  # noqa: F401

    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the protocol alone on the pipe
    answer = os.fdopen(replies, "w", buffering=1)
    for line in sys.stdin:
        args, log, seconds = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(args, log, replies)
        deadline = time.monotonic() + seconds
        while not (reaped := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        if not reaped[0]:  # not reaped yet: its group still there to kill, whatever happened since
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(json.dumps(os.waitstatus_to_exitcode(reaped[1]) if reaped[0] else None), file=answer)
    os._exit(0)  # stdin closed: nothing of its own to clean up, so no teardown of torch (seconds on a busy CPU)


if __name__ == "__main__":
    serve()
