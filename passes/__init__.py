"""fxviews.passes: the engine. Graph in, graph out; imports nothing from the front door.

This directory sits at the top of the repository and is installed as the package
``fxviews.passes`` (pyproject.toml's ``package-dir``; in a source tree ``fxviews/__init__.py``
maps it). Its packages are the engine's stages, each importing only those below it: the
compat layer (:mod:`.compat`, every private PyTorch name), :mod:`.geometry`, the modules every
stage shares (:mod:`.schema`: every meta key and record type the stages pass each other;
:mod:`.errors`, :mod:`.op_tables`, :mod:`.graph_edits`, :mod:`.source_lines`,
:mod:`.random_state`, :mod:`.device_faults`), :mod:`.chains`, :mod:`.analysis`,
:mod:`.rewrites` (the passes) and :mod:`.runtime`.
:class:`Opset` names what the rewritten graph's consumer accepts (all ATen, or core ATen).
Each pass (:class:`AsStridedToViews`, :class:`ViewToReshape`, :class:`LayoutPinning`,
:class:`OverwrittenClones`, :class:`UnfoldCopies`) is a torch.fx pass returning a
:class:`RecordedPassResult`: the graph, whether it changed, and one :class:`Record` per node it
handled.

Only the errors are imported with the package; every other name on first use
(:mod:`.first_use`): the engine imports sympy, and :func:`as_strided_views` (the engine at run
time, kept out of torch.compile's graphs) Dynamo.
"""

from typing import TYPE_CHECKING, Any

from .errors import AsStridedRequestError, FxViewsError, UnsafeAsStridedError
from .first_use import import_on_first_use, names_with_first_use

if TYPE_CHECKING:
    from .chains.opsets import Opset
    from .geometry.concrete import Geometry
    from .rewrites.as_strided_to_views import AsStridedToViews
    from .rewrites.hygiene import drop_redundant_aliases, remove_dead_pure_nodes
    from .rewrites.overwritten_clones import OverwrittenClones
    from .rewrites.pass_base import RecordingPass
    from .rewrites.pinning import LAYOUT_KERNELS, LayoutPinning
    from .rewrites.unfold_copies import UnfoldCopies
    from .rewrites.view_to_reshape import ViewToReshape
    from .runtime.runtime_views import as_strided_views
    from .schema import METHODS, Record, RecordedPassResult, RecordKind

_ON_FIRST_USE = {
    "AsStridedToViews": ".rewrites.as_strided_to_views:AsStridedToViews",
    "Geometry": ".geometry.concrete:Geometry",
    "drop_redundant_aliases": ".rewrites.hygiene:drop_redundant_aliases",
    "remove_dead_pure_nodes": ".rewrites.hygiene:remove_dead_pure_nodes",
    "Opset": ".chains.opsets:Opset",
    "OverwrittenClones": ".rewrites.overwritten_clones:OverwrittenClones",
    "LAYOUT_KERNELS": ".rewrites.pinning:LAYOUT_KERNELS",
    "LayoutPinning": ".rewrites.pinning:LayoutPinning",
    "METHODS": ".schema:METHODS",
    "Record": ".schema:Record",
    "RecordedPassResult": ".schema:RecordedPassResult",
    "RecordingPass": ".rewrites.pass_base:RecordingPass",
    "RecordKind": ".schema:RecordKind",
    "as_strided_views": ".runtime.runtime_views:as_strided_views",
    "UnfoldCopies": ".rewrites.unfold_copies:UnfoldCopies",
    "ViewToReshape": ".rewrites.view_to_reshape:ViewToReshape",
}

__all__ = [
    "AsStridedRequestError",
    "AsStridedToViews",
    "FxViewsError",
    "Geometry",
    "LAYOUT_KERNELS",
    "LayoutPinning",
    "METHODS",
    "Opset",
    "OverwrittenClones",
    "Record",
    "RecordKind",
    "RecordedPassResult",
    "RecordingPass",
    "UnfoldCopies",
    "UnsafeAsStridedError",
    "ViewToReshape",
    "as_strided_views",
    "drop_redundant_aliases",
    "remove_dead_pure_nodes",
]


def __getattr__(name: str) -> Any:
    """Every public name but the errors, imported on first use."""
    return import_on_first_use(globals(), _ON_FIRST_USE, name)


def __dir__() -> list[str]:
    """The names bound now and those imported on first use (for ``dir()`` and completion)."""
    return names_with_first_use(globals(), _ON_FIRST_USE)
