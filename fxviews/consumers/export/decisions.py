"""Layout decisions a ``torch.export`` program already made: made right where the program can
decide them when it runs, refused where it cannot.

Note [Layout decisions in exported programs]
--------------------------------------------
``torch.export``'s training IR keeps ``reshape``, ``flatten``, ``reshape_as``, ``ravel``,
``contiguous`` and ``to`` as the user called them, but lowering it (``run_decompositions``, which
``fxviews.rewrite`` runs on it, and every consumer after it) decomposes each into what it decided
on the example's layout: a ``view`` or a copy, and for a write through the result a functional
update of the input the view aliased (pytorch #186381 is the same loss one step earlier: a
``contiguous()`` that was a no-op on the example never reaches the program). Each decomposed node
names the training node it came from (``meta["from_node"]``), so :func:`settle_decisions` finds
every decision and asks what the program does with it (the alias analysis of Note [Alias
analysis], on the training IR where there is one):

1. **Not observable** (nothing written through either side, not returned aliasing an input): a
   view and a copy give the same values; the reshape step makes a decomposed ``view`` a
   ``reshape`` (Note [ViewToReshape]), so the program runs on every layout.
2. **Observable through the outputs only** (the result is returned and aliases an input): the
   decision is put back as the aten op itself, ``reshape`` (or ``contiguous``, ``ravel``, ``to``)
   of the decomposition's input, which decides view or copy on each call's layout as eager does.
   Recorded with method ``"runtime"``.
3. **Observable through a write** (the result or its input is written while the other side is
   read afterwards or is the caller's): lowering turned the example's decision into the program's
   writes to its inputs, which no later rewrite can take back. :class:`LayoutBoundProgram` is
   raised, naming the node and the user's source line.

A program given already lowered has no training IR: its decisions are found by their nodes'
provenance; one whose result is returned while its input is the caller's is put back (a
``contiguous`` in the memory format its ``clone`` kept; ``to`` is not found, its format being
lost); one whose view of an input the program then writes into that input is refused. Writes
into the program's own intermediates, and into an input through a decision the example made a
copy, leave nothing a lowered program keeps: pass the program ``torch.export.export`` returns.
A decision that left no node at all (a no-op on the example, dropped before the training IR)
cannot be found anywhere.

Only for the aten opset: a core-ATen program goes to an edge runtime, whose tensors have one
layout, and has no ``reshape`` or ``contiguous`` to put back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.fx

from fxviews.passes import FxViewsError, Record, RecordKind
from fxviews.passes.analysis.aliasing import AliasAnalysis, written_arguments
from fxviews.passes.chains.emission import GraphEmitter
from fxviews.passes.compat.torch_internals import LazyGraphModule, OpOverload, storage_identity
from fxviews.passes.graph_edits import copy_graph, describe_call
from fxviews.passes.source_lines import source_line

__all__ = ["Decision", "LayoutBoundProgram", "settle_decisions", "training_decisions"]

aten = torch.ops.aten

#: Ops of the training IR that decide view or copy by their input's layout (``to`` too, where
#: it is given a memory format): the reshape family is put back as ``reshape`` to the result's
#: sizes.
_RESHAPES = frozenset({aten.reshape.default, aten.reshape_as.default, aten.flatten.using_ints})
_DECIDING = frozenset({*_RESHAPES, aten.ravel.default, aten.contiguous.default})


class LayoutBoundProgram(FxViewsError):
    """An exported program made a layout decision on its example that its writes depend on: it
    is right only for inputs laid out like the example (Note [Layout decisions in exported
    programs])."""


def _deciding(target: Any) -> bool:
    if target in _DECIDING:
        return True
    # ``to`` decides only with a memory format; its training node then carries one.
    return isinstance(target, OpOverload) and target.overloadpacket is aten.to


def _decides(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not _deciding(node.target):
        return False
    if isinstance(node.target, OpOverload) and node.target.overloadpacket is aten.to:
        return node.kwargs.get("memory_format") not in (None, torch.preserve_format)
    return True


class Decision(NamedTuple):
    """A training-IR call deciding view or copy by layout: its op, keyword arguments (None where
    only its provenance is known) and the user's source line."""

    target: Any
    kwargs: dict[str, Any] | None
    source: str | None


def training_decisions(graph: torch.fx.Graph) -> dict[str, Decision]:
    """The deciding nodes of a training-IR graph whose choice the program's outputs observe
    (to be made right), by name; raises :class:`LayoutBoundProgram` for one a write observes.

    Example::

        >>> training_decisions(torch.export.export(M(), (x,)).graph)  # return x.reshape(-1)
        {'reshape': Decision(target=aten.reshape.default, kwargs={}, source='m.py:3, in forward')}
    """
    analysis = AliasAnalysis(graph)
    returned = {}
    for node in graph.nodes:
        if not _decides(node):
            continue
        written = _seen_write(node, analysis)
        if written is not None:
            raise _refusal(node, written)
        if analysis.why_observed(node) is not None:
            returned[node.name] = Decision(node.target, dict(node.kwargs), source_line(node))
    return returned


