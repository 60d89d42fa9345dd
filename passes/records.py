"""The per-node record the pass keeps for every as_strided node it sees."""

from __future__ import annotations

from dataclasses import dataclass

from .torch_internals import PassBase

#: How a node was handled. "kept" means the node is still in the graph as it was (for a
#: layout-bound node: its layout could not be pinned); "pinned" that a layout-bound node now
#: gets its traced layout at run time.
METHODS = ("provenance", "synthesized", "identity", "scatter", "reshape", "pinned", "kept")


@dataclass(frozen=True)
class Record:
    """What happened to one as_strided node.

    Example::

        Record(node="as_strided", before="as_strided(clone_1, [6], [1], 0)",
               after="select(clone_1, 0, 0)", method="provenance",
               reason="replays select on a twin base")
    """

    node: str
    before: str
    after: str
    method: str
    reason: str

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {METHODS}")


class RecordingPass(PassBase):
    """A torch.fx pass that keeps one :class:`Record` per node it handles, in ``records``.

    ``recompile=False`` leaves ``graph_module.recompile()`` to a caller that runs several passes
    and recompiles once, after the last.

    Example::

        >>> engine = SomeRecordingPass(recompile=False)
        >>> engine(gm); gm.recompile()
        >>> [r.method for r in engine.records]
    """

    def __init__(self, recompile: bool = True) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.recompile = recompile
