"""Graph hygiene: drop the dead metadata checks torch.func tracing leaves behind.

make_fx records ``is_same_size``/``_has_same_storage_numel`` checks, ``alias`` nodes and
``_to_copy`` calls to the meta device that nothing reads. They cost a dispatch each at run time
(under vmap, a batching rule each), so a rewritten graph should not carry them.
"""
from __future__ import annotations

import torch
import torch.fx

from .view_chain import is_view_op

aten = torch.ops.aten

_METADATA_CHECKS = {
    aten.is_same_size.default,
    aten._has_same_storage_numel.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_storage_offset.default,
    aten.sym_numel.default,
}


def _is_dead_check(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.users:
        return False
    target = node.target
    if target in _METADATA_CHECKS:
        return True
    if target is aten._to_copy.default and str(node.kwargs.get("device")) == "meta":
        return True
    # A dead view aliases and computes nothing; views never write (is_view_op checks that).
    return is_view_op(target)


def eliminate_dead_metadata_checks(gm: torch.fx.GraphModule, recompile: bool = True) -> bool:
    """Erase dead metadata checks, dead views and dead meta copies from ``gm``, in place.

    Returns whether anything was erased. Nodes with side effects are never touched.
    ``recompile=False`` leaves ``gm.recompile()`` to the caller.

    Example::

        >>> eliminate_dead_metadata_checks(fxviews.trace(push_jvp, x, y, yt))
        True
    """
    erased = False
    for node in reversed(list(gm.graph.nodes)):
        if _is_dead_check(node):
            gm.graph.erase_node(node)
            erased = True
    if erased and recompile:
        gm.recompile()
    return erased
