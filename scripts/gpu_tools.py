"""The Python side of ``scripts/gpu_session.sh``: what a shell script cannot say well about the machine and its runs.

    python scripts/gpu_tools.py machine OUT.json                 # vit_rope.report.machine + triton, CUDA, nvidia-smi
    python scripts/gpu_tools.py env "COMMAND"                    # $OUT/env.txt: nvidia-smi, versions, machine
    python scripts/gpu_tools.py pack OUT                         # past 8 files, all but the log into files.tar.gz
    python scripts/gpu_tools.py annotate BENCH.json "COMMAND"    # the machine and the command into a benchmark JSON
    python scripts/gpu_tools.py ckpt-epoch RUN/last.pth          # the epochs a checkpoint holds (0: none there)
    python scripts/gpu_tools.py cfg-epochs CONFIG [key=value ...]
    python scripts/gpu_tools.py projection RUN/metrics.csv CONFIG
    python scripts/gpu_tools.py run-json OUT/run.json key=value ...
    python scripts/gpu_tools.py policies                         # vit_rope.policies.POLICIES, space-separated
    torchrun --standalone --nproc_per_node=1 scripts/gpu_tools.py nccl

Each device call has at most 10 minutes and what comes back is only what the session writes under $OUT, so every
figure it returns must say where it was measured (GPU, driver, torch, triton, timm) and by which command: the session
has no second chance to ask. The session script decides when a run resumes from these answers (``ckpt-epoch`` against
``cfg-epochs``), and ``projection`` tells from a short dry run whether the full run fits one call.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # vit_rope, imported where needed: `pack` and `env` must work even where it cannot be

NVIDIA_QUERY = "name,driver_version,memory.total,clocks.max.sm,power.limit"
MAX_FILES = 8  # what the device returns from $OUT
UNPACKED = ("session.log", "session.log.gz", "env.txt", "machine.json")  # readable without unpacking anything
STARTUP_MIN, EVAL_MIN = 0.5, 1.0  # train.py start-up and the evaluation of a train call, beside the epochs (minutes)


def machine() -> dict[str, Any]:
    """``vit_rope.report.machine`` (versions, triton and CUDA included) plus what a GPU figure also depends on: the
    GPU's driver, memory, clock and power limit (``nvidia-smi``; None where there is none)."""
    from vit_rope.report import machine as base_machine

    info = base_machine()
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = None
    return info


def versions() -> list[str]:
    """One line per library the session depends on; the session greps env.txt for the lines that start with a name."""
    import timm
    import torch
    from PIL import __version__ as pillow
    from PIL import features

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return [f"python {sys.version.split()[0]} {sys.executable}",
            f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()} {gpu}",
            f"triton {triton_version}", f"timm {timm.__version__} {timm.__file__}",
            f"pillow {pillow} webp {features.check('webp')}"]


def _output(command: list[str]) -> str | None:
    """A command's stdout, None where it is missing or fails (no nvidia-smi or nvcc on a CPU machine)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(command: str) -> list[str]:
    """$OUT/env.txt: nvidia-smi, the versions, the machine's own timm (the carried wheel shadows it), nvcc, cores,
    memory, kernel and disk, so a figure from the session can be traced to the machine without asking it again."""
    pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    own = [entry for entry in sys.path if entry and entry not in pythonpath and entry != str(ROOT)]
    own_timm = next(iter(importlib.metadata.distributions(name="timm", path=own)), None)
    meminfo = Path("/proc/meminfo")
    mem = next((line.split()[1] for line in meminfo.read_text().splitlines() if line.startswith("MemTotal")), "?") \
        if meminfo.exists() else "?"
    disk = shutil.disk_usage(".")
    return [f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {command}", "## nvidia-smi",
            _output(["nvidia-smi"]) or "(no nvidia-smi)", f"## versions (PYTHONPATH={os.pathsep.join(pythonpath)})",
            *versions(), f"machine's own timm: {own_timm.version if own_timm else None}",
            ((_output(["nvcc", "--version"]) or "").splitlines() or ["(no nvcc)"])[-1],
            f"cores {os.cpu_count()}; {int(mem) // 2**20 if mem.isdigit() else mem} GiB memory; "
            f"kernel {platform.release()}",
            f"disk: {disk.free / 2**30:.0f} GiB free of {disk.total / 2**30:.0f} GiB"]


def pack(out: str | Path, max_files: int = MAX_FILES) -> list[str]:
    """Past ``max_files`` files in ``out``, move all but the log and the machine files into ``out/files.tar.gz``.

    The device returns at most 8 files from $OUT and drops the rest; one tarball keeps every benchmark JSON and run
    summary of a long call. Returns the packed paths, relative to ``out`` (none when the files fit)."""
    out = Path(out)
    files = sorted(path for path in out.rglob("*") if path.is_file())
    packed = [path for path in files if path.name not in UNPACKED]
    if len(files) <= max_files or not packed:
        return []
    names = [path.relative_to(out).as_posix() for path in packed]
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(tmp) / "files.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            for path, name in zip(packed, names, strict=True):
                tar.add(path, arcname=name)
        for path in packed:
            path.unlink()
        for folder in sorted((path for path in out.rglob("*") if path.is_dir()), key=lambda p: len(p.parts),
                             reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        shutil.move(tarball, out / "files.tar.gz")
    return names


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def annotate(path: str | Path, command: str) -> dict[str, Any]:
    """Merge the machine and the exact command into the ``machine`` entry of a benchmark JSON (the benchmark's own
    keys kept unless the machine names them again), so the file can be copied to results/performance/ as it is."""
    data = json.loads(Path(path).read_text())
    data["machine"] = {**data.get("machine", {}), **machine(), "command": command}
    write_json(path, data)
    return data


def checkpoint_epoch(path: str | Path) -> int:
    """Epochs done in a train.py checkpoint, 0 when the file is not there (a fresh machine has lost output/).

    Memory-mapped and ``weights_only``: the ~260 MB last.pth is not read in full, and no code from it runs."""
    import torch

    if not Path(path).is_file():
        return 0
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("epoch", 0))


def config_epochs(config: str | Path, overrides: Sequence[str] = ()) -> int:
    """The epochs train.py will run for this config and these ``key=value`` overrides."""
    from vit_rope.config import build_config

    return build_config(config, list(overrides)).epochs


def projected_seconds(epoch_seconds: Sequence[float], epochs: int) -> float:
    """Seconds of ``epochs`` epochs from a dry run's per-epoch seconds.

    The first epoch also compiles the graphs and decodes the data into the cache, so it is counted once and every
    later epoch at the last one's time; a one-epoch dry run can only repeat its first epoch (an overestimate)."""
    first, last = epoch_seconds[0], epoch_seconds[-1]
    return first + (epochs - 1) * last if len(epoch_seconds) > 1 else epochs * first


