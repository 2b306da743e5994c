"""The package's shape, read from its source: its folders are layers that import only the layers below them, no two
modules import each other, few modules sit directly in ``vit_rope/``, and the declared dependencies are exactly the
third-party modules it imports (optional ones in an extra)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import tomllib

from helpers.training import REPO

PACKAGE = REPO / "vit_rope"
# lowest first: a module may import its own layer and the ones before it
LAYERS = ["base", "layers", "encodings", "models", "data", "train", "eval", "commands"]
BASE = {"vit_rope.errors", "vit_rope.checks", "vit_rope._requires", "vit_rope.weights"}
COMMANDS = {"vit_rope", "vit_rope.evaluate", "vit_rope.diagnose", "vit_rope.export", "vit_rope.shards"}
# import name -> distribution, where they differ
DISTRIBUTIONS = {"PIL": "pillow", "yaml": "pyyaml"}
# imported only where the feature is used, and installed with torch's CUDA builds
WITH_TORCH = {"triton"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever in the file (``TYPE_CHECKING`` blocks and functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # from pkg import module
    return found


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {name: {other for other in imports(path) if other in MODULES and other != name} for name, path in
         MODULES.items()}


def layer(name: str) -> int:
    if name in BASE:
        return LAYERS.index("base")
    if name in COMMANDS:
        return LAYERS.index("commands")
    return LAYERS.index(name.split(".")[1])


def test_every_module_is_in_a_layer_and_few_sit_at_the_top() -> None:
    top = [path.name for path in MODULES.values() if path.parent == PACKAGE]
    assert len(top) <= 9, top
    for name in MODULES:
        assert name in BASE | COMMANDS or name.split(".")[1] in LAYERS, f"{name} is in no layer"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_no_higher_layer(name: str) -> None:
    higher = [other for other in GRAPH[name] if layer(other) > layer(name)]
    assert not higher, f"{name} ({LAYERS[layer(name)]}) imports {higher}"


def test_no_import_circle() -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            pytest.fail("import circle: " + " -> ".join((*path[path.index(name):], name)))
        if name in done:
            return
        for other in sorted(GRAPH[name]):
            if other.rsplit(".", 1)[0] != name:  # a package's __init__ naming its own submodule is no circle
                visit(other, (*path, name))
        done.add(name)

    for name in sorted(GRAPH):
        visit(name, ())


def test_declared_dependencies_are_the_imported_modules() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {req.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower() for req in requirements}

    declared = names(project["dependencies"])
    extras = set().union(*(names(reqs) for reqs in project["optional-dependencies"].values()))
    third_party = {name.split(".")[0] for path in MODULES.values() for name in imports(path)}
    third_party -= {"vit_rope", *sys.stdlib_module_names}
    imported = {DISTRIBUTIONS.get(name, name).lower() for name in third_party} - WITH_TORCH
    assert imported - declared - extras == set(), "imported, not declared"
    assert declared - imported == set(), "declared, never imported"


def test_module_names_explain_themselves() -> None:
    """No module is named like a standard-library one (``import string`` would find either), and no two modules of
    the package share a file name, so that a name in a traceback or an import says which one it is."""
    stems = [path.stem for path in MODULES.values() if path.stem != "__init__"]
    assert not set(stems) & sys.stdlib_module_names, set(stems) & sys.stdlib_module_names
    assert len(stems) == len(set(stems)), sorted({stem for stem in stems if stems.count(stem) > 1})


# how a module asks whether a forward runs under a graph capture (torch.compile / export, tracing, FX proxies)
MODE_CHECKS = ("capturing(", "is_compiling(", "is_exporting(", "is_tracing(", "is_scripting(", "fx.Proxy")


def test_the_forward_mode_is_asked_in_few_places() -> None:
    """Which implementation runs under a graph capture is decided in one place per concern (the rotation's form in
    ``layers/fused.py``, which defines the check, the embedding's checks, caches and ``Positions.captured`` in
    ``models/embedding.py``), not in every path: at most two modules ask."""
    asking = sorted(name for name, path in MODULES.items() if any(check in path.read_text() for check in MODE_CHECKS))
    assert len(asking) <= 2, asking
