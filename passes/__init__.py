"""fxviews.passes: the engine. Graph in, graph out; imports nothing from the front door.

This directory sits at the top of the repository; ``fxviews/passes`` is a symbolic link to it,
so it is the package ``fxviews.passes`` installed, in a source tree and for type checkers.
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
    from .as_strided_to_views import AsStridedToViews
    from .geometry import Geometry
    from .hygiene import drop_redundant_aliases, remove_dead_pure_nodes
    from .opsets import Opset
    from .overwritten_clones import OverwrittenClones
    from .pinning import LAYOUT_KERNELS, LayoutPinning
    from .records import METHODS, Record, RecordedPassResult, RecordingPass, RecordKind
    from .runtime_views import as_strided_views
    from .unfold_copies import UnfoldCopies
    from .view_to_reshape import ViewToReshape

_ON_FIRST_USE = {
    "AsStridedToViews": ".as_strided_to_views:AsStridedToViews",
    "Geometry": ".geometry:Geometry",
    "drop_redundant_aliases": ".hygiene:drop_redundant_aliases",
    "remove_dead_pure_nodes": ".hygiene:remove_dead_pure_nodes",
    "Opset": ".opsets:Opset",
    "OverwrittenClones": ".overwritten_clones:OverwrittenClones",
    "LAYOUT_KERNELS": ".pinning:LAYOUT_KERNELS",
    "LayoutPinning": ".pinning:LayoutPinning",
    "METHODS": ".records:METHODS",
    "Record": ".records:Record",
    "RecordedPassResult": ".records:RecordedPassResult",
    "RecordingPass": ".records:RecordingPass",
    "RecordKind": ".records:RecordKind",
    "as_strided_views": ".runtime_views:as_strided_views",
    "UnfoldCopies": ".unfold_copies:UnfoldCopies",
    "ViewToReshape": ".view_to_reshape:ViewToReshape",
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
