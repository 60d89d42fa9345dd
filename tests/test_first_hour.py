"""What a new user meets in the first hour: import cost as behaviour, flags, CLI, printouts.

Timings live in the bench (``python -m fxviews bench --rows startup``); here only what must
hold whatever the machine: ``import fxviews`` imports neither Dynamo nor the engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxviews

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> str:
    """``code``'s stdout, run in a fresh interpreter on this checkout's fxviews."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
    )
    return done.stdout


def test_import_fxviews_imports_neither_dynamo_nor_the_engine() -> None:
    loaded = _python(
        "import sys, fxviews\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy', 'fxviews.passes.synthesis')"
        " if m in sys.modules))"
    )
    assert loaded.strip() == "[]"


def test_public_names_import_on_first_use() -> None:
    loaded = _python(
        "import sys, torch, fxviews\n"
        "fxviews.transform(lambda x: x * 2)(torch.ones(2))\n"
        "print('fxviews.transforming' in sys.modules)\n"
        "print(fxviews.as_strided(torch.arange(4.0), (2,), (2,)).tolist())\n"
        "print(fxviews.AsStridedRequestError.__mro__[1].__name__, fxviews.RecordKind.VIEW.value)"
    )
    assert loaded.splitlines() == ["True", "[0.0, 2.0]", "FxViewsError view"]


# --- flags: a switch given something other than a bool is a mistake, not "true" ---------------


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "False"])
def test_transform_and_explain_refuse_a_strict_that_is_not_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match=r"fxviews\.transform: strict must be True or False"):
        fxviews.transform(torch.sin, strict=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fxviews\.explain: strict must be"):
        fxviews.explain(torch.sin, torch.ones(2), strict=value)  # type: ignore[arg-type]


def test_rewrite_trace_and_backend_refuse_flags_that_are_not_bools() -> None:
    gm = fxviews.trace(torch.sin, torch.ones(2))
    with pytest.raises(TypeError, match=r"fxviews\.rewrite: strict must be True or False, got 1"):
        fxviews.rewrite(gm, strict=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reshape_views must be True, False or None, got 'no'"):
        fxviews.rewrite(gm, reshape_views="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fxviews\.trace: functionalize must be"):
        fxviews.trace(torch.sin, torch.ones(2), functionalize="yes")
    with pytest.raises(TypeError, match=r"fxviews\.backend: strict must be"):
        fxviews.backend(strict="yes")  # type: ignore[arg-type]
    # The bools themselves, and None where a default depends on other arguments, still work.
    assert fxviews.rewrite(gm, strict=True, reshape_views=None).graph_module is not None


@pytest.mark.parametrize(
    "size, stride",
    [((-1,), (1,)), ((2, -3), (1, 1)), ((2,), (-1,))],
)
def test_an_invalid_as_strided_is_reported_in_eager_pytorchs_words(size, stride) -> None:
    t = torch.randn(4)
    with pytest.raises(RuntimeError) as eager:
        t.as_strided(size, stride)
    with pytest.raises(fxviews.TracingError) as traced:
        fxviews.explain(lambda x: x.as_strided(size, stride), t)
    message = str(traced.value)
    assert "is invalid: eager PyTorch raises" in message
    assert str(eager.value).splitlines()[0] in message  # eager's own words
    assert "integer multiplication overflow" not in message
