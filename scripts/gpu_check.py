"""``make gpu-check`` / ``make gpu-bench``: the GPU claims verified in one command of at most 8 minutes on one H100.

    python scripts/gpu_check.py --suite check --data-dir /tmp/imagenette-160 --output output/gpu-check
    python scripts/gpu_check.py --suite bench --data-dir /tmp/imagenette-160 --output output/gpu-bench
    python scripts/gpu_check.py --suite check --device cpu --data-dir DIR --output OUT   # every step, tiny sizes

Each step (``gpucheck.steps``) runs the project's own commands in subprocesses with the step's time limit, its output
in OUTPUT/logs/<step>.log; a step that fails or runs out of time is marked FAIL and the next one runs. The summary
(PASS / MISS / FAIL per step and target, the GPU, driver and versions, minutes per step) comes last, also saved as
OUTPUT/summary.json and summary.md beside the steps' JSON files. Nothing is installed or downloaded: models are built
with random weights and the data is the folder given. Exit status: 0 every step ran (targets may MISS), 1 a step
failed, 2 refused before any step (one line: no GPU, no bf16, old timm, no data).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]  # the checkout runs as it is: no install step
from gpucheck import preflight, prestarted  # noqa: E402  (torch only; vit_rope after the timm check)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The steps' environment: the checkout and scripts/ first on the path, output unbuffered for the logs."""
    path = os.pathsep.join([str(REPO), str(REPO / "scripts"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def execute(command: list[str], log: Any, seconds: float) -> int | None:
    """Run ``command`` in its own process group with its output in ``log``; the exit code, or None when it ran out
    of time (then the whole group is killed: torchrun's workers and loader processes with it)."""
    process = subprocess.Popen(command, cwd=REPO, env=child_env({}), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        return process.wait(timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def run_step(step: Any, run: Any, server: subprocess.Popen | None = None) -> dict[str, Any]:
    """One step's commands in turn until one fails, then its judgement of what they wrote; through ``server``
    (``gpucheck.prestarted``) where there is one."""
    log_path = run.out / "logs" / f"{step.name}.log"
    start = time.monotonic()
    status, detail = "PASS", ""
    print(f"== {step.name} (at most {step.seconds} s): {step.what}", flush=True)
    with log_path.open("w") as log:
        for command in step.commands(run):
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            seconds = start + step.seconds - time.monotonic()
            code = prestarted.execute(server, command, log, seconds) if server else execute(command, log, seconds)
            if code != 0:
                status = "FAIL"
                detail = f"over its {step.seconds} s limit" if code is None else f"exit {code}: {last_line(log_path)}"
                break
    targets: list[dict[str, Any]] = []
    try:
        targets = step.judge(run)
    except (OSError, KeyError, ValueError, IndexError, TypeError, ZeroDivisionError) as err:
        if status == "PASS":
            status, detail = "FAIL", f"nothing to judge ({type(err).__name__}: {err})"
    if status == "PASS":
        detail = last_line(log_path)
        if any(t["pass"] is False for t in targets):
            status = "MISS"
    minutes = (time.monotonic() - start) / 60
    print(f"   {status} in {minutes:.2f} min {detail}", flush=True)
    return {"name": step.name, "what": step.what, "status": status, "minutes": minutes, "limit_s": step.seconds,
            "detail": detail, "log": str(log_path.relative_to(run.out)), "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("check", "bench"), default="check")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: every step at tiny sizes")
    parser.add_argument("--data-dir", help="Imagenette with train/ and val/ (or the folder the 160 px tarball "
                        "unpacked into)")
    parser.add_argument("--output", default=None, help="results folder (default output/gpu-<suite>)")
    parser.add_argument("--steps", nargs="+", metavar="NAME", help="only these steps of the suite")
    args = parser.parse_args(argv)
    name = f"gpu-{args.suite}"
    try:
        preflight.check_device(args.device, preflight.find_gpu())
        preflight.check_timm()
        data = preflight.find_data(args.data_dir)
    except preflight.Refused as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    from gpucheck import steps, summary  # imports vit_rope: after the timm check

    chosen = [step for step in steps.SUITES[args.suite] if not args.steps or step.name in args.steps]
    if args.steps and len(chosen) != len(args.steps):
        known = ", ".join(step.name for step in steps.SUITES[args.suite])
        print(f"{name}: --steps {' '.join(args.steps)}: the {args.suite} suite's steps are {known}", file=sys.stderr)
        return 2
    out = Path(args.output or f"output/{name}").resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    run = steps.Run(python=sys.executable, device=args.device, data=data.resolve(), out=out)
    start = time.monotonic()
    # tiny: imports once, not per command; torch.compile only traced (read when torch is imported: the server's)
    server = prestarted.start(child_env(steps.TRACE_ONLY), REPO) if run.tiny else None
    try:
        done = [run_step(step, run, server) for step in chosen]
    finally:
        if server:
            server.stdin.close()
            server.wait()
    result = {"suite": args.suite, "device": args.device, "machine": summary.machine(),
              "minutes": (time.monotonic() - start) / 60, "steps": done}
    summary.save(result, out)
    print("\n" + summary.render(result))
    print(f"\n{out / 'summary.json'}")
    return 1 if any(step["status"] == "FAIL" for step in done) else 0


if __name__ == "__main__":
    sys.exit(main())
