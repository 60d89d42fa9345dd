"""fxviews: make traced torch.func graphs layout-portable by rewriting as_strided into views.

Front door (this package): :func:`trace`, :func:`rewrite`, :func:`explain`, :func:`transform`,
:func:`backend`, :func:`export_onnx`. The engine is :mod:`fxviews.passes` (top-level ``passes/``
in the repository).
"""

from fxviews.compile_backend import backend  # importing it registers backend="fxviews"
from fxviews.onnx_export import export_onnx
from fxviews.passes import FxViewsError, Record, RecordKind, UnsafeAsStridedError
from fxviews.rewriting import RewriteResult, rewrite
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
