"""ViewToReshape: turn ``view`` into ``reshape`` where nobody can tell the two apart.

Note [ViewToReshape]
--------------------
``aten.view`` (and ``_unsafe_view``, ``_reshape_alias``) bakes in that its input's layout can be
viewed at the requested sizes. A graph traced on contiguous examples holds such views; under
``vmap`` with the batch dim physically between two merged dims, or on a non-contiguous input,
they raise "view size is not compatible with input tensor's size and stride". ``reshape`` gives
the same values on every layout (a view where one exists, a copy otherwise); it differs from
``view`` only in whether the result shares memory with its input. Likewise ``view_as_complex``
needs a last dim of stride 1, which a contiguous ``clone`` of its input provides.

So a view is rewritten exactly where sharing memory is not observable. The analysis:

1. Alias classes: union every node with the arguments its schema says it aliases (views,
   in-place ops and ``out=`` variants return an alias; ``getitem`` of an aliasing list too).
   Calls the analysis cannot read (not an aten overload) are assumed to alias and write
   every input.
2. Writes: every argument whose schema alias annotation ``is_write`` is a write to its class,
   at that node's position in the graph.
3. A view node ``v`` at position ``p`` is *observed*, and kept, if
   - its class is written at a position after ``p`` (a copy would miss that write, or the
     write would miss the copy's readers), or
   - ``v`` or an alias derived from it is a graph output while the rest of its class holds a
     graph input or another output (a copy would break that output's aliasing).
   Otherwise ``view``/``_unsafe_view``/``_reshape_alias`` become ``reshape`` and
   ``view_as_complex(x)`` becomes ``view_as_complex(clone(x, memory_format=contiguous))``.

The classes are computed once, before any rewrite. Rewriting only removes sharing, so a class
can only shrink and every decision made on the original classes stays conservative.
``view_as_real`` accepts any layout of its complex input and is left alone.

Cost: one scan of the graph (union-find with path halving) to build the classes and writes,
then per view a walk over the aliases derived from it.
"""
from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx

from .graph_edits import OutputDeferringReplacer, argument_nodes, arguments_by_name
from .records import Record
from .torch_internals import (
    OpOverload,
    PassBase,
    PassResult,
    SchemaArgument,
    op_schema,
    reshape_alias,
    unsafe_view,
)
from .view_chain import GraphEmitter

aten = torch.ops.aten

#: View ops whose only layout assumption is that the input is viewable at the new sizes.
RESHAPEABLE = (aten.view.default, unsafe_view, reshape_alias)
#: View ops that need their input's last dim to have stride 1.
NEEDS_UNIT_LAST_STRIDE = (aten.view_as_complex.default,)


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


class _AliasAnalysis:
    """Alias classes, writes, derived aliases and outputs of one graph (see the Note)."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.position = {node: i for i, node in enumerate(graph.nodes)}
        classes = _AliasClasses()
        self.derived: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # source -> its aliases
        writes: list[tuple[torch.fx.Node, torch.fx.Node]] = []  # (written node, writer)
        self.outputs: set[torch.fx.Node] = set()
        for node in graph.nodes:
            if node.op == "output":
                self.outputs.update(argument_nodes(node.args))
                continue
            for source in _aliased_arguments(node):
                classes.union(node, source)
                self.derived.setdefault(source, []).append(node)
            writes.extend((written, node) for written in _written_arguments(node))
        # Classes are final only after the scan: group members and writes by final root.
        self.root = {node: classes.find(node) for node in self.position}
        self.members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for node, root in self.root.items():
            self.members.setdefault(root, []).append(node)
        self.last_writer: dict[torch.fx.Node, torch.fx.Node] = {}
        for written, writer in writes:
            root = self.root[written]
            last = self.last_writer.get(root)
            if last is None or self.position[writer] > self.position[last]:
                self.last_writer[root] = writer

    def why_observed(self, view: torch.fx.Node) -> str | None:
        """Why sharing memory through ``view`` is observable, or None if it is not."""
        root = self.root[view]
        writer = self.last_writer.get(root)
        if writer is not None and self.position[writer] > self.position[view]:
            return f"its memory is written afterwards, at {writer.name!r}"
        below = self._derived_closure(view)
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

    def _derived_closure(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        """``node`` and every alias derived from it (its side of the class if it became a copy)."""
        seen, stack = {node}, [node]
        while stack:
            for alias in self.derived.get(stack.pop(), ()):
                if alias not in seen:
                    seen.add(alias)
                    stack.append(alias)
        return seen


def _is_opaque(node: torch.fx.Node) -> bool:
    """A call whose aliasing the analysis cannot read from an aten schema."""
    if node.op in ("call_method", "call_module"):
        return True
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and not isinstance(node.target, OpOverload)
    )


def _bound_arguments(node: torch.fx.Node) -> list[tuple[SchemaArgument, object]]:
    """(schema argument, value) pairs of an aten call, positional and keyword alike."""
    by_name = arguments_by_name(node, node.target)
    return [(a, by_name[a.name]) for a in op_schema(node.target).arguments if a.name in by_name]


def _aliased_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes whose memory ``node``'s result may share."""
    if _is_opaque(node):
        return argument_nodes((node.args, node.kwargs))
    if node.target is operator.getitem:
        source = node.args[0]
        return [source] if isinstance(source, torch.fx.Node) and _returns_alias(source) else []
    if not _returns_alias(node):
        return []
    return [
        value
        for argument, value in _bound_arguments(node)
        if argument.alias_info is not None
        for value in argument_nodes(value)
    ]


