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

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from fxviews.passes.errors import AsStridedRequestError, FxViewsError, UnsafeAsStridedError
from fxviews.passes.first_use import import_on_first_use, names_with_first_use

if TYPE_CHECKING:
    from fxviews.consumers.compile_backend import backend
    from fxviews.consumers.onnx import export_onnx
    from fxviews.graph_rewriting import RewriteResult
    from fxviews.passes import Record, RecordKind
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


#: Every public name but the engine's errors is imported on first use (see first_use.py):
#: the engine imports sympy, the engine at run time Dynamo (it is kept out of torch.compile's
#: graphs), ``fxviews.executorch`` ExecuTorch, and ``fxviews.dtensor`` changes nothing until its
#: register() is called. So ``import fxviews`` costs tens of ms over ``import torch``.
_ON_FIRST_USE = {
    "backend": "fxviews.consumers.compile_backend:backend",
    "export_onnx": "fxviews.consumers.onnx:export_onnx",
    "RewriteResult": "fxviews.graph_rewriting:RewriteResult",
    "Record": "fxviews.passes:Record",
    "RecordKind": "fxviews.passes:RecordKind",
    "as_strided": "fxviews.passes:as_strided_views",
    "rewrite": "fxviews.rewriting:rewrite",
    "TracingError": "fxviews.tracing:TracingError",
    "trace": "fxviews.tracing:trace",
    "explain": "fxviews.transforming:explain",
    "transform": "fxviews.transforming:transform",
    "executorch": "fxviews.consumers.executorch",
    "dtensor": "fxviews.consumers.dtensor",
}


def __getattr__(name: str) -> Any:
    """Every public name but the errors, and ``fxviews.executorch``/``dtensor``, on first use."""
    return import_on_first_use(globals(), _ON_FIRST_USE, name)


def __dir__() -> list[str]:
    """The names bound now and those imported on first use (for ``dir()`` and completion)."""
    return names_with_first_use(globals(), _ON_FIRST_USE)


# backend="fxviews" resolves through the distribution's torch_dynamo_backends entry point, which
# Dynamo loads itself. Only a source tree on sys.path without installed metadata registers the
# name here, which imports the backend and Dynamo.
if not entry_points(group="torch_dynamo_backends", name="fxviews"):
    from fxviews.consumers.compile_backend import register_backend_name

    register_backend_name()
