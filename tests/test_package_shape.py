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
    from fxviews.consumers.compile import backend

    assert fxviews.backend is backend.backend and callable(fxviews.backend)


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


#: The pipeline's stages, from the API down to the compat layer: a module imports modules of its
#: own stage and of stages below it, never above. A module's stage is the longest prefix of its
#: name listed here (``fxviews.passes`` alone is the engine's public package).
STAGES = (
    (
        "the API, its command line and bench",
        (
            "fxviews",
            "fxviews.__main__",
            "fxviews.apis",
            "fxviews.cli",
            "fxviews.examples",
            "fxviews.bench",
        ),
    ),
    ("consumers", ("fxviews.consumers",)),
    ("calls", ("fxviews.calls",)),
    ("tracing", ("fxviews.tracing",)),
    ("state", ("fxviews.state",)),
    ("rewriting", ("fxviews.rewriting",)),
    ("argument checks", ("fxviews.arguments",)),
    ("the engine's public package", ("fxviews.passes",)),
    ("the engine at run time", ("fxviews.passes.runtime",)),
    ("rewrites", ("fxviews.passes.rewrites",)),
    ("analysis", ("fxviews.passes.analysis",)),
    ("chains", ("fxviews.passes.chains",)),
    (
        "the engine's shared modules",
        tuple(
            f"fxviews.passes.{name}"
            for name in (
                "schema",
                "errors",
                "first_use",
                "op_tables",
                "graph_edits",
                "source_lines",
                "random_state",
                "device_faults",
            )
        ),
    ),
    ("geometry", ("fxviews.passes.geometry",)),
    ("compat", ("fxviews.passes.compat",)),
)


def _stage(module: str) -> int:
    """The index in :data:`STAGES` of ``module``'s stage (its longest listed prefix)."""
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(STAGES)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} belongs to no stage of STAGES"
    return max(matches)[1]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_only_its_stage_and_those_below(name):
    upward = sorted(m for m in IMPORT_GRAPH[name] if _stage(m) < _stage(name))
    assert not upward, (
        f"{name} (stage: {STAGES[_stage(name)][0]}) imports a stage above it: "
        + ", ".join(f"{m} ({STAGES[_stage(m)][0]})" for m in upward)
    )


def test_the_stage_finder_takes_the_longest_prefix():
    # Without it every engine module would be "the engine's public package", and the engine's
    # own layering would pass whatever it imports.
    assert STAGES[_stage("fxviews.passes.chains.chain")][0] == "chains"
    assert STAGES[_stage("fxviews.passes")][0] == "the engine's public package"
    assert STAGES[_stage("fxviews.consumers.compile.backend")][0] == "consumers"


def _package_of_schema() -> dict[str, str]:
    """The schema's meta keys: the value of each of its upper-case string constants."""
    from fxviews.passes import schema

    return {
        name: value
        for name, value in vars(schema).items()
        if name.isupper() and isinstance(value, str) and value.startswith("fxviews_")
    }


def test_each_meta_key_has_one_meaning():
    keys = _package_of_schema()
    assert keys and len(set(keys.values())) == len(keys), keys


_META_METHODS = ("get", "setdefault", "pop")


def _literal_meta_keys(source: str) -> list[tuple[int, str]]:
    """(line, key) for each ``x.meta[...]``, ``x.meta.get(...)`` (and ``setdefault``, ``pop``)
    and ``... in x.meta`` whose key is an ``fxviews_`` string literal."""
    found = []

    def is_meta(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "meta"

    def literal(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if node.value.startswith("fxviews") else None
        return None

    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and is_meta(node.value):
            key = literal(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _META_METHODS and is_meta(node.func.value) and node.args:
                key = literal(node.args[0])
        elif isinstance(node, ast.Compare) and any(is_meta(c) for c in node.comparators):
            key = literal(node.left)
        if key is not None:
            found.append((node.lineno, key))
    return found


def test_the_meta_key_scan_finds_literal_keys():
    source = 'n.meta["fxviews_a"]\nn.meta.get("fxviews_b")\n"fxviews_c" in n.meta\nn.meta["val"]'
    assert [key for _, key in _literal_meta_keys(source)] == ["fxviews_a", "fxviews_b", "fxviews_c"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "fxviews.passes.schema"))
def test_meta_keys_come_from_the_schema_only(name):
    source = MODULES[name].read_text()
    assert _literal_meta_keys(source) == []
    values = set(_package_of_schema().values())
    redefined = [
        target.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and node.value.value in values
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    assert redefined == [], f"{name} defines meta keys of its own: {redefined}"


def test_the_package_list_is_the_trees_packages():
    # setuptools cannot find passes/ as fxviews.passes: pyproject.toml lists the packages, and a
    # package missing there would be missing from the wheel.
    import tomllib

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    packages = sorted(n for n, p in MODULES.items() if p.name == "__init__.py")
    assert sorted(listed) == packages


def test_no_symbolic_link_in_the_tree():
    # A checkout without symbolic links (Windows, some archives) gets a text file for each.
    tracked = subprocess.run(
        ["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout
    if not tracked:
        pytest.skip("not a git checkout")
    links = [line.split("\t")[1] for line in tracked.splitlines() if line.startswith("120000")]
    assert links == []


@pytest.mark.parametrize(
    "path", sorted((REPO / "passes").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO))
)
def test_the_engine_imports_nothing_from_the_front_door(path):
    parts = path.relative_to(REPO / "passes").with_suffix("").parts
    name = ".".join(("fxviews.passes", *(parts[:-1] if parts[-1] == "__init__" else parts)))
    imported = _imports(name, path)
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
