"""Graph hygiene: the one dead-code step, and the redundant aliases torch.func leaves behind.

Note [Dead code that may go]
----------------------------
make_fx records metadata checks (``is_same_size``, ``_has_same_storage_numel``), copies to the
meta device, ``zeros`` and ``prims`` arithmetic from forward AD's bookkeeping, and views that
nothing reads. Each costs a dispatch per call (under vmap, a batching rule, some of which warn),
so a rewritten graph should not carry them. But a node without users is not always dead: a
random op advances the generator (dropping it shifts every later random number against eager
PyTorch), an in-place op writes memory someone else reads, an assert raises. So a node is
erased only when it is *provably pure*: an aten-style operator whose schema writes nothing and
returns something, that is not random (tag ``nondeterministic_seeded``) and that torch does not
list as side-effectful, a ``getitem`` on any aten-style operator's tuple of results, or Python
arithmetic on symbolic sizes (which a rewrite may leave unread).
Anything else without users (Python functions, methods, modules, higher-order ops) stays: we
cannot prove it pure. Nodes are visited in reverse, so a chain of dead pure nodes goes in one
sweep.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..compat.torch_internals import OpOverload, is_impure, op_schema, unsafe_view
from ..graph_edits import OutputDeferringReplacer
from ..op_tables import METADATA_MUTATIONS

aten = torch.ops.aten

#: Python arithmetic that graphs with symbolic shapes apply to sizes (``sym_size - 2``).
_SIZE_ARITHMETIC = frozenset(
    {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
)


def is_provably_pure(node: torch.fx.Node) -> bool:
    """Whether ``node`` may be erased when nothing reads it (see Note [Dead code that may go]).

    Example::

        >>> [n.name for n in gm.graph.nodes if is_provably_pure(n)]
        ['zeros', 'is_same_size', 'select']
    """
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:  # picking from an operator's tuple of results reads nothing
        parent = node.args[0]
        return isinstance(parent, torch.fx.Node) and isinstance(parent.target, OpOverload)
    if target in _SIZE_ARITHMETIC:  # a symbolic size computed from others: Python on SymInts
        return isinstance(node.meta.get("val"), (torch.SymInt, int))
    if not isinstance(target, OpOverload):
        return False
    schema = op_schema(target)
    return (
        bool(schema.returns)
        and not schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and not is_impure(target, args=node.args, kwargs=node.kwargs, impure_random=True)
    )


def remove_dead_pure_nodes(gm: torch.fx.GraphModule, recompile: bool = True) -> bool:
    """Erase the provably pure nodes of ``gm`` that nothing reads, in place; whether any went.

    Random, in-place and other side-effecting nodes stay even when unused.
    ``recompile=False`` leaves ``gm.recompile()`` to the caller.

    Example::

        >>> remove_dead_pure_nodes(fxviews.trace(push_jvp, x, y, yt))
        True
    """
    erased = False
    for node in reversed(list(gm.graph.nodes)):
        if not node.users and is_provably_pure(node):
            gm.graph.erase_node(node)
            erased = True
    if erased and recompile:
        gm.recompile()
    return erased


#: View ops that return an alias of their input when their result has its input's shape:
#: expanding or reshaping a tensor to the shape it has (matmul's decomposition does it).
_VIEWS_TO_OWN_SHAPE = frozenset(
    {aten.expand.default, aten.view.default, aten.reshape.default, unsafe_view}
)


def _is_alias(node: torch.fx.Node) -> bool:
    """``alias(a)``, or a view op that gives ``a`` its own shape: ``a``'s memory and layout."""
    if node.target is aten.alias.default:
        return True
    if node.target not in _VIEWS_TO_OWN_SHAPE or not isinstance(node.args[0], torch.fx.Node):
        return False
    result, source = node.meta.get("val"), node.args[0].meta.get("val")
    if not isinstance(result, torch.Tensor) or not isinstance(source, torch.Tensor):
        return False
    shapes = (*result.shape, *source.shape)
    return all(isinstance(size, int) for size in shapes) and result.shape == source.shape


def drop_redundant_aliases(gm: torch.fx.GraphModule, recompile: bool = True) -> bool:
    """Replace ``alias(a)`` by ``a`` wherever nobody can tell them apart, in place; likewise a
    view of ``a`` to its own shape (``expand``, ``view``, ``reshape``, ``_unsafe_view``),
    which is an alias of it for every layout (under ``vmap`` too: the shapes are per sample).

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
        if node.op != "call_function" or not _is_alias(node):
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
