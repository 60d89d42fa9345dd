"""In-place writes through views that AOTAutograd's functionalization gets wrong.

Note [In-place writes AOTAutograd gets wrong]
---------------------------------------------
AOTAutograd functionalizes a graph before any backend sees it: every in-place write through a
view becomes an out-of-place op plus the *inverse* of each view between the written tensor and
its base (``select_scatter`` for ``select``, ``slice_scatter`` for a slice, ...), and every later
read of an alias is regenerated from the updated base. Where an inverse is not exact, the
compiled program returns other numbers than eager, and nothing after AOTAutograd can tell.
Public reports, all silently wrong with ``aot_eager`` and Inductor on torch 2.13:

- a write through a view with internal overlap (pytorch #174371: ``x.as_strided((2, 2),
  (1, 1)).add_(1)`` adds 1 once to the element both rows share, eager twice): eager writes
  each element once per index that reaches it;
- a write through ``unfold`` (pytorch #198102): the inverse is ``unfold_backward``, which
  zeroes every element no window covers (and sums overlapping ones);
- a write through an ``as_strided`` the first stage keeps (pytorch #104505): the inverse is an
  ``as_strided_scatter`` relative to the view's base, not its storage;
- graph inputs aliasing each other, one written and a view of them returned (pytorch
  #198095): AOTAutograd merges them into a "synthetic base" and regenerates the returned view
  from the wrong one (aliased inputs written in place with nothing of theirs returned, such as
  parameters sharing one flat buffer under an optimizer step, compile);
- an ``as_strided`` the first stage keeps that reads memory written earlier (pytorch #133512:
  ``x.add_(1)`` then ``as_strided_copy(x, (3,), (2,))`` on ``x = arange(10)[::2]``):
  functionalization's updated tensor has its own strides, not ``x``'s.

The first stage removes the patterns it can before AOTAutograd: an ``as_strided`` it rewrites is
a chain of views whose inverses are exact (the last report, and writes through a gapped or
strided ``as_strided``). What remains is found here, on Dynamo's graph after the first stage,
from the calls (in-place methods, ``x[i] = v``, ``+=``, ``out=``, ``inplace=True``) and their
example values (which tensors share storage, which views overlap). Such a write runs as Python
instead, eager PyTorch op by op as ``backend="eager"`` runs it, in a part of the graph of its
own; the rest compiles (Note [Splitting the graph around what AOTAutograd gets wrong]). Where
no seam can be cut (the write lies inside a ``torch.func`` transform the graph runs) the whole
graph runs so, and ``strict=True`` raises instead of running anything eagerly, naming the node.

Example::

    >>> write_hazard(gm)   # gm: Dynamo's graph of x.unfold(1, 1, 5).add_(...)
    Hazard(reason="'add_' (repro.py:3, in fn) writes in place through unfold 'v', whose ...",
           split_before=(), run_alone=(add_,))
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.fx

from fxviews.passes.analysis.as_strided_calls import as_strided_op
from fxviews.passes.compat.torch_internals import get_unwrapped, is_functorch_wrapped_tensor, pytree
from fxviews.passes.compat.torch_internals import storage_identity as _storage_id
from fxviews.passes.geometry.concrete import Geometry, is_one_to_one
from fxviews.passes.schema import MADE_FOR
from fxviews.passes.source_lines import describe_node

#: Python's augmented assignments: ``t += v`` writes ``t`` in place where ``t`` is a tensor.
_AUGMENTED = frozenset(
    {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
        operator.imatmul,
    }
)
#: Methods whose trailing underscore does not mean a write of values the graph reads.
_NOT_WRITES = frozenset({"requires_grad_", "retain_grad", "share_memory_", "record_stream"})


@dataclass(frozen=True)
class Hazard:
    """Why AOTAutograd would give a graph other numbers than eager (``reason``, naming the
    first node), and the nodes that alone would, around which the graph is split so that
    every other part compiles (Note [Splitting the graph around what AOTAutograd gets
    wrong]): kept as_strided nodes reading written memory (``split_before``) and writes to run
    as eager PyTorch in a part of their own (``run_alone``)."""

    reason: str
    split_before: tuple[torch.fx.Node, ...] = ()
    run_alone: tuple[torch.fx.Node, ...] = ()


def write_hazard(gm: torch.fx.GraphModule) -> Hazard | None:
    """Why AOTAutograd would give ``gm`` (Dynamo's graph, after the first stage) other numbers
    than eager, naming the node, and the nodes that would; None where it would not (see the
    Note)."""
    writes = [(node, target) for node in gm.graph.nodes for target in written_nodes(node)]
    if not writes:  # most graphs: nothing to look at
        return None
    storage = {n: node_storage(n) for n in gm.graph.nodes}
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    reasons: list[str] = []
    run_alone: dict[torch.fx.Node, None] = {}  # in graph order, once each
    written: dict[int, torch.fx.Node] = {}  # storage -> its first writer
    for node, target in writes:
        why = _through_a_view(node, target, storage)
        if why is not None:
            reasons.append(why)
            run_alone[node] = None
        target_storage = storage.get(target)
        if target_storage is not None:
            written.setdefault(target_storage, node)
    aliased = _aliased_inputs(gm.graph, storage)
    returned = {storage.get(n) for n in gm.graph.output_node().all_input_nodes}
    for sid in aliased.keys() & written.keys() & returned:
        reasons.append(
            f"graph inputs {aliased[sid]} share memory, {describe_node(written[sid])} "
            "writes it in place and the graph returns a view of it: AOTAutograd merges "
            "them into a synthetic base and regenerates that view from the other input "
            "(pytorch #198095)"
        )
        run_alone.update((n, None) for n, t in writes if storage.get(t) == sid)
    reads: list[tuple[torch.fx.Node, torch.fx.Node]] = []  # (kept as_strided, earlier writer)
    for node in gm.graph.nodes:
        source = node.args[0] if node.args else None
        source_storage = storage.get(source) if isinstance(source, torch.fx.Node) else None
        writer = written.get(source_storage) if source_storage is not None else None
        if as_strided_op(node) is not None and writer and position[writer] < position[node]:
            reads.append((node, writer))
    if reads:
        node, writer = reads[0]
        reasons.append(
            f"{describe_node(node)} stays an as_strided and reads memory {describe_node(writer)} "
            "wrote in place: AOTAutograd's updated tensor has its own strides, not the written "
            "one's (pytorch #133512)"
        )
    if not reasons:
        return None
    return Hazard(
        reasons[0],
        tuple(n for n, _ in reads),
        tuple(sorted(run_alone, key=position.__getitem__)),
    )


def _through_a_view(
    writer: torch.fx.Node, target: torch.fx.Node, storage: dict[torch.fx.Node, int | None]
) -> str | None:
    """Why a write into ``target`` through the views it is made by has an inexact inverse."""
    value = _tensor(target)
    if isinstance(value, torch.Tensor) and _overlaps(value):
        return (
            f"{describe_node(writer)} writes in place through {target.name!r}, a view whose "
            "elements overlap: eager writes a shared element once per index, functionalization "
            "once (pytorch #174371)"
        )
    for view in _views_up_from(target, storage):
        if is_unfold(view):
            return (
                f"{describe_node(writer)} writes in place through unfold {view.name!r}, whose "
                "inverse in functionalization zeroes the elements no window covers "
                "(pytorch #198102)"
            )
        if as_strided_op(view) is not None:
            return (
                f"{describe_node(writer)} writes in place through {view.name!r}, an as_strided "
                "the first stage keeps, whose inverse in functionalization is relative to its "
                "base rather than its storage (pytorch #104505)"
            )
    return None


def written_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes whose values ``node`` writes in place (see the Note)."""
    targets: list[object] = []
    if node.op == "call_method" and isinstance(node.target, str):
        name = node.target
        if name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
            targets.append(node.args[0])
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if node.target is operator.setitem or node.target in _AUGMENTED:
            targets.append(node.args[0])
        elif name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
            targets.append(node.args[0] if node.args else None)
        if node.kwargs.get("inplace") is True and node.args:
            targets.append(node.args[0])
        targets.extend(pytree.tree_leaves(node.kwargs.get("out")))
    # A target without an example value is a view the first stage emitted under vmap.
    return [t for t in targets if isinstance(t, torch.fx.Node) and _may_be_tensor(t)]


def _may_be_tensor(node: torch.fx.Node) -> bool:
    value = node.meta.get("example_value")
    return isinstance(value, torch.Tensor) or (value is None and MADE_FOR in node.meta)


def _views_up_from(
    node: torch.fx.Node, storage: dict[torch.fx.Node, int | None]
) -> Iterator[torch.fx.Node]:
    """``node`` and the nodes it is a view of, through their first argument while it shares
    their storage (the views the first stage emitted under vmap have no example value: they
    are views of their first argument)."""
    while True:
        yield node
        parent = node.args[0] if node.args else None
        if not isinstance(parent, torch.fx.Node):
            return
        made_view = storage.get(node) is None and MADE_FOR in node.meta
        if not made_view and (storage.get(parent) is None or storage[parent] != storage[node]):
            return
        node = parent


def _aliased_inputs(
    graph: torch.fx.Graph, storage: dict[torch.fx.Node, int | None]
) -> dict[int, str]:
    """Storages that two or more graph inputs share, with the inputs' names."""
    by_storage: dict[int, list[str]] = {}
    for node in graph.find_nodes(op="placeholder"):
        sid = storage.get(node)
        if sid is not None:
            by_storage.setdefault(sid, []).append(repr(node.name))
    return {sid: " and ".join(names) for sid, names in by_storage.items() if len(names) > 1}


def is_unfold(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls ``unfold``, as a method, a function or the aten op."""
    return (node.op == "call_method" and node.target == "unfold") or (
        node.op == "call_function"
        and node.target in (torch.Tensor.unfold, torch.ops.aten.unfold.default)
    )


def _overlaps(value: torch.Tensor) -> bool:
    """Whether distinct indices of ``value`` may reach one element (static layouts; the views
    that make a symbolic one overlap, ``unfold`` and ``as_strided``, are found by name)."""
    geometry = Geometry.of(value)
    static = all(type(v) is int for v in (*geometry.sizes, *geometry.strides))
    return static and not is_one_to_one(geometry)


def _tensor(node: torch.fx.Node) -> torch.Tensor | None:
    """The fake tensor a node's example value holds, under any functorch wrappers."""
    value = node.meta.get("example_value")
    while isinstance(value, torch.Tensor) and is_functorch_wrapped_tensor(value):
        value = get_unwrapped(value)
    return value if isinstance(value, torch.Tensor) else None


def node_storage(node: torch.fx.Node) -> int | None:
    """The identity of the storage under a node of Dynamo's graph (under any functorch
    wrappers: a vmap input shares its caller's); None for a value without one."""
    value = _tensor(node)
    if value is None or value.layout != torch.strided:
        return None
    try:
        return _storage_id(value)
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return None
