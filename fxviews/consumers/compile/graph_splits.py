"""Split Dynamo's graph where AOTAutograd would read a kept node's memory wrong, as a graph
break would split it, instead of running the whole graph as eager PyTorch.

Note [Splitting before kept reads of written memory]
----------------------------------------------------
An ``as_strided`` the engine keeps that reads memory written in place earlier in the graph
must not reach AOTAutograd with the write (Note [In-place writes AOTAutograd gets wrong]):
functionalization hands it the written tensor's updated copy, whose layout is its own, so the
compiled node reads other memory than eager's. Running the whole graph as eager PyTorch for
that one node costs every other op its compilation (HF Longformer's attention: 3.7x Inductor's
time). Across a graph break the problem is gone: the memory is the next graph's *input*, a
real tensor whose layout is a fact, and nothing in that graph wrote it. So the graph is split
there, and every part compiles:

1. **Where.** Right before each such node, after a copy of the view ops between it and the
   memory it reads (up its first arguments while they share its storage, stopping at a write
   or at the node that made the memory: the *root*). The next part receives the root itself,
   not a view of it the previous part made, so the node reads the root's memory as eager
   does; the original views stay for their other users (views read no values: computing them
   later changes nothing).
2. **How.** ``torch.fx.passes.split_module`` keeps the graph's order: a write and the reads
   around it stay in their order, as in eager. Each part is lowered by the backend's own
   lowering (AOTAutograd, the engine, the inner compiler) with the example values Dynamo
   recorded for its inputs, and autograd joins the parts as it joins the graphs of a graph
   break (each lowering in a tracing context of its own, whose metadata its backward
   compile reads back). In the part that reads it, the node is proven against its input's
   layout by the engine like any other (a chain of views where one exists), and a part whose
   lowering fails runs as eager PyTorch alone.
3. **Eager's memory at the seam.** The root's memory must be laid out as eager lays it: where
   its traced layout is not eager's it is pinned to eager's in the graph before the split
   (Note [Outputs in eager's layout]), and the previous part returns it so (Inductor keeps its
   outputs' traced strides; the next part's compiled code asserts its inputs' strides).

A graph whose hazard is not such a read (a write through a view whose inverse is wrong,
aliased inputs) still runs as eager PyTorch whole, saying why.

Cost: a compiled call per part (AOTAutograd's wrappers, a few microseconds each on CPU).

Example::

    >>> split = split_before(gm, [kept_as_strided], lower)   # lower(gm, example_inputs)
    >>> [name for name, _ in split.named_children()]
    ['submod_0', 'submod_1']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from fxviews.consumers.compile.output_layouts import pin_eager_layouts
from fxviews.consumers.compile.write_hazards import node_storage, written_nodes
from fxviews.passes.analysis.as_strided_calls import bind_as_strided
from fxviews.passes.compat.torch_internals import own_tracing_context, split_module

#: Lowers one compiled partition: ``lower(partition, example_inputs)`` returns its function.
Lower = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]


def split_before(
    gm: torch.fx.GraphModule, nodes: Sequence[torch.fx.Node], lower: Lower
) -> torch.fx.GraphModule:
    """``gm`` split right before each of ``nodes`` (kept reads of written memory, see the Note),
    each part lowered by ``lower``; ``gm`` is edited in place first (view copies, pinned
    roots)."""
    cuts: set[torch.fx.Node] = set()
    roots = []
    for node in nodes:
        first, root = _copy_view_chain(gm.graph, node)
        cuts.add(first)
        if root.op != "placeholder":
            roots.append(root)
    gm.recompile()
    pin_eager_layouts(gm, roots)
    examples = {n.name: n.meta.get("example_value") for n in gm.graph.nodes}
    part: dict[torch.fx.Node, int] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "output"):
            current += node in cuts and bool(part)
            part[node] = current
    split = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
    for call in split.graph.find_nodes(op="call_module"):
        submodule = split.get_submodule(str(call.target))
        assert isinstance(submodule, torch.fx.GraphModule)
        inputs = [examples[p.name] for p in submodule.graph.find_nodes(op="placeholder")]
        setattr(split, str(call.target), _Lowered(submodule, inputs, lower))
    return split


def _copy_view_chain(
    graph: torch.fx.Graph, node: torch.fx.Node
) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Copies, right before ``node``, of the views between its input and the root of the
    memory it reads (see Note, 1), ``node`` reading the last copy: the first node of the part
    that reads the memory (the first copy, or ``node`` itself), and the root."""
    source = bind_as_strided(node)["self"]
    assert isinstance(source, torch.fx.Node)
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
