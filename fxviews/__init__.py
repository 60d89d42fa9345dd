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

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any


def _load_engine_from_the_source_tree() -> None:
    """Make the repository's top-level ``passes/`` the package ``fxviews.passes``, where this
    package sits in a source tree (a checkout run from its root, or an editable install).

    A wheel holds the engine as ``fxviews/passes`` (pyproject.toml's ``package-dir``), found by
    the import system as usual. In a source tree the engine beside this package is the one that
    goes with it, whatever else is installed: an editable install of another checkout maps
    ``fxviews.passes`` to that checkout's engine.
    """
    package = Path(__file__).resolve().parent
    engine = package.parent / "passes"
    if (package / "passes").is_dir() or not (engine / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(
        f"{__name__}.passes", engine / "__init__.py", submodule_search_locations=[str(engine)]
    )
    assert spec is not None and spec.loader is not None  # a file location always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    globals()["passes"] = module  # as the import system binds a subpackage on its parent
    spec.loader.exec_module(module)


_load_engine_from_the_source_tree()

from fxviews.passes.errors import AsStridedRequestError, FxViewsError, UnsafeAsStridedError  # noqa: E402
from fxviews.passes.first_use import import_on_first_use, names_with_first_use  # noqa: E402

if TYPE_CHECKING:
    from fxviews.apis import explain, rewrite, transform
    from fxviews.consumers.compile.backend import backend
    from fxviews.consumers.export.onnx import export_onnx
    from fxviews.passes import Record, RecordKind
    from fxviews.passes.runtime.runtime_views import as_strided_views as as_strided
    from fxviews.rewriting.steps import RewriteResult
    from fxviews.tracing.capture import trace
    from fxviews.tracing.failures import TracingError

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
    "backend": "fxviews.consumers.compile.backend:backend",
    "export_onnx": "fxviews.consumers.export.onnx:export_onnx",
    "RewriteResult": "fxviews.rewriting.steps:RewriteResult",
    "Record": "fxviews.passes:Record",
    "RecordKind": "fxviews.passes:RecordKind",
    "as_strided": "fxviews.passes:as_strided_views",
    "rewrite": "fxviews.apis:rewrite",
    "TracingError": "fxviews.tracing.failures:TracingError",
    "trace": "fxviews.tracing.capture:trace",
    "explain": "fxviews.apis:explain",
    "transform": "fxviews.apis:transform",
    "executorch": "fxviews.consumers.export.executorch",
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
    from fxviews.consumers.compile.backend import register_backend_name

    register_backend_name()
