"""Bases of an ``as_strided`` input: the tensors it is a view of, which may expose what it reads.

Note [Rewrites relative to a base]
----------------------------------
``as_strided`` addresses its input's *storage*, not its input: ``x[:2].as_strided((4,), (1,))``
reads ``x[0:4]``, past the two elements ``x[:2]`` holds. No chain of view ops from ``x[:2]``
gives that, but one from ``x`` does (``slice(x, 0, 0, 4)``), and a chain from ``x`` is exactly
as portable under ``vmap`` as one from ``x[:2]``. So when no candidate relative to the input
verifies, the pass tries the tensors the input is a view of, nearest first.

A *base* of the input is found by walking up from the input while each step keeps the memory
and its meaning:

1. a layout view (``replayable_step``: select, slice, view, permute, ...): the view shares its
   parent's storage, dtype, conj and neg bits, so the same addresses hold the same values;
2. an in-place write that returns its first argument (``add_``, ``copy_``): the same tensor,
   same geometry; its values are the values at that point of the graph, which is where the
   as_strided reads them too (the chain is emitted right before the as_strided node, so every
   write the graph makes before it, through any alias, is seen, and none after it);

and stops at anything else: a ``detach`` (a chain from its parent would pass gradients the user
stopped), an op that makes new memory (clone, an out-of-place op: a base in its own right), a
graph input. A node whose layout changes in place anywhere in the graph (``t_``, ``as_strided_``,
``resize_``, ``set_``) stops the walk before it: its recorded layout may not be the one the
as_strided's addresses were computed against.

Each base with a concrete trace-time geometry is offered; the caller proves a chain from it
exactly as from the input itself (``verify_chain``: on a meta tensor of the base's geometry,
the chain must give the as_strided's exact geometry, offset included), so a base that does not
expose every address read simply yields no verified chain.

Example::

    >>> [n.name for n, _ in exposing_bases(slice_node, lambda n: None)]   # x[:2]
    ['x_1']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.fx

from ..chains.chain import replayable_step
from ..chains.provenance import node_geometry
from ..geometry.concrete import Geometry
from ..op_tables import METADATA_MUTATIONS
from .aliasing import aliased_arguments, written_arguments

aten = torch.ops.aten

#: How many steps up from the input the walk goes (graphs rarely view a view this deep).
MAX_STEPS = 32


def exposing_bases(
    source: torch.fx.Node, layout_mutation: Callable[[torch.fx.Node], torch.fx.Node | None]
) -> Iterator[tuple[torch.fx.Node, Geometry]]:
    """The bases of ``source`` (see the Note), nearest first, each with its geometry.

    ``layout_mutation(n)`` is a node that changes ``n``'s layout in place, or None.
    """
    node = source
    for _ in range(MAX_STEPS):
        if layout_mutation(node) is not None:
            return
        parent = _same_memory_parent(node)
        if parent is None or layout_mutation(parent) is not None:
            return
        geometry = node_geometry(parent)
        if geometry is not None:
            yield parent, geometry
        node = parent


def _same_memory_parent(node: torch.fx.Node) -> torch.fx.Node | None:
    """The argument whose memory ``node`` is, read the same way (steps 1 and 2), or None."""
    if node.op != "call_function" or not node.args or node.target is aten.detach.default:
        return None
    parent = node.args[0]
    if not isinstance(parent, torch.fx.Node):
        return None
    if replayable_step(node) is not None:
        return parent
    if node.target in METADATA_MUTATIONS:
        return None
    returned, written = aliased_arguments(node), written_arguments(node)
    return parent if returned == [parent] and written == [parent] else None


__all__ = ["MAX_STEPS", "exposing_bases"]
