"""Windows written in place: an ``unfold`` whose windows other view ops give, made of those.

Note [Windows written in place]
-------------------------------
AOTAutograd's functionalization inverts a write through ``unfold`` with ``unfold_backward``,
which zeroes every element of the base no window covers (pytorch #198102: ``x.unfold(1, 1,
5).add_(...)`` on a ``(4, 6)`` ``x`` zeroes columns 1 to 4). The inverses of ``select``,
``slice``, ``view``, ``permute`` and ``unsqueeze`` are exact. Windows that do not overlap (a
size at most the step) are often those views: windows of one element every ``k`` are a slice
with step ``k`` and an ``unsqueeze``; windows that tile a prefix of the dim are a slice, a
``view`` into ``(count, step)`` and a slice of each row. So before AOTAutograd, an ``unfold`` in
Dynamo's graph that something writes through is replaced by the chain the engine synthesizes
from its input's layout to its own (verified on a meta tensor like every chain; the new nodes'
example values must have the unfold's exact layout), where that chain holds no ``unfold``, or else,
for gapped windows (a size less than the step) whose steps fit in the dim, by the slice, view
and slice that tile them: the same view of the same memory either way, whose writes
functionalization inverts exactly. Where neither exists (overlapping windows, gapped windows
whose last step runs past the dim), the graph keeps the ``unfold`` and the backend runs it as
eager PyTorch (Note [In-place writes AOTAutograd gets wrong]).

Example::

    >>> rewrite_written_windows(gm)   # v = x.unfold(1, 1, 5); v.add_(v)
    ['v']                             # v = unsqueeze(slice(x, 1, 0, 9223372036854775807, 5), 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from fxviews.consumers.compile.write_hazards import is_unfold, written_nodes
from fxviews.passes.chains.chain import ViewChain, ViewStep, apply_chain
from fxviews.passes.chains.synthesis import synthesize
from fxviews.passes.compat.torch_internals import FakeTensor
from fxviews.passes.geometry.concrete import Geometry, equivalent
from fxviews.passes.schema import MADE_FOR

aten = torch.ops.aten


def rewrite_written_windows(gm: torch.fx.GraphModule) -> list[str]:
    """Replace each ``unfold`` written through by a chain of views without ``unfold`` (see the
    Note), in place; the names of the replaced nodes."""
    replaced = []
    written = dict.fromkeys(t for n in gm.graph.nodes for t in written_nodes(n) if is_unfold(t))
    for node in written:
        windows = _static_layout(node)
        if windows is None:
            continue  # under a torch.func transform, or symbolic: left to the hazard check
        found = _views_for(node, windows)
        if found is None:
            continue
        source, chain = found
        emit = _Emitter(gm.graph, node)
        with gm.graph.inserting_before(node):
            out = apply_chain(chain, source, emit)
        if not equivalent(Geometry.of(out.meta["example_value"]), windows):
            for made in reversed(emit.created):
                gm.graph.erase_node(made)
            continue
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        replaced.append(node.name)
        old_input = node.args[0]
        if isinstance(old_input, torch.fx.Node) and MADE_FOR in old_input.meta:
            if not old_input.users:  # the first stage's slice the tiling widened
                gm.graph.erase_node(old_input)
    if replaced:
        gm.recompile()
    return replaced


class _Emitter:
    """Inserts ``op(*args)`` as a node with Dynamo's ``example_value`` (the op on the fake
    values) and the replaced node's stack."""

    def __init__(self, graph: torch.fx.Graph, like: torch.fx.Node) -> None:
        self.graph, self.like = graph, like
        self.created: list[torch.fx.Node] = []

    def __call__(self, op: Callable[..., Any], *args: Any) -> torch.fx.Node:
        node = self.graph.call_function(op, args)
        values = torch.fx.node.map_arg(args, lambda n: n.meta["example_value"])
        node.meta["example_value"] = op(*values)
        for key in ("stack_trace", "source_fn_stack", "nn_module_stack"):
            if key in self.like.meta:
                node.meta[key] = self.like.meta[key]
        self.created.append(node)
        return node


def _views_for(node: torch.fx.Node, windows: Geometry) -> tuple[torch.fx.Node, ViewChain] | None:
    """A chain of views without ``unfold`` giving the windows of the ``unfold`` ``node``, and
    the node it applies to; None if there is none."""
    source = node.args[0]
    whole = _static_layout(source) if isinstance(source, torch.fx.Node) else None
    if not isinstance(source, torch.fx.Node) or whole is None:
        return None
    chain = synthesize(whole, windows)
    if chain is not None and all(step.op is not aten.unfold.default for step in chain):
        return source, chain
    arguments = [*node.args[1:], *node.kwargs.values()][:3]
    if len(arguments) < 3 or not all(type(v) is int for v in arguments):
        return None
    dim, size, step = (int(v) for v in arguments)  # type: ignore[arg-type]
    if not 0 < size < step:
        return None
    dim %= len(whole.sizes)
    count = (whole.sizes[dim] - size) // step + 1
    start = 0
    widened = _sliced_from(source, dim)
    if widened is not None:
        source, start, whole = widened
    if start + count * step > whole.sizes[dim]:
        return None
    sizes = [*whole.sizes[:dim], count, step, *whole.sizes[dim + 1 :]]
    return source, (
        ViewStep(aten.slice.Tensor, (dim, start, start + count * step)),
        ViewStep(aten.view.default, (sizes,)),
        ViewStep(aten.slice.Tensor, (dim + 1, 0, size)),
        ViewStep(aten.movedim.int, (dim + 1, -1)),
    )


def _sliced_from(node: torch.fx.Node, dim: int) -> tuple[torch.fx.Node, int, Geometry] | None:
    """Where ``node`` is a unit-step slice of ``dim`` the first stage emitted (its windows
    start with one), the tensor it slices, the slice's start and that tensor's layout: windows
    may be tiled from it, past the slice's end."""
    if MADE_FOR not in node.meta or node.target is not aten.slice.Tensor:
        return None
    source, sliced_dim, start, *rest = (*node.args, None, None, None)[:6]
    if sliced_dim != dim or type(start) is not int or rest[1] not in (None, 1):
        return None
    whole = _static_layout(source) if isinstance(source, torch.fx.Node) else None
    return (
        None if whole is None or not isinstance(source, torch.fx.Node) else (source, start, whole)
    )


def _static_layout(node: torch.fx.Node) -> Geometry | None:
    """The layout of ``node``'s example value where it is a plain fake tensor (no torch.func
    wrapper) of static sizes."""
    value = node.meta.get("example_value")
    if type(value) is not FakeTensor:
        return None
    g = Geometry.of(value)
    return g if all(type(v) is int for v in (*g.sizes, *g.strides, g.offset)) else None
