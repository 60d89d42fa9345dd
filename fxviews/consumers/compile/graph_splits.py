"""Split Dynamo's graph around the nodes AOTAutograd would give other numbers than eager, as
a graph break would split it, instead of running the whole graph as eager PyTorch.

Note [Splitting the graph around what AOTAutograd gets wrong]
-------------------------------------------------------------
Two kinds of node must not reach AOTAutograd with the rest of their graph (Note [In-place
writes AOTAutograd gets wrong]): an ``as_strided`` the engine keeps that reads memory written
in place earlier in the graph (functionalization hands it the written tensor's updated copy,
whose layout is its own), and a write whose functionalized inverse is not exact (through an
overlapping view, an ``unfold``, a kept ``as_strided``, into graph inputs that alias each
other). Running the whole graph as eager PyTorch for one node costs every other op its
compilation (HF Longformer's attention: 3.7x Inductor's time). Across a graph break the
problem is gone: the memory is the next graph's *input*, a real tensor whose layout is a
fact, and nothing in that graph wrote it. So the graph is split there, and every part but
the writes compiles:

1. **Where.** Right before each such node, after a copy of the view ops between it and the
   memory it reads or writes (up its first arguments while they share its storage, stopping
   at a write or at the node that made the memory: the *root*). The part receives the root
   itself, not a view of it the previous part made, so the node reads and writes the root's
   memory as eager does; the original views stay for their other users (views read no
   values: computing them later changes nothing). A write gets a part of its own, ended
   right after it.
2. **How.** ``torch.fx.passes.split_module`` keeps the graph's order: a write and the reads
   around it stay in their order, as in eager. A write's part runs as Python, eager PyTorch
   op by op, on the parts' real tensors: what it writes, every later part reads as its input,
   and what the earlier parts returned of that memory are views AOTAutograd made of it (it
   regenerates an output that aliases an input or another output from it). Every other part
   is lowered by the backend's own lowering (AOTAutograd, the engine, the inner compiler)
   with the example values Dynamo recorded for its inputs, and autograd joins the parts as it
   joins the graphs of a graph break (each lowering in a tracing context of its own, whose
   metadata its backward compile reads back). In the part that reads it, a kept node is
   proven against its input's layout by the engine like any other (a chain of views where
   one exists), and a part whose lowering fails runs as eager PyTorch alone. A compiled part
   saves for its backward what AOTAutograd's partitioner picks, and a write run alone writes
   the part before's fresh copy of its memory (3): where eager's backward would raise because
   the write changed a result saved for it, the split graph's backward reads that result as
   it was made (eager's gradient of the program with a clone before the write), or raises
   the same error where the partitioner saved the copy; never other numbers (saved tensors'
   version counters are checked).
3. **Eager's memory at the seam.** The root's memory must be laid out as eager lays it: where
   its traced layout is not eager's it is pinned to eager's in the graph before the split
   (Note [Outputs in eager's layout]), and the previous part returns it so (Inductor keeps its
   outputs' traced strides; the next part's compiled code asserts its inputs' strides). A
   root that a part run as Python writes in place is pinned even where layouts agree: the part
   before returns memory it made, not a view of it, which AOTAutograd may hand out as one
   made inside its autograd function (torch 2.15: ``linear`` of a 3-d input returns a view of
   its matrix product) and which autograd then forbids writing in place.
4. **Around a transform.** No seam is cut inside a ``torch.func`` transform the graph runs
   (between ``_vmap_increment_nesting`` and its decrement, or grad's or jvp's): the tensors
   there are wrapped for the transform's level, which exists only while the graph runs it.
   A node there that must leave the compiler takes the whole outermost transform around it
   along (:func:`transform_regions`): that transform runs as eager PyTorch, the rest of the
   graph compiles.

Cost: a compiled call per part (AOTAutograd's wrappers, a few microseconds each on CPU), and
the writes' ops, dispatched one by one as eager dispatches them.

Example::

    >>> split = split_around(gm, [kept_as_strided], [], lower)   # lower(gm, example_inputs)
    >>> [name for name, _ in split.named_children()]
    ['submod_0', 'submod_1']
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
import torch.fx

from fxviews.consumers.compile.output_layouts import pin_eager_layouts, storage_root
from fxviews.consumers.compile.write_hazards import node_storage, written_nodes
from fxviews.passes.analysis.as_strided_calls import bind_as_strided
from fxviews.passes.compat.torch_internals import own_tracing_context, split_module

#: Lowers one compiled partition: ``lower(partition, example_inputs)`` returns its function.
Lower = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]


def split_around(
    gm: torch.fx.GraphModule,
    kept_reads: Sequence[torch.fx.Node],
    writes: Sequence[torch.fx.Node],
    lower: Lower,
    eager_from: torch.fx.Node | None = None,
) -> torch.fx.GraphModule:
    """``gm`` split right before each of ``kept_reads`` (kept as_strided reads of written
    memory) and around each of ``writes`` (writes AOTAutograd inverts wrongly), see the Note:
    the writes' parts run as Python, every other part is lowered by ``lower``. From
    ``eager_from`` on (a setting changed: Note [Modes set inside a compiled function]) the
    graph runs as Python. ``gm`` is edited in place first (view copies, pinned roots)."""
    cuts: set[torch.fx.Node] = set()
    alone: set[torch.fx.Node] = set()
    roots = []
    regions = transform_regions(gm)
    if eager_from is not None:
        first = regions[eager_from][0] if eager_from in regions else eager_from
        cuts.add(first)
        alone.update(n for n in _nodes_from(first, gm.graph.output_node()) if n.op != "output")
    for node in [*kept_reads, *writes]:
        if node in regions:  # the transform around it runs as eager PyTorch (see Note, 4)
            first, last = regions[node]
            alone.update(_nodes_from(first, last))
            cuts.update(n for n in (first, last.next) if n.op != "output")
            continue
        source = bind_as_strided(node)["self"] if node in kept_reads else written_nodes(node)[0]
        assert isinstance(source, torch.fx.Node)
        first, root = _copy_view_chain(gm.graph, node, source)
        cuts.add(first)
        if node in writes:
            alone.update(_nodes_from(first, node))
            if node.next.op != "output":
                cuts.add(node.next)
        if root.op != "placeholder":
            roots.append(root)
    gm.recompile()
    pin_eager_layouts(gm, roots, fresh=_written_by_eager_parts(alone))
    examples = {n.name: n.meta.get("example_value") for n in gm.graph.nodes}
    part: dict[torch.fx.Node, int] = {}
    eager_parts: set[int] = set()
    current = 0
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "output"):
            current += node in cuts and bool(part)
            part[node] = current
            if node in alone:
                eager_parts.add(current)
    split = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
    for call in split.graph.find_nodes(op="call_module"):
        submodule = split.get_submodule(str(call.target))
        assert isinstance(submodule, torch.fx.GraphModule)
        if int(str(call.target).removeprefix("submod_")) in eager_parts:
            continue  # a write's part: its Python code, eager PyTorch op by op
        inputs = [examples[p.name] for p in submodule.graph.find_nodes(op="placeholder")]
        setattr(split, str(call.target), _Lowered(submodule, inputs, lower))
    return split


def transform_regions(
    gm: torch.fx.GraphModule,
) -> dict[torch.fx.Node, tuple[torch.fx.Node, torch.fx.Node]]:
    """Each node of ``gm`` inside a ``torch.func`` transform Dynamo traced, with the first and
    last node of the outermost transform around it (its ``_vmap_increment_nesting`` and
    ``_vmap_decrement_nesting`` calls, or grad's or jvp's)."""
    depth = 0
    inside: list[torch.fx.Node] = []
    regions: dict[torch.fx.Node, tuple[torch.fx.Node, torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        depth += name.endswith("_increment_nesting") - name.endswith("_decrement_nesting")
        if depth > 0 or inside:
            inside.append(node)
        if depth == 0 and inside:
            regions.update((n, (inside[0], node)) for n in inside)
            inside = []
    # A transform the graph does not close (Dynamo always closes its own) lasts to the end.
    regions.update((n, (inside[0], inside[-1])) for n in inside)
    return regions


def _written_by_eager_parts(alone: Collection[torch.fx.Node]) -> set[torch.fx.Node]:
    """The storage roots, made by a compiled part, of what the nodes run as Python write in
    place (see Note, 3)."""
    roots = {storage_root(t) for node in alone for t in written_nodes(node)}
    return {root for root in roots if root not in alone and root.op != "placeholder"}


def _nodes_from(first: torch.fx.Node, last: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes from ``first`` to ``last``, both included, in graph order."""
    nodes = [first]
    while nodes[-1] is not last:
        nodes.append(nodes[-1].next)
    return nodes


