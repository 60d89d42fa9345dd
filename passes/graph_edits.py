"""Small graph utilities shared by the passes: reading arguments, describing calls for records,
linear output replacement."""

from __future__ import annotations

import contextlib
import copy
import gc
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .compat.torch_internals import OpOverload, op_schema
from .errors import FxViewsError

#: What ``Node.target`` holds: the op of a ``call_function``, the name of a method or module.
Target = Callable[..., Any] | str

# The end aten's slice records for "to the end": `x[1:]` traces to slice(x, 0, 1, 2**63 - 1).
_SLICE_TO_THE_END = 2**63 - 1


class OutputDeferringReplacer:
    """Replace every use of nodes, remapping the output node's arguments once, at the end.

    ``Node.replace_all_uses_with`` rewrites each user's arguments, so replacing N nodes that a
    graph returns costs N passes over an output node of N arguments. Passes that replace many
    nodes use this instead, then call :meth:`finish`.

    Example::

        >>> replacer = OutputDeferringReplacer(gm.graph)
        >>> replacer.replace(old, new)   # every user but the output, now
        >>> replacer.finish()            # the output, once; `old` has no users left
    """

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.output = graph.output_node()
        self.pending: dict[torch.fx.Node, torch.fx.Node] = {}

    def replace(self, old: torch.fx.Node, new: torch.fx.Node) -> None:
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user is not self.output)
        if self.output in old.users:
            self.pending[old] = new

    def finish(self) -> list[torch.fx.Node]:
        """Remap the output; returns the replaced nodes it still held (now without users)."""
        pending, self.pending = self.pending, {}
        if pending:
            self.output.args = torch.fx.node.map_arg(self.output.args, lambda n: pending.get(n, n))
        return list(pending)


def copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A deep copy of ``graph`` to edit, its nodes named as in ``graph``, without torch's
    warning about copying pytree specs.

    FX names the nodes a copy creates afresh, and a fresh name never shadows a Python builtin:
    a placeholder ``input`` becomes ``input_1``. torch.export names placeholders after the
    forward's arguments (``nn.Linear``'s is ``input``) and its signature refers to them by
    name, so the copy takes back each original name (unique in ``graph``, so in the copy).

    Example::

        >>> work = torch.fx.GraphModule(gm, copy_graph(gm.graph))
        >>> [n.name for n in work.graph.nodes] == [n.name for n in gm.graph.nodes]
        True
    """
    with collector_paused(), pytree_spec_copies():
        copied = copy.deepcopy(graph)
    for original, node in zip(graph.nodes, copied.nodes, strict=True):
        if node.name != original.name:
            node.name = original.name
    return copied


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """CPython's cyclic garbage collector paused in the block (as it was after it).

    Note [Graph edits and the cyclic collector]: copying or editing a graph allocates
    containers by the thousand (nodes, their argument tuples, users and meta dicts) and frees
    almost none, so the collections those allocations trigger find nothing to free, and each
    full collection scans the whole heap, which holds the traced graph and its fake tensors.
    The larger the graph, the more each scan costs: on a 100k-node graph they took a quarter
    of ``rewrite`` (none measurable at 10k nodes), making the pass superlinear. Pausing
    changes no result: memory is freed by reference counting as before, and cycles (erased
    nodes) by the next collection after the block.

    Example::

        >>> with collector_paused():
        ...     work = copy.deepcopy(gm.graph)
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:  # a caller that paused it before us re-enables it
            gc.enable()


@contextlib.contextmanager
def pytree_spec_copies() -> Iterator[None]:
    """Copying torch's own pytree specs, without the deprecation torch warns of for it.

    ``Graph.__deepcopy__`` (for a graph make_fx traced over nested inputs) and
    ``ExportedProgram.run_decompositions`` deep-copy pytree specs, which goes through a
    constructor torch deprecates (torch 2.13): a FutureWarning about torch's own code on every
    copy. Only that exact warning is ignored, and only inside the block.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _TREESPEC_DEPRECATION, FutureWarning)
        yield


_TREESPEC_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def argument_nodes(args: Any) -> list[torch.fx.Node]:
    """The nodes inside ``args`` (nested lists, tuples and dicts included), in order."""
    found: list[torch.fx.Node] = []

    def keep(node: torch.fx.Node) -> torch.fx.Node:
        found.append(node)
        return node

    torch.fx.node.map_arg(args, keep)
    return found


def input_node(node: torch.fx.Node) -> torch.fx.Node:
    """The graph value ``node`` reads first (``node.args[0]``): a view's or a copy's input.

    Example::

        >>> input_node(select_node).name
        'clone'
    """
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node):
        raise FxViewsError(f"node {node.name!r} reads {source!r}, not a value of its graph")
    return source


def tensor_val(node: Any) -> torch.Tensor | None:
    """The traced tensor ``meta["val"]`` of ``node``, or None (not a node, or not a tensor).

    Example::

        >>> tensor_val(clone_node).shape
        torch.Size([2, 6])
    """
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def traced_tensor(node: torch.fx.Node) -> torch.Tensor:
    """``node``'s traced tensor, which the caller knows it has (else an internal error).

    Example::

        >>> traced_tensor(clone_node).stride()
        (6, 1)
    """
    val = tensor_val(node)
    if val is None:
        raise FxViewsError(f"internal: node {node.name!r} has no tensor metadata")
    return val


def arguments_by_name(node: torch.fx.Node, op: OpOverload) -> dict[str, Any]:
    """``node``'s arguments, positional and keyword alike, by the names in ``op``'s schema."""
    # strict=False: arguments left to their defaults are not in node.args.
    names = (a.name for a in op_schema(op).arguments)
    bound: dict[str, Any] = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


def op_name(op: Target) -> str:
    """An op's short name: ``aten.select.int`` -> ``select``, ``operator.getitem`` -> getitem."""
    return op if isinstance(op, str) else op.__name__.split(".")[0]


def describe_call(
    op: Target, args: Sequence[object], kwargs: Mapping[str, object] | None = None
) -> str:
    """``op(*args, **kwargs)`` as a reader writes it, for records: ``select(clone, 0, 0)``.

    The one formatter of node descriptions. Nodes show as their names (an argument may also
    be the description of another call), ``getitem`` as indexing (``split[1]``), and a slice to
    the end leaves its end out (``slice(x, 0, 1)``, or ``slice(x, 0, 1, None, 2)`` where a step
    follows).

    Example::

        >>> describe_call(aten.clone.default, [x], {"memory_format": torch.contiguous_format})
        'clone(x, memory_format=torch.contiguous_format)'
    """
    words = [_word(a) for a in args]
    if op is operator.getitem:
        return f"{words[0]}[{words[1]}]"
    if op is torch.ops.aten.slice.Tensor and len(args) > 3 and _is_to_the_end(args[3]):
        has_step = len(args) > 4 and args[4] != 1
        words[3:] = ["None", words[4]] if has_step else []
    words += [f"{name}={_word(value)}" for name, value in (kwargs or {}).items()]
    return f"{op_name(op)}({', '.join(words)})"


def _word(argument: object) -> str:
    return argument.name if isinstance(argument, torch.fx.Node) else str(argument)


def _is_to_the_end(end: object) -> bool:
    return isinstance(end, int) and end >= _SLICE_TO_THE_END
