"""Eager's layouts for the outputs of a compiled graph, where fake kernels lay them out otherwise.

Note [Outputs in eager's layout]
--------------------------------
Inductor returns each output of a graph in the layout its fake value has (``keep_output_stride``
makes the buffers follow it). Where an op's fake kernel computes another layout than its eager
kernel (``copysign`` of a transposed tensor: fake contiguous, eager transposed, pytorch
#198364), the compiled function returns the same values in another layout than eager: code
that reads ``.stride()``, calls ``.view()`` or hands the tensor to a library that assumes it
gets other answers, or an error. AOTAutograd takes care of the layouts of the outputs it
regenerates itself (aliases of inputs, remade with ``as_strided``); nobody checks the others.

So before lowering, for an inner compiler that lays memory out by the fake values (any but the
default eager one, which runs eager kernels), each output of Dynamo's graph outside vmap
regions with static sizes is checked by layout truth (Note [Layouts are facts to check]).
Where its traced layout is not eager's and eager's is known, the *storage root* of the output
(the node that made its memory: up its views, through the nodes that share its storage) gets
eager's layout in the graph: right after it, ``torch.empty_strided`` of the eager layout and a
``copy_`` of it, which every later use of the root reads instead. The output, and any other
view of that memory, are then the views eager takes of memory laid out as eager lays it; the
copy is a kernel the compiler fuses with the root's (Inductor writes the root's values there
directly). Aliasing is kept: all the root's users read the one pinned tensor.

Not covered: outputs with symbolic sizes (eager's layout is known at the traced sizes only),
outputs under vmap (vmap's layout), and outputs whose root's eager layout has an offset.

Cost: nothing for the eager inner compiler; otherwise layout truth's eager runs on zeros over
the outputs' ancestors (cached per op and layouts), and a copy only where layouts differ.

Example::

    >>> pin_output_layouts(gm)   # gm: Dynamo's graph of copysign(a, b) with a transposed
    ["'copysign' (f.py:1): traced with strides [6, 1], eager gives [1, 5]"]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
import torch.fx

from fxviews.consumers.compile.dynamo_values import assign_values, clear_values
from fxviews.consumers.compile.write_hazards import node_storage
from fxviews.passes.analysis.layout_truth import LayoutTruth
from fxviews.passes.compat.fake_modes import no_new_guards
from fxviews.passes.compat.torch_internals import FakeTensor, pytree
from fxviews.passes.geometry.concrete import Geometry
from fxviews.passes.source_lines import describe_node


def pin_output_layouts(gm: torch.fx.GraphModule) -> list[str]:
    """Give the storage root of each output of Dynamo's graph ``gm`` whose traced layout is
    not eager's eager's layout, in place (see the Note); what was pinned, in words."""
    outputs = [
        n
        for n in pytree.tree_leaves(gm.graph.output_node().args)
        if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("example_value"), FakeTensor)
    ]
    return pin_eager_layouts(gm, outputs)


def pin_eager_layouts(
    gm: torch.fx.GraphModule,
    nodes: Sequence[torch.fx.Node],
    fresh: Collection[torch.fx.Node] = (),
) -> list[str]:
    """:func:`pin_output_layouts` for ``nodes`` of ``gm``, outputs or not: the storage root of
    each whose traced layout is not eager's gets eager's layout; each root in ``fresh`` is
    pinned too, where layouts agree (in its traced layout where eager's is not known), so that
    its users read memory the graph made itself rather than a view (a graph part's output that
    another part writes in place: Note [Splitting the graph around what AOTAutograd gets
    wrong]). What was pinned, in words."""
    if not nodes and not fresh:
        return []
    values = assign_values(gm)
    roots: dict[torch.fx.Node, Geometry] = {}
    try:
        truth = LayoutTruth(gm)
        for node in nodes:
            if node in values.batched or not _static(node.meta.get("val")):
                continue
            differs, _ = truth.layout_doubt(node)
            if not differs:
                continue
            root = storage_root(node)
            eager = truth.eager_layout(root)
            if eager is not None and eager.offset == 0 and _static(root.meta.get("val")):
                roots[root] = eager
        for root in fresh:
            if root in roots or root in values.batched or not _static(root.meta.get("val")):
                continue
            eager = truth.eager_layout(root) or Geometry.of(root.meta["val"])
            if eager.offset == 0:
                roots[root] = eager
    finally:
        clear_values(gm, values)
    pinned = [_pin(gm.graph, root, eager) for root, eager in roots.items()]
    if pinned:
        gm.recompile()
    return pinned


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node that made ``node``'s memory: up through first arguments sharing its storage."""
    storage = node_storage(node)
    while node.args and isinstance(parent := node.args[0], torch.fx.Node):
        if storage is None or node_storage(parent) != storage:
            break
        node = parent
    return node


def _pin(graph: torch.fx.Graph, root: torch.fx.Node, eager: Geometry) -> str:
    """Insert ``empty_strided(eager) .copy_(root)`` after ``root``, read by its users."""
    traced: FakeTensor = root.meta["example_value"]
    users = list(root.users)
    with graph.inserting_after(root):
        empty = graph.call_function(
            torch.empty_strided,
            (tuple(eager.sizes), tuple(eager.strides)),
            {"dtype": traced.dtype, "device": traced.device},
        )
    with graph.inserting_after(empty):
        copied = graph.call_method("copy_", (empty, root))
    with traced.fake_mode, no_new_guards(traced):
        empty.meta["example_value"], fresh = (
            traced.new_empty_strided(eager.sizes, eager.strides) for _ in range(2)
        )
        copied.meta["example_value"] = fresh.copy_(traced)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in root.meta:
            empty.meta[key] = copied.meta[key] = root.meta[key]
    for user in users:
        user.replace_input_with(root, copied)
    return (
        f"{describe_node(root)}: traced with strides {list(traced.stride())}, eager gives "
        f"{list(eager.strides)}"
    )


def _static(value: object) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    g = Geometry.of(value)
    return all(type(v) is int for v in (*g.sizes, *g.strides, g.offset))
