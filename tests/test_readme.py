"""The documentation's Python code blocks run, each on its own, so every snippet stays true.

Every ```` ```python ```` block of README.md and of each ``docs/*.md`` page (any page added
there is collected) is one test: it runs on its own in a fresh
interpreter, as a reader pasting it would run it (and Dynamo's, Inductor's and torch.export's
process-wide state stays out of the other tests), in a temporary working directory (snippets
may save files), and fails if it raises; snippets state their results as assertions.

A block right after a line starting with ``<!-- not run`` is deliberately not runnable (an
excerpt of a traced graph, say) and is left out: keep those rare. Output samples use other
fences (```` ```sh ````, a bare ```` ``` ````) and are not Python. Blocks that import a module of
the ``onnx`` or ``executorch`` extra are skipped without it, as their test files are, and so
are those importing a client library (docs/clients.md), failed instead under
``FXVIEWS_REQUIRE_ZOO=1`` as ``tests/test_clients.py`` is.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_models import require_zoo_or_skip

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: A line starting with this, right before a ```python fence, marks the block as not run.
NOT_RUN = "<!-- not run"
ONNX_EXTRA = frozenset({"onnx", "onnxscript", "onnxruntime"})
#: Modules of the optional extras: a block importing one is skipped without it.
OPTIONAL = ONNX_EXTRA | {"executorch", "openvino", "iree", "tvm", "litert_torch", "torchax"}
#: The client libraries of docs/clients.md (the ``clients`` extra): a block importing one is
#: skipped without it, or failed under FXVIEWS_REQUIRE_ZOO=1, as tests/test_clients.py is.
CLIENTS = frozenset(
    {
        "posteriors",
        "torchopt",
        "tensordict",
        "torchrl",
        "laplace",
        "curvlinops",
        "nngeometry",
        "torchjd",
        "e3nn",
        "zuko",
        "opacus",
    }
)


@dataclass(frozen=True)
class Snippet:
    """One ```python block: its file, the line its code starts on, its code, whether it runs."""

    path: Path
    line: int
    source: str
    runnable: bool


def python_blocks(markdown: str, path: Path = README) -> list[Snippet]:
    """Every ```python block of ``markdown`` (the text of ``path``), in order.

    An unclosed block raises ValueError.
    """
    lines = markdown.splitlines()
    snippets = []
    start = None
    for number, line in enumerate(lines, start=1):
        fence = line.strip()
        if start is None and fence == "```python":
            start = number
        elif start is not None and fence == "```":
            runnable = start == 1 or not lines[start - 2].startswith(NOT_RUN)
            snippets.append(
                Snippet(path, start + 1, "\n".join(lines[start : number - 1]) + "\n", runnable)
            )
            start = None
    if start is not None:
        raise ValueError(f"the ```python block opened on {path.name}:{start} is not closed")
    return snippets


def documents(root: Path) -> list[Path]:
    """The documentation whose blocks run: ``root``'s README and every page under its docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def imported_modules(source: str) -> set[str]:
    """The top-level names of the modules ``source`` imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


SNIPPETS = [
    s for doc in documents(ROOT) for s in python_blocks(doc.read_text(encoding="utf-8"), doc)
]


@pytest.mark.parametrize(
    "snippet",
    [s for s in SNIPPETS if s.runnable],
    ids=lambda s: f"{s.path.relative_to(ROOT).as_posix()}:{s.line}",
)
def test_readme_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    imported = imported_modules(snippet.source)
    optional = imported & OPTIONAL
    needed = optional | (ONNX_EXTRA if optional & ONNX_EXTRA else set())
    for name in sorted(needed):
        pytest.importorskip(name)
    require_zoo_or_skip(*sorted(imported & CLIENTS), extra="clients")
    assert run_snippet(snippet, tmp_path) == ""


def run_snippet(snippet: Snippet, cwd: Path) -> str:
    """Run ``snippet`` in a new interpreter in ``cwd``: its traceback if it raised, else ""."""
    # Padded with empty lines so a traceback names the file and line that raised.
    code = "\n" * (snippet.line - 1) + snippet.source
    where = str(snippet.path)
    program = f"exec(compile({code!r}, {where!r}, 'exec'), {{'__name__': '__main__'}})"
    # This checkout's fxviews first, whichever one the interpreter has installed.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )
    return done.stderr if done.returncode else ""


def test_the_readme_has_runnable_snippets_and_few_that_are_not() -> None:
    runnable = [s for s in SNIPPETS if s.runnable]
    assert any(s.path == README for s in runnable)
    assert len(SNIPPETS) - len(runnable) <= len(runnable) // 4


def test_any_page_added_under_docs_is_collected(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ["README.md", "docs/b-page.md", "docs/a-page.md", "docs/notes.txt"]:
        (tmp_path / name).write_text("```python\nx = 1\n```\n")
    assert documents(tmp_path) == [
        tmp_path / "README.md",
        tmp_path / "docs" / "a-page.md",
        tmp_path / "docs" / "b-page.md",
    ]
    # The README's deep material moved under docs/ and its blocks still run.
    assert any(s.runnable and s.path.parent == ROOT / "docs" for s in SNIPPETS)


def test_python_blocks_reads_only_python_fences_and_honours_the_marker() -> None:
    markdown = "\n".join(
        [
            "# Title",
            "```python",
            "a = 1",
            "```",
            "```sh",
            "make test",
            "```",
            "<!-- not run: an excerpt -->",
            "```python",
            "as_strided = ...",
            "```",
            "```",
            "output",
            "```",
        ]
    )
    page = ROOT / "docs" / "page.md"
    assert python_blocks(markdown, page) == [
        Snippet(page, 3, "a = 1\n", True),
        Snippet(page, 10, "as_strided = ...\n", False),
    ]
    with pytest.raises(ValueError, match="page.md:2"):
        python_blocks("text\n```python\nx = 1\n", page)


def test_a_snippet_that_raises_fails_where_the_readme_says(tmp_path: Path) -> None:
    page = ROOT / "docs" / "page.md"
    snippet = Snippet(page, 7, "x = 1\nassert x == 2, 'stated result'\n", True)
    traceback = run_snippet(snippet, tmp_path)
    assert f'File "{page}", line 8' in traceback
    assert "AssertionError: stated result" in traceback


def test_imported_modules() -> None:
    source = "import onnxruntime, torch.fx\nfrom fxviews.examples import f\nfrom . import x\n"
    assert imported_modules(source) == {"onnxruntime", "torch", "fxviews"}


def test_relative_links_between_the_pages_resolve() -> None:
    link = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
    fenced = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)  # code, not links
    for doc in documents(ROOT):
        for target in link.findall(fenced.sub("", doc.read_text(encoding="utf-8"))):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links {target}"
