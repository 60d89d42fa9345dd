"""Compute once what a graph computes from no input: a causal mask, a table of positions.

Note [Results that depend on no input]
--------------------------------------
Code builds tensors from sizes alone on every call (``torch.ones(t, t).tril()`` for a causal
mask, ``torch.arange(t)`` for positions), and a recorded graph replays each op every time it
runs, under ``vmap`` through the batching machinery too. Where the graph is only run (the
transform's cached graph), such a result is computed once, when the graph is built, and read
as a constant:

1. **What may be computed once.** A node whose every tensor argument is itself computed once
   (so it depends on no placeholder and no ``get_attr``: a parameter or buffer may change
   between calls; ``new_zeros``, ``new_ones`` and ``new_full`` read only the dtype and device
   of theirs, fixed for the graph's signature), whose op is provably pure
   (:func:`~.hygiene.is_provably_pure`: no write, not random, no side effect) and not
   ``empty``-like (whose values are whatever the memory held).
   A node whose memory the graph writes anywhere (an in-place op on it or on a view of it:
   ``jacfwd``'s basis is ``new_zeros`` with its diagonal filled) has no one value, and is not
   computed once: neither is anything read from it.
2. **What is replaced.** The frontier: such nodes read by a node that is not computed once.
   Each becomes a ``get_attr`` of its value, unless the graph returns it or another view of its
   memory (the caller would get the same tensor from every call) or it holds over
   :data:`MAX_BYTES` (a constant lives as long as the graph). The nodes only the frontier read
   are then dead.
3. **How it is computed.** By running the nodes' ops in graph order on their values, outside
   every mode, with autocast off (the recorded ops already hold the casts autocast made):
   the values the graph would compute on any call, since nothing they read can change.
   Nothing is folded while autocast is on (its state is the graph's to run in, not ours to
   reproduce).

Checked: ``tests/test_opinfo_steps.py`` runs the graph of every OpInfo sample (float32, CPU;
a fixed share under ``make test``, all under ``make fuzz``) with and without this step, on the
traced sample, on another and under ``vmap``, and requires the same results bit for bit (or
the same error); ``tests/test_run_only_steps.py`` checks the cases above one by one.

Example::

    >>> fold_input_free_results(gm)   # ones -> tril -> bitwise_not: one constant mask
    1
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from ..analysis.aliasing import AliasAnalysis
from ..compat.torch_internals import OpOverload, disable_current_modes
from ..rewrites.hygiene import is_provably_pure, remove_dead_pure_nodes

__all__ = ["MAX_BYTES", "fold_input_free_results"]

#: Factories that read of their tensor argument only its dtype and device (both fixed for
#: the graph's signature): ``x.new_zeros(())``, the start of a running sum.
_NEW_FROM = frozenset(
    {torch.ops.aten.new_zeros.default, torch.ops.aten.new_ones.default,
     torch.ops.aten.new_full.default}
)  # fmt: skip
#: The largest result kept as a constant: it holds memory for as long as the graph lives.
MAX_BYTES = 2**20


def fold_input_free_results(gm: torch.fx.GraphModule) -> int:
    """Replace the results of ``gm`` that depend on no input by constants, in place (see the
    Note); returns how many. The caller recompiles."""
    if any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda")):
        return 0
    analysis = AliasAnalysis(gm.graph)
    once: dict[torch.fx.Node, None] = {}  # in graph order: arguments come first
    for node in gm.graph.nodes:
        read = node.all_input_nodes[1:] if node.target in _NEW_FROM else node.all_input_nodes
        if (
            _pure_tensor_op(node)
            and not analysis.writers.get(analysis.root[node])  # one value all along
            and all(argument in once for argument in read)
        ):
            once[node] = None
    frontier = [n for n in once if any(user not in once for user in n.users)]
    frontier = [n for n in frontier if _may_be_constant(n, analysis)]
    if not frontier:
        return 0
    values = _compute(list(once))
    for number, node in enumerate(frontier):
        name = f"_fxviews_folded{number}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, values[node], persistent=False)
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(name)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
    remove_dead_pure_nodes(gm, recompile=False)
    return len(frontier)


def _pure_tensor_op(node: torch.fx.Node) -> bool:
    """A provably pure aten op with a tensor result whose values are defined (step 1)."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return False
    if "empty" in node.target.overloadpacket.__name__ or not is_provably_pure(node):
        return False
    return isinstance(node.meta.get("val"), torch.Tensor)


def _may_be_constant(node: torch.fx.Node, analysis: AliasAnalysis) -> bool:
    value = node.meta["val"]
    if value.numel() * value.element_size() > MAX_BYTES:
        return False
    members = analysis.members[analysis.root[node]]
    return not any(member in analysis.outputs for member in members)


def _compute(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
    values: dict[torch.fx.Node, Any] = {}
    with disable_current_modes(), torch.no_grad():
        for node in nodes:
            known: Mapping[torch.fx.Node, Any] = values
            source = node.args[0] if node.target in _NEW_FROM else None
            if isinstance(source, torch.fx.Node) and source not in values:
                # Not computed once (an input): only its dtype and device are read, so an empty
                # tensor of those stands in, for this node alone. Kept out of ``values``, which
                # holds the value of each node computed once: later nodes read those.
                like = source.meta["val"]
                empty = torch.empty(0, dtype=like.dtype, device=like.device)
                known = collections.ChainMap({source: empty}, values)
            args = torch.fx.node.map_arg(node.args, known.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, known.__getitem__)
            values[node] = node.target(*args, **kwargs)  # type: ignore[operator]
    return values
