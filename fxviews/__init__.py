"""fxviews: make traced torch.func graphs layout-portable by rewriting as_strided into views.

Front door (this package): :func:`trace`, :func:`rewrite`, :func:`explain`, :func:`transform`,
:func:`backend`, :func:`export_onnx`, :func:`as_strided` (the engine at run time, on a live
tensor), and, each imported on first use, ``fxviews.executorch`` (ExecuTorch's ``to_edge``
and ``to_edge_transform_and_lower`` with the programs rewritten first) and ``fxviews.dtensor``
(DTensor answers ``as_strided``, see :mod:`fxviews.consumers.dtensor`); each rewrite's
:class:`Record` of a node says its :class:`RecordKind`. The engine is :mod:`fxviews.passes`:
the top-level ``passes/`` directory of the repository, which ``fxviews/passes`` links to, so
it is the same package installed or not.

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
from fxviews.passes.runtime_views import AsStridedRequestError
from fxviews.passes.runtime_views import as_strided_views as as_strided
from fxviews.rewriting import rewrite
from fxviews.tracing import TracingError, trace
from fxviews.transforming import explain, transform

__all__ = [
    "AsStridedRequestError",
    "FxViewsError",
    "Record",
    "RecordKind",
    "RewriteResult",
    "TracingError",
    "UnsafeAsStridedError",
    "as_strided",
    "backend",
    "explain",
    "export_onnx",
    "rewrite",
    "trace",
    "transform",
]


#: Consumers imported on first use: ExecuTorch, which ``import fxviews`` must not pay for, and
#: DTensor's, which changes nothing until its register() is called.
_LAZY_CONSUMERS = {
    "executorch": "fxviews.consumers.executorch",
    "dtensor": "fxviews.consumers.dtensor",
}


def __getattr__(name: str) -> Any:
    """``fxviews.executorch`` and ``fxviews.dtensor``, imported on first use."""
    if name in _LAZY_CONSUMERS:
        import importlib

        module = importlib.import_module(_LAZY_CONSUMERS[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fxviews' has no attribute {name!r}")
