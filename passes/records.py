"""The per-node record the pass keeps for every as_strided node it sees."""
from __future__ import annotations

from dataclasses import dataclass

#: How a node was handled. "kept" means the as_strided node is still in the graph.
METHODS = ("provenance", "synthesized", "identity", "scatter", "reshape", "kept")


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
