"""fxviews installs as a wheel and runs from anywhere, the repository root included.

Slow (about 40 s, marked ``slow``): it copies the source tree, installs it the way the README
says, ``pip install .`` (non-editable), into a fresh virtualenv, and runs the command line
twice: from the copy's root, where Python finds the source ``fxviews/`` before the install, and
from an empty directory, where only the install is found; and installs it editable (``pip
install -e .``, as ``make`` does) into another. The engine, the top-level ``passes/``, must be
``fxviews.passes`` in each. Offline: no build isolation and no
dependency resolution; the new virtualenv borrows this environment's packages (torch, numpy,
tabulate, and setuptools to build) through a ``.pth`` file.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# What `pip install .` needs of the tree: the metadata, the readme it embeds, the packages.
SOURCE = ["pyproject.toml", "README.md", "fxviews", "passes"]
# Prints where each package was imported from, and what the dynamo entry point loads.
WHERE = """
from importlib.metadata import entry_points, requires
import fxviews, fxviews.passes
(ep,) = entry_points(group="torch_dynamo_backends", name="fxviews")
print(fxviews.__file__, fxviews.passes.__file__, ep.value, requires("fxviews"), sep="\\n")
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the virtualenv's python, the copied source tree it was installed from)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    for name in SOURCE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    return _install(root / "venv", [str(source)]), source


@pytest.fixture(scope="module")
def editable(installed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a virtualenv with the copied source tree installed editable."""
    _, source = installed
    venv = tmp_path_factory.mktemp("editable") / "venv"
    return _install(venv, ["-e", str(source)])


def _install(venv: Path, what: list[str]) -> Path:
    """A fresh virtualenv at ``venv`` borrowing this one's packages, with ``what`` installed
    offline; its python."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    (Path(purelib.strip()) / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    _run([*pip, "--no-deps", "--no-build-isolation", "--no-index", *what])
    return python


@pytest.mark.parametrize("where", ["source root", "elsewhere"])
def test_the_installed_package_runs(installed, where, tmp_path):
    python, source = installed
    cwd = source if where == "source root" else tmp_path
    demo = subprocess.run(
        [str(python), "-m", "fxviews", "demo", "--batch-size", "2"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_environment(),
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "both match the per-sample reference" in demo.stdout
    assert "Failed to initialize NumPy" not in demo.stderr
    assert "Traceback" not in demo.stderr

    package, engine, entry_point, requirements = _run([str(python), "-c", WHERE], cwd).split("\n")
    # From the root the source tree wins, with its own top-level passes/; elsewhere both come
    # from the install, where the wheel holds the engine as fxviews/passes.
    if where == "source root":
        assert Path(package) == source / "fxviews" / "__init__.py"
        assert Path(engine) == source / "passes" / "__init__.py"
    else:
        installed_package = Path(package).parent
        assert installed_package.is_relative_to(python.parent.parent)
        assert Path(engine) == installed_package / "passes" / "__init__.py"
    assert entry_point == "fxviews.consumers.compile.backend:fxviews_backend"
    # torch warns on import without numpy: fxviews depends on it, not only its tests.
    assert "'numpy'" in requirements


def test_an_editable_install_serves_the_engine_from_the_source_tree(installed, editable, tmp_path):
    _, source = installed
    package, engine, entry_point, _ = _run([str(editable), "-c", WHERE], tmp_path).split("\n")
    assert Path(package) == source / "fxviews" / "__init__.py"
    assert Path(engine) == source / "passes" / "__init__.py"
    assert entry_point == "fxviews.consumers.compile.backend:fxviews_backend"
    out = _run([str(editable), "-m", "fxviews", "demo", "--batch-size", "2"], tmp_path)
    assert "both match the per-sample reference" in out


def test_the_console_script_is_installed(installed, tmp_path):
    python, _ = installed
    script = python.parent / "fxviews"
    out = _run([str(script), "--help"], tmp_path)
    assert out.startswith("usage: fxviews") and "demo" in out and "bench" in out


def _environment() -> dict[str, str]:
    # Nothing may put the source tree on the path but the working directory.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FXVIEWS_DEBUG")}


def _run(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, env=_environment(), timeout=300
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}{done.stderr}"
    return done.stdout.strip()