def _returns_alias(node: torch.fx.Node) -> bool:
    if not isinstance(node.target, OpOverload):
        return False
    return any(r.alias_info is not None for r in op_schema(node.target).returns)


def _written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes ``node`` may write to: schema ``!`` annotations, or all if opaque."""
    if _is_opaque(node):
        return argument_nodes((node.args, node.kwargs))
    if not isinstance(node.target, OpOverload):
        return []  # placeholders, get_attr, getitem: no writes
    return [
        value
        for argument, value in _bound_arguments(node)
        if argument.alias_info is not None and argument.alias_info.is_write
        for value in argument_nodes(value)
    ]


class ViewToReshape(PassBase):
    """A torch.fx pass making layout-bound views layout-portable (mutates its input).

    After a call, ``records`` holds one :class:`Record` per ``view``/``_unsafe_view``/
    ``_reshape_alias``/``view_as_complex`` node seen: method ``"reshape"`` if rewritten,
    ``"kept"`` with the reason its aliasing is observable otherwise.

    Example::

        >>> gm = make_fx(lambda x: x.clone().view(-1))(torch.randn(2, 3))
        >>> engine = ViewToReshape()
        >>> engine(gm).modified
        True
        >>> engine.records[0].after
        'reshape(clone, [-1])'
    """

    def __init__(self, recompile: bool = True) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.recompile = recompile  # False: the caller recompiles after its last pass

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        self.records = []
        nodes = [n for n in graph.nodes if _is_target(n)]
        if not nodes:
            return PassResult(graph_module, False)
        analysis = _AliasAnalysis(graph)
        replacer = OutputDeferringReplacer(graph)
        for node in nodes:
            self.records.append(_handle(graph, node, analysis.why_observed(node), replacer))
        for replaced in replacer.finish():
            graph.erase_node(replaced)
        modified = any(r.method == "reshape" for r in self.records)
        if modified:
            graph.lint()
            if self.recompile:
                graph_module.recompile()
        return PassResult(graph_module, modified)


def _is_target(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (*RESHAPEABLE, *NEEDS_UNIT_LAST_STRIDE)


def _describe(node: torch.fx.Node) -> str:
    args = ", ".join(a.name if isinstance(a, torch.fx.Node) else str(a) for a in node.args)
    return f"{node.target.__name__.split('.')[0]}({args})"


def _handle(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    observed: str | None,
    replacer: OutputDeferringReplacer,
) -> Record:
    """Rewrite ``node`` unless its aliasing is ``observed``; the record says which and why."""
    before = _describe(node)
    if observed is not None:
        return Record(node.name, before, "", "kept", f"aliasing is observable: {observed}")
    source = node.args[0]
    with graph.inserting_before(node):
        emit = _emitter(graph, node)
        if node.target in RESHAPEABLE:
            new = emit(aten.reshape.default, source, node.args[1])
            after = f"reshape({source.name}, {node.args[1]})"
            reason = "no alias observed: reshape gives the same values on any layout"
        else:
            contiguous = emit(aten.clone.default, source, memory_format=torch.contiguous_format)
            new = emit(node.target, contiguous)
            after = f"{before[:-1]}.clone(memory_format=torch.contiguous_format))"
            reason = "no alias observed: a contiguous copy gives the last dim stride 1"
    replacer.replace(node, new)
    if not node.users:  # else the output still holds it: erased after finish()
        graph.erase_node(node)
    return Record(node.name, before, after, "reshape", reason)


def _emitter(graph: torch.fx.Graph, like: torch.fx.Node) -> Callable[..., torch.fx.Node]:
    """GraphEmitter (fills ``meta['val']``) when the source has metadata, else bare nodes."""
    if "val" in like.args[0].meta:
        return GraphEmitter(graph, like)
    return lambda op, *args, **kwargs: graph.call_function(op, args, kwargs)
