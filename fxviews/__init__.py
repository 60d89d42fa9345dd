"""fxviews: make traced torch.func graphs layout-portable by rewriting as_strided into views.

Front door (this package): :func:`trace`, :func:`rewrite`, :func:`explain`, :func:`transform`,
:func:`backend`, :func:`export_onnx`, and ``fxviews.executorch`` (ExecuTorch's ``to_edge`` and
``to_edge_transform_and_lower`` with the programs rewritten first; imported on first use, so
``import fxviews`` never imports ExecuTorch); each rewrite's :class:`Record` of a node says its
:class:`RecordKind`. The engine is :mod:`fxviews.passes`: the top-level ``passes/`` directory of
the repository, which ``fxviews/passes`` links to, so it is the same package installed or not.

Example::

    >>> res = fxviews.explain(push_jvp, x, y, yt)
    >>> [(r.kind, r.after) for r in res.records]
    [(<RecordKind.AS_STRIDED: 'as_strided'>, 'select(clone_1, 0, 0)')]
"""

from typing import Any

from fxviews.consumers.compile_backend import backend  # importing it registers backend="fxviews"
from fxviews.consumers.onnx import export_onnx
from fxviews.graph_rewriting import RewriteResult
from fxviews.passes import FxViewsError, Record, RecordKind, UnsafeAsStridedError
from fxviews.rewriting import rewrite
from fxviews.tracing import TracingError, trace
from fxviews.transforming import explain, transform

__all__ = [
    "FxViewsError",
    "Record",
    "RecordKind",
    "RewriteResult",
    "TracingError",
    "UnsafeAsStridedError",
    "backend",
    "explain",
    "export_onnx",
    "rewrite",
    "trace",
    "transform",
]


def __getattr__(name: str) -> Any:
    """``fxviews.executorch``, imported on first use (:mod:`fxviews.consumers.executorch`)."""
    if name == "executorch":
        import importlib

        module = importlib.import_module("fxviews.consumers.executorch")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fxviews' has no attribute {name!r}")