def _seen_write(node: torch.fx.Node, analysis: AliasAnalysis) -> str | None:
    """A write after ``node`` to one side of its memory (its result and what derives from it,
    or the rest) that the other side sees: read afterwards, returned, or the caller's."""
    below = analysis.derived_closure(node)
    above = set(analysis.members[analysis.root[node]]) - below
    for writer in analysis.writers.get(analysis.root[node], ()):
        if analysis.position[writer] <= analysis.position[node]:
            continue
        written = set(written_arguments(writer))
        for side, other in ((below, above), (above, below)):
            if written & side and _seen_after(other, writer, analysis):
                return writer.name
    return None


def _seen_after(nodes: set[torch.fx.Node], writer: torch.fx.Node, analysis: AliasAnalysis) -> bool:
    after = analysis.position[writer]
    return any(
        node.op in ("placeholder", "get_attr")
        or node in analysis.outputs
        or any(analysis.position[user] > after for user in node.users)
        for node in nodes
    )


def _refusal(node: torch.fx.Node, writer: str) -> LayoutBoundProgram:
    line = source_line(node)
    where = f" ({line})" if line else ""
    return LayoutBoundProgram(
        f"the exported program's {describe_call(node.target, node.args)} node {node.name!r}"
        f"{where} decides view or copy by its input's layout, and {writer!r} writes through "
        f"one side of it while the other is read afterwards or belongs to the caller: lowering "
        f"the program bakes in the example's choice, so on an input of another layout it "
        f"would write where eager does not (or miss a write eager makes). Make the choice "
        f"explicit in the model (.view() for an alias, .clone() for a copy) and export again."
    )


def _root_name(node: torch.fx.Node) -> tuple[str, str] | None:
    """The (name, target) of the training-IR node ``node`` was decomposed from, if recorded."""
    sources = node.meta.get("from_node") or []
    source = sources[0] if sources else None
    while source is not None and getattr(source, "from_node", None):
        source = source.from_node[0]
    return None if source is None else (source.name, str(source.target))


def _groups(graph: torch.fx.Graph, names: Any = None) -> dict[str, list[torch.fx.Node]]:
    """The lowered program's nodes by the training node they were decomposed from: the nodes
    named ``names``, or (None) every one whose op decides by layout, but ``to``, whose memory
    format a lowered program does not keep."""
    targets = {str(target) for target in _DECIDING}
    groups: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        root = _root_name(node) if node.op == "call_function" else None
        if root is None:
            continue
        if (root[0] in names) if names is not None else (root[1] in targets):
            groups.setdefault(root[0], []).append(node)
    return groups


def _result_of(group: list[torch.fx.Node]) -> torch.fx.Node | None:
    members = set(group)
    leaving = [n for n in group if any(user not in members for user in n.users)]
    return leaving[-1] if len(leaving) == 1 else None


def _input_of(group: list[torch.fx.Node]) -> torch.fx.Node | None:
    members = set(group)
    sources = {arg for node in group for arg in node.all_input_nodes if arg not in members}
    return sources.pop() if len(sources) == 1 else None


def settle_decisions(
    gm: torch.fx.GraphModule,
    returned: dict[str, Decision] | None,
    mutated: dict[str, str],
) -> tuple[torch.fx.GraphModule, list[Record]]:
    """``gm`` (a lowered program's graph module, not modified) with its decisions made right
    (see the Note), and one record per decision put back: ``gm`` itself where there is none.
    ``returned`` are the training nodes the outputs observe (None: ``gm`` came lowered, and is
    searched by provenance); ``mutated`` maps each returned value that a program writes into
    one of its inputs (or buffers) to that input's placeholder. Raises
    :class:`LayoutBoundProgram` where a decision cannot be put back.

    Example::

        >>> settled, records = settle_decisions(lowered.graph_module, decisions, {})
        >>> [r.after for r in records]
        ['reshape(x, [32])']
    """
    if returned is None:
        returned = dict(_lowered_decisions(gm.graph, _groups(gm.graph), mutated))
    if not returned:
        return gm, []
    settled = LazyGraphModule(gm, copy_graph(gm.graph))
    settled.meta = dict(gm.meta)
    groups = _groups(settled.graph, returned)
    records = []
    for name, decision in returned.items():
        group = groups.get(name, [])
        result, source = _result_of(group), _input_of(group)
        call = _deciding_call(decision, result)
        if result is None or source is None or call is None:
            raise _refusal_without_nodes(decision, name)
        records.append(_put_back(settled.graph, name, decision, call, result, source))
    settled.graph.eliminate_dead_code()
    settled.recompile()
    return settled, records


