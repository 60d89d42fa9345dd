"""Records: what a pass did to each node it handled, returned in the pass's result.

Every recording pass (:class:`~.as_strided_to_views.AsStridedToViews`,
:class:`~.view_to_reshape.ViewToReshape`, :class:`~.pinning.LayoutPinning`,
:class:`~.overwritten_clones.OverwrittenClones`, :class:`~.unfold_copies.UnfoldCopies`) returns
a :class:`RecordedPassResult`: torch.fx's ``PassResult`` plus one :class:`Record` per node it
handled. The pass keeps no state between calls.

Example::

    >>> result = AsStridedToViews()(gm)
    >>> [(r.kind, r.method) for r in result.records]
    [(<RecordKind.AS_STRIDED: 'as_strided'>, 'provenance')]
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.fx

from .graph_edits import collector_paused
from .torch_internals import PassBase, PassResult

#: How a node was handled. "kept" means the node is still in the graph as it was (for a
#: layout-bound node: its layout could not be pinned); "pinned" that a layout-bound node now
#: gets its traced layout at run time; "reclone" that a clone overwritten by a ``copy_`` now
#: clones the ``copy_``'s source; "copied" that a model's own ``unfold`` is now copies;
#: "runtime" that a call deciding view or copy by layout (``reshape``, ``contiguous``) is the
#: user's call, deciding when the graph runs, not the view or copy its trace decided.
METHODS = (
    "provenance",
    "synthesized",
    "identity",
    "scatter",
    "rebased",
    "reshape",
    "pinned",
    "reclone",
    "copied",
    "runtime",
    "kept",
)


class RecordKind(enum.Enum):
    """The kind of node a record is about, which is also the pass that wrote it.

    The value is the kind's name in printouts.
    """

    #: An as_strided-family node (``as_strided``, ``as_strided_``, ``as_strided_copy``,
    #: ``as_strided_scatter``): AsStridedToViews.
    AS_STRIDED = "as_strided"
    #: A view that bakes in its input's layout (``view``, ``_unsafe_view``, ``_reshape_alias``,
    #: ``view_as_complex``): ViewToReshape; and a call that decides view or copy by layout,
    #: recorded as itself by fxviews' tracer (method "runtime").
    VIEW = "view"
    #: Any node that still depends on a layout seen at trace time: LayoutPinning.
    LAYOUT_BOUND = "layout-bound node"
    #: A ``clone`` a ``copy_`` overwrites before anything reads it: OverwrittenClones.
    OVERWRITTEN_CLONE = "overwritten clone"
    #: A model's own ``unfold``, written as copies where the consumer lacks it: UnfoldCopies.
    UNFOLD = "unfold"


@dataclass(frozen=True)
class Record:
    """What happened to one node: its description before and after, the method, and why.

    ``source`` is the user's source line that made the node (``file:line, in function``),
    where the trace recorded one (see ``source_lines.py``).

    Example::

        Record(node="as_strided", before="as_strided(clone_1, [6], [1], 0)",
               after="select(clone_1, 0, 0)", method="provenance",
               reason="replays select on a twin base", kind=RecordKind.AS_STRIDED)
    """

    node: str
    before: str
    after: str
    method: str
    reason: str
    kind: RecordKind = field(kw_only=True)
    source: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {METHODS}")
        if not isinstance(self.kind, RecordKind):
            raise TypeError(f"kind must be a RecordKind, got {self.kind!r}")


class RecordedPassResult(PassResult):
    """torch.fx's ``PassResult(graph_module, modified)`` with the pass's ``records``.

    It unpacks into the two fields of ``PassResult``, so a ``PassManager`` runs recording
    passes like any other.
    """

    records: list[Record]

    def __new__(
        cls, graph_module: torch.fx.GraphModule, modified: bool, records: Sequence[Record] = ()
    ) -> RecordedPassResult:
        result = super().__new__(cls, graph_module, modified)
        assert isinstance(result, RecordedPassResult)  # PassResult.__new__ is typed too loosely
        result.records = list(records)
        return result


class RecordingPass(PassBase):
    """A torch.fx pass whose result carries one :class:`Record` per node it handled.

    ``recompile=False`` leaves ``graph_module.recompile()`` to a caller that runs several passes
    and recompiles once, after the last.

    Example::

        >>> result = SomeRecordingPass(recompile=False)(gm); gm.recompile()
        >>> [r.method for r in result.records]
    """

    def __init__(self, recompile: bool = True) -> None:
        super().__init__()
        self.recompile = recompile

    def __call__(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        # Passes build many graph objects and free few: see Note [Graph edits and the cyclic
        # collector].
        with collector_paused():
            result = super().__call__(graph_module)
        if not isinstance(result, RecordedPassResult):  # a subclass's call broke the contract
            raise TypeError(f"{type(self).__name__}.call must return a RecordedPassResult")
        return result

    def finished(
        self, graph_module: torch.fx.GraphModule, records: list[Record]
    ) -> RecordedPassResult:
        """The result of a pass that rewrote the nodes ``records`` describe: the graph is linted
        and (if asked) recompiled where any was not kept."""
        modified = any(r.method != "kept" for r in records)
        if modified:
            graph_module.graph.lint()
            if self.recompile:
                graph_module.recompile()
        return RecordedPassResult(graph_module, modified, records)

    @abc.abstractmethod
    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        """Run the pass on ``graph_module``: its result, with one record per node handled."""
