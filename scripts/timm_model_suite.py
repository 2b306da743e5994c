"""timm's own model tests on the vit_rope_* and swin_rope_* models: ``tests/test_models.py`` of timm's source release.

    python scripts/timm_model_suite.py                       # every vit_rope_* / swin_rope_* model (hours on CPU)
    python scripts/timm_model_suite.py --match tiny          # the models whose name holds "tiny"
    python scripts/timm_model_suite.py --match "tiny and lookhere" -- -x   # anything after -- goes to pytest

timm's wheel carries no tests, so the script downloads the source release of the installed version from the package
index (``pip download --no-binary``; once, into ``--out``), and runs its ``test_models.py`` with vit_rope imported
first, so that the ``vit_rope_*`` models are in timm's registry when pytest collects the test parameters. Selected:
the tests whose id names a ``vit_rope_`` or ``swin_rope_`` model (forward, backward, default configs, features,
intermediates, FX), less those that download published weights (no hub here; ``test_model_load_pretrained`` and the
like) and TorchScript's, which the models refuse by design, as timm's own NaFlex models (docs/export.md). The exit
status is pytest's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

import timm

KNOWN_REFUSALS = "not torchscript"


def timm_tests(out: Path) -> Path:
    """The ``tests`` folder of the installed timm's source release, downloaded and unpacked into ``out`` once."""
    version = timm.__version__
    tests = out / f"timm-{version}" / "tests"
    if (tests / "test_models.py").is_file():
        return tests
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"timm-{version}.tar.gz"
    if not archive.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", f"timm=={version}", "--no-binary", ":all:",
                        "--no-deps", "--dest", str(out), "--quiet"], check=True)
    if not archive.is_file():
        sys.exit(f"error: pip left no {archive.name} in {out}; download timm's source release for {version} there")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"timm-{version}/tests/")]
        tar.extractall(out, members=members, filter="data")
    return tests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", help="a pytest -k expression that narrows the models further (e.g. tiny)")
    parser.add_argument("--out", type=Path, default=Path("output/timm-suite"), help="where timm's tests go")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    tests = timm_tests(args.out.resolve())  # absolute: pytest runs from the release's folder
    selection = f"(vit_rope_ or swin_rope_) and not pretrained and {KNOWN_REFUSALS}"
    selection += f" and ({args.match})" if args.match else ""
    # vit_rope registers its models on import, before pytest collects timm's parametrised model lists
    code = "import sys, pytest, vit_rope; sys.exit(pytest.main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, str(tests / "test_models.py"), "-q", "-k", selection,
               "-p", "no:cacheprovider", *args.pytest_args]
    print("$ " + " ".join(command[:2] + [repr(code)] + command[3:]), flush=True)
    return subprocess.run(command, cwd=tests.parent).returncode


if __name__ == "__main__":
    sys.exit(main())
