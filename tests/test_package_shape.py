"""The package's shape: modules reachable by name, no import circles, an engine on its own."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fxviews

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "fxviews"


def _module_files() -> dict[str, Path]:
    """Every module of the package by dotted name, ``fxviews.passes`` (a link) included.

    ``__main__`` modules run a command when imported: they are left out.
    """
    modules = {}
    # rglob does not enter the fxviews/passes link: the engine is walked where it lies.
    for root, package in ((PACKAGE, "fxviews"), (REPO / "passes", "fxviews.passes")):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


MODULES = _module_files()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_is_what_its_dotted_name_imports(name):
    module = importlib.import_module(name)
    assert isinstance(module, types.ModuleType)
    if "." in name:
        # `import fxviews.x.y as m` binds the attribute y of fxviews.x: it must be the module.
        parent, _, leaf = name.rpartition(".")
        assert getattr(sys.modules[parent], leaf, module) is module


def test_every_module_imports_in_a_fresh_interpreter():
    # In one fresh process, so no module relies on another having been imported first.
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
    done = subprocess.run(
        [sys.executable, "-c", code, *sorted(MODULES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_backend_function_keeps_its_public_name():
    from fxviews.consumers import compile_backend

    assert fxviews.backend is compile_backend.backend and callable(fxviews.backend)


def _imports(name: str, path: Path) -> set[str]:
    """The modules of this package that module ``name`` imports, anywhere in its code.

    Relative imports are resolved; ``from package import x`` counts as importing the module
    ``package.x`` when there is one, else ``package`` itself.
    """
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


IMPORT_GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_no_import_circle_in_fxviews_or_the_engine():
    assert _circles(IMPORT_GRAPH) == []


def test_the_circle_finder_finds_circles():
    # The test above passes on any graph the finder misses a circle in: check the finder.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_consumers_do_not_import_the_front_doors_public_modules():
    # fxviews.rewriting dispatches an ExportedProgram to the export consumer: a consumer
    # importing it (or the package) back would close a circle.
    for name, imported in IMPORT_GRAPH.items():
        if name.startswith("fxviews.consumers."):
            assert not imported & {"fxviews", "fxviews.rewriting"}, (name, imported)


def test_no_module_is_over_800_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: lines for n, lines in long.items() if lines > 800} == {}


def test_printouts_import_no_other_front_door_module():
    # graph_rewriting imports printouts to print its results: the other way round would be a
    # circle.
    imported = IMPORT_GRAPH["fxviews.printouts"]
    assert all(m.startswith("fxviews.passes") for m in imported), imported


@pytest.mark.parametrize("path", sorted((REPO / "passes").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_imports_nothing_from_the_front_door(path):
    imported = _imports(f"fxviews.passes.{path.stem}", path)
    assert all(m.startswith("fxviews.passes") for m in imported), imported
    source = ast.parse(path.read_text())
    absolute = {
        node.module
        for node in ast.walk(source)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
    }
    assert not {m for m in absolute if m.split(".")[0] == "fxviews"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_the_lint_gate_before_pytest():
    dry_run = subprocess.run(
        ["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    steps = ["ruff check .", "ruff format --check .", "mypy", "-m pytest"]
    found = [next(i for i, line in enumerate(dry_run) if step in line) for step in steps]
    assert found == sorted(found), dry_run


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_installs_no_zoo_beside_the_cpu_torch():
    # The index's torchvision for torch 2.13.0 is a CUDA build that fails to import beside the
    # CPU torch (timm imports torchvision): `make test` must not install what cannot import.
    dry_run = subprocess.run(
        ["make", "-n", "-B", "setup"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    installs = [line for line in dry_run.splitlines() if "pip install" in line]
    assert installs, dry_run
    assert not [line for line in installs if "torchvision" in line or "timm" in line]
    extras = [line.split("'.[")[1].split("]")[0].split(",") for line in installs if "'.[" in line]
    assert extras and all("zoo" not in names for names in extras), installs