def projection(metrics: str | Path, config: str | Path) -> str:
    """What a dry run's ``metrics.csv`` says of the full run of ``config``: one line for the session log."""
    with open(metrics, newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = config_epochs(config)
    seconds = [float(row["seconds"]) for row in rows]
    total = projected_seconds(seconds, epochs)
    return (f"projection for {config}: {epochs} epochs = first epoch {seconds[0]:.1f}s (compile, warm-up) + "
            f"{epochs - 1} x {seconds[-1]:.1f}s (epoch {len(rows)}: {float(rows[-1]['images_per_s']):.0f} images/s in "
            f"training) = {total / 60:.1f} min of epochs, plus ~{STARTUP_MIN} min start-up and ~{EVAL_MIN:.0f} min "
            "evaluation" + ("" if len(rows) > 1 else
                            " (one epoch only: compile time counted in every epoch, an overestimate)"))


def parse_fields(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` arguments as a dict; values of digits only become ints (epochs, seconds)."""
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got '{pair}'")
        fields[key] = int(value) if value.isdigit() else value
    return fields


def run_json(path: str | Path, fields: dict[str, Any]) -> dict[str, Any]:
    """A run's summary beside its metrics (timings, commands) with the machine it ran on."""
    data = {**fields, "machine": machine()}
    write_json(path, data)
    return data


def nccl_check() -> str:
    """One all_reduce through NCCL under torchrun: timm's launcher makes no process group for a single process, so a
    one-GPU train.py never touches NCCL, and a multi-GPU run would be the first to find it broken."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))))
    try:
        x = torch.ones(4, device="cuda")
        dist.all_reduce(x)
        return (f"NCCL {torch.cuda.nccl.version()}: all_reduce over {dist.get_world_size()} process(es) gives "
                f"{x.tolist()}")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("machine", help="write the machine JSON").add_argument("path")
    sub.add_parser("versions", help="print the library versions")
    sub.add_parser("env", help="print env.txt: GPU, versions, machine").add_argument("cmd", metavar="COMMAND")
    sub.add_parser("pack", help="pack $OUT into files.tar.gz past 8 files").add_argument("out")
    cmd = sub.add_parser("annotate", help="add the machine and the command to a benchmark JSON")
    cmd.add_argument("path")
    cmd.add_argument("cmd", metavar="COMMAND", help="the command that wrote it, one argument")
    sub.add_parser("ckpt-epoch", help="print the epochs a checkpoint holds").add_argument("path")
    cmd = sub.add_parser("cfg-epochs", help="print a config's epochs")
    cmd.add_argument("config")
    cmd.add_argument("overrides", nargs="*", metavar="key=value")
    cmd = sub.add_parser("projection", help="print the projected time of a full run from a dry run")
    cmd.add_argument("metrics")
    cmd.add_argument("config")
    cmd = sub.add_parser("run-json", help="write a run's run.json")
    cmd.add_argument("path")
    cmd.add_argument("fields", nargs="*", metavar="key=value")
    sub.add_parser("policies", help="print the evaluation policies")
    sub.add_parser("nccl", help="one NCCL all_reduce (under torchrun)")
    args = parser.parse_args(argv)

    if args.command == "machine":
        write_json(args.path, machine())
    elif args.command == "versions":
        print("\n".join(versions()))
    elif args.command == "env":
        print("\n".join(environment(args.cmd)))
    elif args.command == "pack":
        names = pack(args.out)
        if names:
            print(f"packed {len(names)} files into $OUT/files.tar.gz (tar -xzf files.tar.gz): {' '.join(names)}")
    elif args.command == "annotate":
        annotate(args.path, args.cmd)
    elif args.command == "ckpt-epoch":
        print(checkpoint_epoch(args.path))
    elif args.command == "cfg-epochs":
        print(config_epochs(args.config, args.overrides))
    elif args.command == "projection":
        print(projection(args.metrics, args.config))
    elif args.command == "run-json":
        try:
            run_json(args.path, parse_fields(args.fields))
        except ValueError as err:
            parser.error(str(err))
    elif args.command == "policies":
        from vit_rope.policies import POLICIES

        print(" ".join(POLICIES))
    elif args.command == "nccl":
        print(nccl_check())
    return 0


if __name__ == "__main__":
    sys.exit(main())
