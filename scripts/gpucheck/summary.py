"""The last thing ``make gpu-check`` prints, and its ``summary.json``: the machine (GPU, driver, torch, triton, timm),
one row per step (PASS, MISS, FAIL, minutes against its limit) and one per target."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.machine import describe_machine
from vit_rope.eval.report import table


def gpu_driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def machine() -> dict[str, Any]:
    return {**describe_machine(), "driver": gpu_driver()}


def cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "MISS", None: "n/a"}[passed]


def render(result: dict[str, Any]) -> str:
    """The summary as text: a line on the machine, the steps, then the targets."""
    m = result["machine"]
    head = (f"make gpu-{result['suite']} on {result['device']}: GPU {m['gpu'] or 'none'}, driver {m['driver'] or '-'}, "
            f"torch {m['torch']} (CUDA {m['cuda'] or '-'}), triton {m['triton'] or '-'}, timm {m['timm']}, "
            f"python {m['python']}; {result['minutes']:.1f} min in all")
    steps = table(["step", "result", "minutes", "limit (min)", "detail (last line of its log)"],
                  [(s["name"], s["status"], f"{s['minutes']:.2f}", f"{s['limit_s'] / 60:.1f}", s["detail"][:100])
                   for s in result["steps"]])
    targets = table(["step", "target", "measured", "wanted", "result"],
                    [(s["name"], t["target"], cell(t["value"]), t["want"] or "-", verdict(t["pass"]))
                     for s in result["steps"] for t in s["targets"]])
    return "\n\n".join([head, steps, targets])


def save(result: dict[str, Any], out: Path) -> None:
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "summary.md").write_text(render(result) + "\n")
