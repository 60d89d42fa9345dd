"""Alias analysis of an aten graph: which nodes share storage, who writes it, who returns it.

Note [Alias analysis]
---------------------
Several steps need to know whether sharing memory through a node can be observed: the reshape
step (may a ``view`` become a copy?) and layout pinning (which buffer does a layout-bound node
read, and does the graph own it?) and the overwritten-clone step (is the source written before
its copy?). They share this one analysis:

1. Alias edges: a node is linked to every argument its schema says its result aliases (views,
   in-place ops and ``out=`` variants return an alias; ``getitem`` of an aliasing list too).
   Calls the analysis cannot read (not an aten overload) are assumed to alias and write every
   input: they are *opaque*, and so is each result ``getitem`` picks from one (a custom
   autograd.Function kept as one node may return a view of its input).
2. Alias classes: union-find over the edges (path halving), and one class for the caller's
   memory: every placeholder and ``get_attr`` (a closed-over tensor the graph holds by
   reference) joins it. The graph does not own those tensors, and nothing at trace time proves
   two of them disjoint: ``f(t, t)``, ``f(t, t.view(6))`` or an argument viewing a tensor ``fn``
   closes over pass the same memory twice, though each was traced as a tensor of its own. So
   a write to one input is a write to every input, and to every view of one. Memory the graph
   allocates (clones, factories, results of out-of-place ops) no caller can alias: it keeps
   classes of its own. Two nodes of different classes never share memory. Every step that
   moves a read past a write, or asks whether a copy would miss one (the overwritten clones,
   the reshape step, layout pinning, 0-d index gathers), reads the classes, so none of them
   takes two inputs to be apart.
3. Writes: every argument whose schema alias annotation ``is_write`` is a write to its class, at
   that node's position in the graph; a class keeps its writers in graph order.
4. Origins: following alias edges upwards from a node ends at the nodes that made its memory,
   nodes without alias edges: placeholders and ``get_attr`` (the caller's memory) or
   allocations (clones, factories, outputs of out-of-place ops).

Cost: one scan of the graph to build edges, classes and writes; queries walk only the edges
of the node they ask about.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import torch
import torch.fx

from ..compat.torch_internals import OpOverload, op_schema
from ..graph_edits import argument_nodes

#: An argument's place in a call: its position and its schema name (keyword form).
_Slot = tuple[int, str]


class _AliasClasses:
    """Union-find over graph nodes: two nodes share a class if they may share memory."""

    def __init__(self) -> None:
        self._parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(self, node: torch.fx.Node) -> torch.fx.Node:
        parent = self._parent.setdefault(node, node)
        while parent is not node:
            grandparent = self._parent.setdefault(parent, parent)
            self._parent[node] = grandparent  # path halving keeps later finds short
            node, parent = grandparent, self._parent.setdefault(grandparent, grandparent)
        return node

    def union(self, a: torch.fx.Node, b: torch.fx.Node) -> None:
        self._parent[self.find(a)] = self.find(b)


class AliasAnalysis:
    """Alias edges, classes, writes and outputs of one graph (see the Note).

    Example::

        >>> analysis = AliasAnalysis(make_fx(lambda x: x.clone().view(-1))(x).graph)
        >>> [n.name for n in analysis.origins(view_node)]
        ['clone']
    """

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.position = {node: i for i, node in enumerate(graph.nodes)}
        classes = _AliasClasses()
        self.aliased: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # node -> its sources
        self.derived: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # source -> its aliases
        writes: list[tuple[torch.fx.Node, torch.fx.Node]] = []  # (written node, writer)
        self.outputs: set[torch.fx.Node] = set()
        caller: torch.fx.Node | None = None  # the first of the caller's memory (step 2)
        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                caller = caller or node
                classes.union(node, caller)
            if node.op == "output":
                self.outputs.update(argument_nodes(node.args))
                continue
            sources = aliased_arguments(node)
            if sources:
                self.aliased[node] = sources
            for source in sources:
                classes.union(node, source)
                self.derived.setdefault(source, []).append(node)
            writes.extend((written, node) for written in written_arguments(node))
        # Classes are final only after the scan: group members and writes by final root.
        self.root = {node: classes.find(node) for node in self.position}
        self.members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for node, root in self.root.items():
            self.members.setdefault(root, []).append(node)
        # Every writer of each class, in graph order (the scan visits writers in that order).
        self.writers: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for written, writer in writes:
            writers = self.writers.setdefault(self.root[written], [])
            if not writers or writers[-1] is not writer:
                writers.append(writer)

    def why_observed(self, view: torch.fx.Node) -> str | None:
        """Why sharing memory through ``view`` is observable, or None if it is not.

        It is observable if its class is written after ``view`` (a copy would miss that write),
        or if ``view`` or an alias derived from it is a graph output while the rest of its class
        holds a graph input or another output (a copy would break that output's aliasing).
        """
        root = self.root[view]
        writers = self.writers.get(root)
        writer = writers[-1] if writers else None  # the last one
        if writer is not None and self.position[writer] > self.position[view]:
            return f"its memory is written afterwards, at {writer.name!r}"
        below = self.derived_closure(view)
        returned = min(below & self.outputs, key=self.position.__getitem__, default=None)
        if returned is None:
            return None
        for other in self.members[root]:
            if other in below:
                continue
            if other.op in ("placeholder", "get_attr"):
                return f"output {returned.name!r} aliases graph input {other.name!r} through it"
            if other in self.outputs:
                return f"output {returned.name!r} aliases output {other.name!r} through it"
        return None

    def written_between(
        self, node: torch.fx.Node, start: torch.fx.Node, end: torch.fx.Node
    ) -> torch.fx.Node | None:
        """The first node strictly between ``start`` and ``end`` that writes ``node``'s memory.

        Example::

            >>> analysis.written_between(y, clone, copy_)  # y.mul_(2) between the two
            mul_
        """
        low, high = self.position[start], self.position[end]
        for writer in self.writers.get(self.root[node], ()):
            if low < self.position[writer] < high:
                return writer
        return None

    def derived_closure(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        """``node`` and every alias derived from it (its side of the class if it became a copy)."""
        seen, stack = {node}, [node]
        while stack:
            for alias in self.derived.get(stack.pop(), ()):
                if alias not in seen:
                    seen.add(alias)
                    stack.append(alias)
        return seen

    def origins(self, node: torch.fx.Node) -> list[torch.fx.Node]:
        """The nodes that made ``node``'s memory, following alias edges upwards, in graph order.

        Each is a placeholder, a ``get_attr`` or an allocation (a node without alias edges).
        Opaque calls are passed through like any aliasing node: callers that need to know
        what shaped the memory check :func:`is_opaque` on :meth:`ancestry`.
        """
        return [n for n in self.ancestry(node) if n not in self.aliased]

    def ancestry(self, node: torch.fx.Node) -> list[torch.fx.Node]:
        """``node`` and every node it aliases, directly or through others, in graph order."""
        seen, stack = {node}, [node]
        while stack:
            for source in self.aliased.get(stack.pop(), ()):
                if source not in seen:
                    seen.add(source)
                    stack.append(source)
        return sorted(seen, key=self.position.__getitem__)


def is_opaque(node: torch.fx.Node) -> bool:
    """A call whose aliasing the analysis cannot read from an aten schema."""
    if node.op in ("call_method", "call_module"):
        return True
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and not isinstance(node.target, OpOverload)
    )


class _AliasAnnotations(NamedTuple):
    """What an op's schema says of aliasing: whether its result aliases an argument, and the
    slots of the arguments it may alias and of those it writes."""

    returns_alias: bool
    aliased: tuple[_Slot, ...]
    written: tuple[_Slot, ...]


@functools.cache
def _alias_annotations(op: OpOverload) -> _AliasAnnotations:
    """``op``'s annotations, read from its schema once per op (the scans ask per node,
    thousands of times)."""
    arguments = list(enumerate(op_schema(op).arguments))
    return _AliasAnnotations(
        returns_alias=any(r.alias_info is not None for r in op_schema(op).returns),
        aliased=tuple((i, a.name) for i, a in arguments if a.alias_info is not None),
        written=tuple((i, a.name) for i, a in arguments if a.alias_info and a.alias_info.is_write),
    )


def written_slots(op: OpOverload) -> tuple[_Slot, ...]:
    """The position and name of each argument ``op``'s schema says it writes (most ops: none),
    read once per op.

    Example::

        >>> written_slots(torch.ops.aten.add_.Tensor)
        ((0, 'self'),)
    """
    return _alias_annotations(op).written


def _argument_nodes_at(node: torch.fx.Node, slots: tuple[_Slot, ...]) -> list[torch.fx.Node]:
    """The nodes among ``node``'s arguments at ``slots``, positional or keyword alike."""
    found: list[torch.fx.Node] = []
    for position, name in slots:
        if position < len(node.args):
            found += argument_nodes(node.args[position])
        elif name in node.kwargs:
            found += argument_nodes(node.kwargs[name])
    return found


def aliased_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes whose memory ``node``'s result may share."""
    if is_opaque(node):
        return argument_nodes((node.args, node.kwargs))
    if node.target is operator.getitem:  # a result of an aliasing, or opaque, call aliases it
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and (_returns_alias(source) or is_opaque(source)):
            return [source]
        return []
    if not _returns_alias(node):
        return []
    return _argument_nodes_at(node, _alias_annotations(node.target).aliased)


def _returns_alias(node: torch.fx.Node) -> bool:
    return isinstance(node.target, OpOverload) and _alias_annotations(node.target).returns_alias


def written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes ``node`` may write to: schema ``!`` annotations, or all if opaque."""
    if is_opaque(node):
        return argument_nodes((node.args, node.kwargs))
    if not isinstance(node.target, OpOverload):
        return []  # placeholders, get_attr, getitem: no writes
    return _argument_nodes_at(node, _alias_annotations(node.target).written)
