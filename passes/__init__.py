"""fxviews.passes: the engine. Graph in, graph out; imports nothing from the front door.

This directory sits at the top of the repository; ``fxviews/passes`` is a symbolic link to it,
so it is the package ``fxviews.passes`` installed, in a source tree and for type checkers.
:class:`Opset` names what the rewritten graph's consumer accepts (all ATen, or core ATen).
Each pass (:class:`AsStridedToViews`, :class:`ViewToReshape`, :class:`LayoutPinning`,
:class:`OverwrittenClones`, :class:`UnfoldCopies`) is a torch.fx pass returning a
:class:`RecordedPassResult`: the graph, whether it changed, and one :class:`Record` per node it
handled.
"""

from .as_strided_to_views import AsStridedToViews
from .errors import FxViewsError, UnsafeAsStridedError
from .geometry import Geometry
from .hygiene import drop_redundant_aliases, remove_dead_pure_nodes
from .opsets import Opset
from .overwritten_clones import OverwrittenClones
from .pinning import LAYOUT_KERNELS, LayoutPinning
from .records import METHODS, Record, RecordedPassResult, RecordingPass, RecordKind
from .runtime_views import AsStridedRequestError, as_strided_views
from .unfold_copies import UnfoldCopies
from .view_to_reshape import ViewToReshape

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