def _copy_view_chain(
    graph: torch.fx.Graph, node: torch.fx.Node, source: torch.fx.Node
) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Copies, right before ``node``, of the views between ``source``, the tensor it reads or
    writes, and the root of its memory (see Note, 1), ``node`` taking the last copy: the
    first node of the part that reads or writes the memory (the first copy, or ``node``
    itself), and the root."""
    chain = []
    current = source
    storage = node_storage(current)
    while (
        storage is not None
        and current.op != "placeholder"
        and not written_nodes(current)
        and current.args
        and isinstance(parent := current.args[0], torch.fx.Node)
        and node_storage(parent) == storage
    ):
        chain.append(current)
        current = parent
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for view in reversed(chain):
        with graph.inserting_before(node):
            copies[view] = graph.node_copy(view, lambda n: copies.get(n, n))
    if not chain:
        return node, current
    node.replace_input_with(source, copies[source])
    return copies[chain[-1]], current


class _Lowered(torch.nn.Module):
    """A part of the split graph, lowered: its outputs made a tuple for AOTAutograd, which
    needs one, and handed back as split_module's caller reads them."""

    def __init__(self, submodule: torch.fx.GraphModule, inputs: list[Any], lower: Lower) -> None:
        super().__init__()
        output = submodule.graph.output_node()
        self.single = not isinstance(output.args[0], tuple | list)
        if self.single:
            output.args = ((output.args[0],),)
            submodule.recompile()
        with own_tracing_context():  # each part's metadata for its own backward compile
            self.compiled = lower(submodule, inputs)

    def forward(self, *args: Any) -> Any:
        outputs = self.compiled(*args)
        return outputs[0] if self.single else outputs
