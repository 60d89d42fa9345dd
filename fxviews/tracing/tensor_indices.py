"""Index with a 0-d integer tensor in a graph: the gather eager ``vmap`` runs, not an ``.item()``.

Note [A 0-d integer tensor as an index]
---------------------------------------
Eager PyTorch reads ``x[a]`` with a 0-d integer tensor ``a`` as ``x[a.item()]``, a ``select``
(a view of ``x``), unless ``vmap`` batches ``a``: then ``a`` is an index tensor and ``x[a]``
an ``aten.index`` gather, one element per sample (ATen's ``applySlicing``). fxviews traces on
one unbatched sample, where the ``.item()`` makes every such index a value the graph cannot
hold, so ``q(s)[a]`` (a Q-network's value of the action taken) or ``cache[:, pos] = k`` (a KV
cache written at a tensor position) ran eagerly for good. While tracing,
:class:`TensorIndexGathers` indexes as eager ``vmap`` does:

1. **Which indices.** ``x[...]`` and ``x[...] = v`` whose tensor indices are all 0-d integer
   tensors, beside ints, slices, ``None`` and ``...``. Other index tensors (lists, masks, 1-d
   tensors) place their result dims by rules a 0-d index would change; those are left as
   they are.
2. **The gather.** As ``applySlicing`` does for a batched index: the basic items (each 0-d
   tensor made a ``:``) give a view of ``x``, and ``aten.index`` of that view (``index_put_``
   for a write, its value's leading size-1 dims dropped and its dtype converted, as ``copy_``
   would) takes the 0-d tensors at their dims of it, None elsewhere. 0-d indices broadcast to
   a 0-d result, so the indexed dims go, wherever they are: ``select``'s shape and elements,
   for every value in range, negative ones included. An index out of range raises when the
   graph runs (a RuntimeError where eager raises an IndexError).
3. **Aliasing, checked after the trace.** A gather is a copy where ``select`` is a view of
   ``x``. They differ only where a write reaches one through the other: a write to the result
   (or a view of it), which eager makes in ``x`` too, or a write to ``x``'s memory while the
   result is read after it, which eager's view shows. :func:`refuse_observable_gathers` finds
   those in the graph (:class:`~fxviews.passes.analysis.aliasing.AliasAnalysis`) and refuses
   the trace (:class:`ObservableGather`): the function then runs eagerly, with a message
   naming the line. What stays different: a result the function returns is a new tensor, as
   under eager ``vmap`` with a batched index, where eager returns a view of ``x`` for an
   unbatched one.
   A write (``index_put_``) writes the same elements of ``x`` as eager's ``select`` and
   ``copy_``: nothing to check.

Example::

    >>> q = torch.nn.Linear(4, 3)
    >>> gm = fxviews.trace(lambda s, a: q(s)[a], torch.randn(4), torch.tensor(2))
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"][-2:]
    [aten.view.default, aten.index.Tensor]
"""

from __future__ import annotations

import inspect
import linecache
from typing import Any

import torch
import torch.fx
from torch.overrides import TorchFunctionMode

from fxviews.passes.analysis.aliasing import AliasAnalysis
from fxviews.passes.compat.torch_internals import get_proxy_mode, get_proxy_slot
from fxviews.passes.schema import GATHER_OF_INDEX
from fxviews.passes.source_lines import user_frames
from fxviews.tracing.failures import UserLine
from fxviews.tracing.recording import recorded_node

__all__ = ["ObservableGather", "refuse_observable_gathers", "TensorIndexGathers"]


#: The dtypes of a 0-d tensor ATen reads as an int index (``uint8`` and ``bool`` are masks).
_INTEGER_DTYPES = frozenset(
    {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64}
)
#: Index items that place no index tensor (step 1).
_BASIC_ITEMS = (int, slice, type(None), type(Ellipsis), torch.SymInt)


class ObservableGather(RuntimeError):
    """A gather made for a 0-d tensor index is observable as a copy (step 3 of the Note).

    ``where`` is the user's line that indexed; ``why`` says, in the user's terms, what eager's
    view would have seen.
    """

    def __init__(self, where: UserLine | None, why: str) -> None:
        super().__init__(why)
        self.where = where
        self.why = why


