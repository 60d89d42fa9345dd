"""The package's shape: modules reachable by name, no import cycles, an engine on its own."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import types
from pathlib import Path

import pytest

import fxviews

REPO = Path(__file__).resolve().parent.parent
FRONT_DOOR = sorted(p.stem for p in (REPO / "fxviews").glob("*.py") if p.stem != "__main__")


@pytest.mark.parametrize("name", FRONT_DOOR)
def test_each_module_is_what_its_dotted_name_imports(name):
    module = importlib.import_module(f"fxviews.{name}")
    assert isinstance(module, types.ModuleType)
    # `import fxviews.x as m` binds the package attribute x: it must be the module itself.
    assert getattr(fxviews, name, module) is module


def test_the_backend_function_keeps_its_public_name():
    import fxviews.compile_backend as module

    assert fxviews.backend is module.backend and callable(fxviews.backend)


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions, absolute names only."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_printouts_import_no_other_front_door_module():
    # rewriting imports printouts to print its results: the other way round would be a cycle.
    imported = _imported_modules(REPO / "fxviews" / "printouts.py")
    front_door = {m for m in imported if m.startswith("fxviews")}
    assert all(m.startswith("fxviews.passes") for m in front_door), front_door


@pytest.mark.parametrize("path", sorted((REPO / "passes").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_imports_nothing_from_the_front_door(path):
    assert not {m for m in _imported_modules(path) if m.split(".")[0] == "fxviews"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_the_lint_gate_before_pytest():
    dry_run = subprocess.run(
        ["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    steps = ["ruff check .", "ruff format --check .", "mypy", "-m pytest"]
    found = [next(i for i, line in enumerate(dry_run) if step in line) for step in steps]
    assert found == sorted(found), dry_run
