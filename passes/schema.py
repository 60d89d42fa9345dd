"""What the pipeline's stages pass each other: every meta key and record type, in one place.

Stages hand each other graphs, and what one stage knows of a graph or node that the next needs
travels in ``GraphModule.meta`` and ``Node.meta`` under the keys below, each with one meaning
and one writer (as AOTAutograd's ``schemas.py`` holds what its stages pass). A key is named
here and imported from here only (``tests/test_package_shape.py`` checks); the value's type is
the one its comment gives. The records each pass returns for the nodes it handled
(:class:`Record` in a :class:`RecordedPassResult`) are here too.

Example::

    >>> gm = fxviews.trace(lambda x: x.t(), torch.ones(2, 3))
    >>> gm.meta[TRACED_WITH]
    'fake mode'
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.fx

from .compat.torch_internals import PassResult

__all__ = [
    "AUTOGRAD_KEPT",
    "DECOMPOSITION_OF",
    "DYNAMO_LAYOUT_READS",
    "FAKE_MODE",
    "GATHER_OF_INDEX",
    "LAYOUT_DECISION",
    "LAYOUT_DOUBT",
    "LAYOUT_FACT",
    "LAYOUT_READ",
    "MADE_FOR",
    "METHODS",
    "OFFSET_READ",
    "REAL_LAYOUTS",
    "RECORDED",
    "TRACED_WITH",
    "LayoutFact",
    "Record",
    "RecordKind",
    "RecordedPassResult",
]

# --- GraphModule.meta: how a graph was traced (written by fxviews' tracer) --------------------

#: How the tracer traced the graph: :data:`FAKE_MODE`, :data:`RECORDED`, or ``"real mode
#: (fake mode failed: ...)"``; ``fxviews.rewrite`` carries it into its result and printout.
TRACED_WITH = "fxviews_traced_with"
#: :data:`TRACED_WITH` of a graph traced in fake mode (``fxviews.trace``).
FAKE_MODE = "fake mode"
#: :data:`TRACED_WITH` of a graph recorded on one real sample (``fxviews.transform``).
RECORDED = "recorded on a sample"
#: True when every node's ``meta["val"]`` holds the layout a real kernel produced (a
#: recording), so the layout check has nothing to check.
REAL_LAYOUTS = "fxviews_real_layouts"
#: What the trace kept of the function's autograd structure: a tuple of lines (Note [What
#: autograd sees is part of the trace] in fxviews/tracing/autograd.py).
AUTOGRAD_KEPT = "fxviews_autograd"

# --- Node.meta written while tracing (fxviews/tracing), read by the stages after ----------------

#: On a gather made for a 0-d tensor index: the user's line that indexed (str).
GATHER_OF_INDEX = "fxviews_gather_of_index"
#: On a decomposition node a kept layout-deciding call replaces: that call's node name (str);
#: erased when unused.
DECOMPOSITION_OF = "fxviews_decomposition_of"
#: On a layout-deciding call kept as its aten op: what the traced layout gave, as (kind, op),
#: e.g. ``("a view of its input", "view(x, [32])")`` (Note [Layout decisions at run time]).
LAYOUT_DECISION = "fxviews_layout_decision"
#: True on a node whose tensor's strides, contiguity or storage offset Python read while it
#: was recorded: the graph depends on that layout (state/layouts.py guards it).
LAYOUT_READ = "fxviews_layout_read"
#: True on a node whose tensor's ``storage_offset()`` Python read while it was recorded.
OFFSET_READ = "fxviews_offset_read"

# --- Node.meta written under torch.compile (fxviews/consumers/compile) --------------------------

#: The layout reads Dynamo answered for the node's tensor: a list of
#: ``"y.stride() at file.py:3: <code>"`` strings (consumers/compile/layout_reads.py).
DYNAMO_LAYOUT_READS = "fxviews_dynamo_layout_reads"

# --- Node.meta of the engine's layout check and rewrites (fxviews/passes) -----------------------

#: Set by a caller of the layout check on a node whose recorded layout is not a kernel's
#: result to check: a :class:`LayoutFact`.
LAYOUT_FACT = "fxviews_layout_fact"
#: On an as_strided-family node whose traced input layout is not eager's, or could not be
#: checked: why, in words (str).
LAYOUT_DOUBT = "fxviews_layout_doubt"
#: On every node AsStridedToViews emits: the name of the as_strided it replaces (str).
MADE_FOR = "fxviews_made_for"


@dataclass(frozen=True)
class LayoutFact:
    """What the caller of the check knows of a node's recorded layout: it is a fact, as a graph
    input's is (``trusted``); it is the layout of the node ``same_as``, which the node passes
    through (a wrapper around the same tensor); or nobody can vouch for it (``unknown``, why).

    Example::

        >>> node.meta[LAYOUT_FACT] = LayoutFact(unknown="vmap's own layout of a batched value")
    """

    trusted: bool = False
    same_as: torch.fx.Node | None = None
    unknown: str | None = None


# --- Records: what a pass did to each node it handled -------------------------------------------

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