def _lowered_decisions(
    graph: torch.fx.Graph, groups: dict[str, list[torch.fx.Node]], mutated: dict[str, str]
) -> Iterator[tuple[str, Decision]]:
    """The decisions of a program given lowered that its outputs observe. Raises for one that
    made a view of an input the program then writes: lowering made that write the input's new
    value, computed through the decision. (Writes into the program's own intermediates leave
    no trace a lowered program keeps: they are found in the training IR only.)"""
    analysis = AliasAnalysis(graph)
    nodes = {node.name: node for node in graph.nodes}
    for name, group in groups.items():
        result = _result_of(group)
        if result is None:
            continue
        for value, placeholder in mutated.items():
            written, target = nodes.get(value), nodes.get(placeholder)
            if written is None or target is None:
                continue
            if _writes_through(result, written, target):
                raise _refusal(result, value)
        source = _input_of(group)
        if source is not None and _returned_over_input(result, source, analysis):
            root = _root_name(result)
            target = _overload(root[1]) if root is not None else None
            yield name, Decision(target, _known_kwargs(target, result), source_line(result))


def _returned_over_input(
    result: torch.fx.Node, source: torch.fx.Node, analysis: AliasAnalysis
) -> bool:
    """Whether ``result`` (or an alias of it) is returned while its input's memory is the
    caller's: observable whether the example made it a view or a copy."""
    returned = analysis.derived_closure(result) & analysis.outputs
    caller = analysis.members[analysis.root[source]]
    return bool(returned) and any(n.op in ("placeholder", "get_attr") for n in caller)


def _known_kwargs(target: Any, result: torch.fx.Node) -> dict[str, Any] | None:
    """What a lowered program still says of a decision's keyword arguments: a ``contiguous``
    that copied on the example is a ``clone`` in the memory format asked for."""
    if target is not aten.contiguous.default:
        return {}
    if result.target is not aten.clone.default:
        return None
    memory_format = result.kwargs.get("memory_format", torch.contiguous_format)
    return {} if memory_format == torch.contiguous_format else {"memory_format": memory_format}


def _writes_through(result: torch.fx.Node, written: torch.fx.Node, target: torch.fx.Node) -> bool:
    """Whether ``result`` views ``target``'s memory and the value written into it comes from it."""
    view, held = result.meta.get("val"), target.meta.get("val")
    if not isinstance(view, torch.Tensor) or not isinstance(held, torch.Tensor):
        return False
    if storage_identity(view) != storage_identity(held):
        return False
    pending, seen = [written], set()
    while pending:
        node = pending.pop()
        if node is result:
            return True
        if node not in seen:
            seen.add(node)
            pending += node.all_input_nodes
    return False


def _overload(target: str) -> OpOverload | None:
    """The aten overload a provenance record names (``"aten.reshape.default"``)."""
    namespace, _, rest = target.partition(".")
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace, None), name, None)
    op = getattr(packet, overload or "default", None) if packet is not None else None
    return op if isinstance(op, OpOverload) else None


def _deciding_call(
    decision: Decision, result: torch.fx.Node | None
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """The aten call that decides as ``decision`` does, on its decomposition's input, or None
    where it cannot be written (no result value; a memory format only the training IR knew)."""
    value = result.meta.get("val") if result is not None else None
    if not isinstance(value, torch.Tensor):
        return None
    if decision.target in _RESHAPES:
        return aten.reshape.default, (list(value.shape),), {}
    if decision.target is aten.ravel.default:
        return aten.ravel.default, (), {}
    if decision.kwargs is None:
        return None
    if decision.target is aten.contiguous.default:
        return aten.contiguous.default, (), decision.kwargs
    return aten.to.dtype_layout, (), {"memory_format": decision.kwargs["memory_format"]}


def _refusal_without_nodes(decision: Decision, name: str) -> LayoutBoundProgram:
    where = f" ({decision.source})" if decision.source else ""
    return LayoutBoundProgram(
        f"the exported program returns the result of {name!r}{where}, which decides view or "
        f"copy by its input's layout, aliasing one of its inputs, and the lowered program keeps "
        f"no single node of it to put the decision back on: the program is right only for "
        f"inputs laid out like the example."
    )


def _put_back(
    graph: torch.fx.Graph,
    name: str,
    decision: Decision,
    call: tuple[Any, tuple[Any, ...], dict[str, Any]],
    result: torch.fx.Node,
    source: torch.fx.Node,
) -> Record:
    """Replace ``result`` by the deciding aten ``call`` on ``source``."""
    op, args, kwargs = call
    before = describe_call(result.target, result.args, result.kwargs)
    with graph.inserting_before(result):
        decided = GraphEmitter(graph, result)(op, source, *args, **kwargs)
    result.replace_all_uses_with(decided)
    return Record(
        decided.name,
        before,
        describe_call(op, (source, *args), kwargs),
        "runtime",
        f"{name!r} is returned aliasing an input: it decides view or copy on each call's layout "
        f"again, as eager does, not as on the example",
        kind=RecordKind.VIEW,
        source=decision.source,
    )