class TensorIndexGathers(TorchFunctionMode):
    """While tracing: ``x[a]`` and ``x[a] = v`` with 0-d integer tensors ``a`` as the gather
    (``index``) and scatter (``index_put_``) eager ``vmap`` runs (see the Note)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ or func is torch.Tensor.__setitem__:
            plan = _plan(args[0], args[1])
            if plan is not None:
                basic, indices = plan
                # Only where a basic item does something: `x[:, :]` would record an alias.
                plain = all(item == slice(None) or item is Ellipsis for item in basic)
                view = args[0] if plain else args[0][basic]
                if func is torch.Tensor.__setitem__:
                    return _scatter(view, indices, args[2])
                return _gather(view, indices)
        return func(*args, **kwargs)


def _plan(x: Any, index: Any) -> tuple[tuple[Any, ...], list[torch.Tensor | None]] | None:
    """``x[index]`` as eager ``vmap`` computes it, where the Note's step 1 applies: the basic
    items (each 0-d tensor made ``:``), and the index list of the view they give (the 0-d
    tensors at their dims of it, None elsewhere); None where step 1 leaves ``index`` alone."""
    items = index if isinstance(index, tuple) else (index,)
    if not isinstance(x, torch.Tensor) or not any(isinstance(i, torch.Tensor) for i in items):
        return None
    dims_taken = 0  # dims of x the items index (ints, slices, tensors; not None or ...)
    for item in items:
        if isinstance(item, torch.Tensor):
            if item.dim() != 0 or item.dtype not in _INTEGER_DTYPES:
                return None
        elif isinstance(item, bool) or not isinstance(item, _BASIC_ITEMS):
            return None
        dims_taken += item is not None and item is not Ellipsis
    basic: list[Any] = []
    indices: list[torch.Tensor | None] = []  # by dim of the view the basic items give
    for item in items:
        if isinstance(item, torch.Tensor):
            indices.append(item)
            basic.append(slice(None))
        elif item is Ellipsis:
            indices += [None] * (x.dim() - dims_taken)
            basic.append(item)
        else:
            indices += [] if isinstance(item, (int, torch.SymInt)) else [None]
            basic.append(item)
    while indices[-1] is None:  # as ATen's applySlicing leaves them: up to the last tensor
        indices.pop()
    return tuple(basic), indices


def _gather(view: torch.Tensor, indices: list[torch.Tensor | None]) -> torch.Tensor:
    gathered = torch.ops.aten.index.Tensor(view, indices)
    node = _node_made_for(gathered)
    if node is not None:
        node.meta[GATHER_OF_INDEX] = _indexing_line()
    return gathered


def _scatter(view: torch.Tensor, indices: list[torch.Tensor | None], value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=view.dtype, device=view.device)
    # As eager's copy_ into the view: leading size-1 dims of the value beyond the view's dims
    # dropped (ATen's slicePrefix1sSize), its dtype and device converted.
    selected_dims = view.dim() - sum(index is not None for index in indices)
    while value.dim() > selected_dims and value.shape[0] == 1:
        value = value.squeeze(0)
    torch.ops.aten.index_put_(view, indices, value.to(dtype=view.dtype, device=view.device))


def _node_made_for(tensor: torch.Tensor) -> torch.fx.Node | None:
    """The graph node a recording or make_fx made for ``tensor``, if one is tracing."""
    node = recorded_node(tensor)
    if node is not None:
        return node
    mode = get_proxy_mode()
    slot = get_proxy_slot(tensor, mode.tracer, None) if mode is not None else None
    return slot.proxy.node if slot is not None else None


def _indexing_line() -> UserLine | None:
    """The user's line running now (the innermost frame of the user's code)."""
    frames = user_frames(inspect.currentframe())
    if not frames:
        return None
    file, line, function = frames[-1]
    return UserLine(file, line, function, linecache.getline(file, line).strip(), None)


def refuse_observable_gathers(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`ObservableGather` where a gather made for a 0-d tensor index would read
    otherwise than eager's view (step 3 of the Note)."""
    gathers = [node for node in gm.graph.nodes if GATHER_OF_INDEX in node.meta]
    if not gathers:
        return
    analysis = AliasAnalysis(gm.graph)
    position = analysis.position
    for node in gathers:
        where = node.meta[GATHER_OF_INDEX]
        if any(position[w] > position[node] for w in analysis.writers.get(analysis.root[node], ())):
            raise ObservableGather(
                where,
                "the result is written in place afterwards, which eager makes in the indexed "
                "tensor through its view",
            )
        base = node.args[0]
        reads = [position[user] for alias in analysis.derived_closure(node) for user in alias.users]
        last_read = max(reads, default=-1)  # the output node, where the function returns it
        if isinstance(base, torch.fx.Node) and any(
            position[node] < position[writer] < last_read
            for writer in analysis.writers.get(analysis.root[base], ())
        ):
            raise ObservableGather(
                where,
                "the indexed tensor is written in place afterwards while the result is still "
                "read, which eager's view would show",
            )
