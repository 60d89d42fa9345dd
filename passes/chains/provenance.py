"""Provenance (the first of three ideas): find the user's own view chain for an as_strided.

Forward AD propagates a base's new tangent to a view with ``tangent.as_strided(view geometry)``,
while the primal side of the same graph still holds the view the user wrote, e.g.
``select(clone, 0, 0)`` on a primal base whose geometry equals the tangent's. Replaying that
chain on the as_strided input gives the same geometry with the user's ops.

:class:`ViewIndex` walks the graph once and indexes every view chain (up to ``MAX_DEPTH`` steps
back from each view node) under ``(base geometry, view geometry)``, so each lookup is O(1) and
the index is linear in the graph's size.
"""

from __future__ import annotations

import torch
import torch.fx

from ..geometry.concrete import Geometry
from ..geometry.symbolic import ShapeFacts, SymbolicGeometry, Unproven
from .chain import ViewChain, replayable_step

#: How many view steps back from a view node the index looks for a base.
MAX_DEPTH = 8


def node_geometry(node: object) -> Geometry | None:
    """The trace-time geometry of a node's tensor value, if it has a concrete one."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        geometry = Geometry.of(val)
    except RuntimeError:  # e.g. sparse or nested tensors have no strides
        return None
    values = (*geometry.sizes, *geometry.strides, geometry.offset)
    return geometry if all(type(v) is int for v in values) else None


class ViewIndex:
    """Index of the graph's view chains by (base geometry key, view geometry key).

    Example::

        >>> index = ViewIndex(gm.graph)
        >>> index.lookup(Geometry((2, 6), (6, 1), 0), Geometry((6,), (1,), 0))
        (ViewStep(op=aten.select.int, args=(0, 0)),)
    """

    def __init__(self, graph: torch.fx.Graph, facts: ShapeFacts | None = None) -> None:
        self._chains: dict[tuple, ViewChain] = {}
        # With symbolic shapes, chains are also indexed by their exact symbolic geometries.
        self.facts = facts
        # For every view node: the (ancestor, steps from that ancestor) pairs, nearest first.
        trails: dict[torch.fx.Node, list[tuple[torch.fx.Node, ViewChain]]] = {}
        self.steps_taken = 0
        for node in graph.nodes:
            step = replayable_step(node)
            if step is None:
                continue
            parent = node.args[0]
            if not isinstance(parent, torch.fx.Node):
                continue
            trail: list[tuple[torch.fx.Node, ViewChain]] = [(parent, (step,))]
            for ancestor, chain in trails.get(parent, [])[: MAX_DEPTH - 1]:
                trail.append((ancestor, (*chain, step)))
            trails[node] = trail
            self.steps_taken += len(trail)
            self._index(node, trail)

    def _index(self, node: torch.fx.Node, trail: list[tuple[torch.fx.Node, ViewChain]]) -> None:
        view = self._key(node)
        if view is None:
            return
        for ancestor, chain in trail:
            base = self._key(ancestor)
            if base is not None:
                self._chains.setdefault((base, view), chain)

    def _key(self, node: torch.fx.Node) -> tuple | None:
        geometry = node_geometry(node)
        if geometry is not None:
            return geometry.key()
        val = node.meta.get("val")
        if self.facts is None or not isinstance(val, torch.Tensor):
            return None
        try:
            return SymbolicGeometry.of(val, self.facts).key()
        except (Unproven, RuntimeError):  # another shape environment; a layout without strides
            return None

    def lookup(self, source: Geometry, target: Geometry) -> ViewChain | None:
        """The first-indexed chain from a base like ``source`` to a view like ``target``."""
        return self._chains.get((source.key(), target.key()))

    def lookup_symbolic(
        self, source: SymbolicGeometry, target: SymbolicGeometry
    ) -> ViewChain | None:
        """The first-indexed chain from a base of exactly ``source``'s symbolic geometry to
        one of ``target``'s (to be proven for every size by the caller)."""
        return self._chains.get((source.key(), target.key()))


__all__ = ["MAX_DEPTH", "ViewIndex", "node_geometry"]
