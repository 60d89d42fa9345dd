"""Graph hygiene: drop the dead metadata checks and redundant aliases torch.func leaves behind.

make_fx records ``is_same_size``/``_has_same_storage_numel`` checks, ``alias`` nodes and
``_to_copy`` calls to the meta device that nothing reads, and ``alias`` nodes in front of values
that nothing else holds. They cost a dispatch each at run time (under vmap, a batching rule
each), so a rewritten graph should not carry them.
"""
from __future__ import annotations

import torch
import torch.fx

from .graph_edits import OutputDeferringReplacer
from .torch_internals import has_same_storage_numel, to_copy
from .view_chain import METADATA_MUTATIONS, is_view_op

aten = torch.ops.aten

_METADATA_CHECKS = {
    aten.is_same_size.default,
    has_same_storage_numel,
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
    if target is to_copy and str(node.kwargs.get("device")) == "meta":
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


def drop_redundant_aliases(gm: torch.fx.GraphModule, recompile: bool = True) -> bool:
    """Replace ``alias(a)`` by ``a`` wherever nobody can tell them apart, in place.

    An alias has its input's memory and layout, so an op that reads it or writes its values
    sees the same either way. Kept are aliases whose users change metadata in place
    (``t_``, ``as_strided_``, ...: they would restride ``a`` itself), and aliases returned as
    outputs when ``a`` is a graph input or parameter, or is returned in another place too:
    there, a fresh tensor object is part of what the caller sees.

    Example::

        >>> drop_redundant_aliases(fxviews.rewrite(fxviews.trace(push_jvp, x, y, yt)).graph_module)
        True
    """
    replacer = OutputDeferringReplacer(gm.graph)
    output = replacer.output
    returned: dict[torch.fx.Node, int] = {}
    torch.fx.node.map_arg(output.args, lambda n: returned.__setitem__(n, returned.get(n, 0) + 1))
    dropped = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.alias.default:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node):
            continue
        if any(user.target in METADATA_MUTATIONS for user in node.users):
            continue
        if output in node.users:
            if source.op in ("placeholder", "get_attr") or returned.get(source, 0) > 0:
                continue
            # `source` now stands where the alias was returned: a second alias of it may not.
            returned[source] = returned.pop(node, 0)
        replacer.replace(node, source)
        dropped.append(node)
    replacer.finish()
    for node in reversed(dropped):
        gm.graph.erase_node(node)
    removed = bool(dropped)
    if removed and recompile:
        gm.recompile()
    return removed
