"""The layout a call's tensors bring: part of ``transform``'s key, the samples its trace runs on,
and the storage offsets a graph is held to.

Note [The layout of a call]
---------------------------
A graph traced on one layout bakes in more than the ``as_strided`` calls the engine rewrites
and the reshape-like calls that decide at run time (Note [Layout decisions at run time]):
everything the trace read of its inputs' layouts holds for that layout only. A kernel's output
follows its input's layout (``roll`` keeps channels_last, ``copysign`` a transposed input's
order), and a user's own ``as_strided`` then reads that output's memory raw; Python may read
``stride()`` or ``is_contiguous()``; autograd's formulas inside ``fn`` decide their own views
and copies. Eager reads each call's layout afresh. So ``transform`` keys and traces each tensor
argument by what its layout means for the call:

1. **Called directly** (no ``vmap`` batches it; ``grad`` or ``jvp`` may wrap it): the layout is
   a fact of the call. The key holds the tensor's strides, and the trace runs on a fresh tensor
   of exactly its geometry (sizes, strides and storage offset, over a storage of its own that
   holds the same memory from the offset to the last element), so the graph computes what eager
   computes on that argument, a user's ``as_strided`` over it included.
2. **Batched by vmap**, at any level: each sample is traced as a fresh contiguous tensor at
   offset 0, as the README documents, so an ``as_strided`` in ``fn`` reads each sample as if it
   were contiguous (the physical layout is vmap's there, not the user's). Its key holds those
   contiguous strides, so a direct call on a contiguous tensor shares its graph; the user's
   reshape-like calls still decide view or copy per sample when the graph runs.
3. **Storage offsets** are not in the key: a loop over slices of one buffer would retrace at
   every step. A graph depends on an argument's offset only where it reads the argument's memory
   by absolute position: through an ``as_strided``-family node over the argument or a view of
   it, or where Python read a ``storage_offset()`` of it. Such a graph is held to the offsets it
   was traced with (:func:`offset_bound_inputs`): a call at another offset traces again.
4. **The hot call** (Note [The cached call]) checks the strides of directly called tensors in
   its C++ check; a batched tensor's per-sample strides change with the batch size and are left
   out, as from its key. Dynamo's check tells a BatchedTensor from a plain tensor, but not a
   ``grad`` or ``jvp`` wrapper of one from a wrapper of the other: where a call passes such
   wrappers, :func:`hot_check` asks each whether it is batched too, and it checks the offsets a
   graph is held to of the tensors called directly (a batched one's is always 0).

What a trace on exact geometry costs: a recording holds the sample's storage from offset 0 to
its last element (a slice deep into a large buffer may exceed the recording limit and trace in
fake mode, which holds no memory), and each distinct strides of a directly called argument is
one trace.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxviews.guards import same_kind_check
from fxviews.layout_decisions import LAYOUT_READ, OFFSET_READ
from fxviews.passes.op_tables import AS_STRIDED_OPS
from fxviews.passes.torch_internals import (
    FakeTensor,
    FakeTensorMode,
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    make_contiguous_strides_for,
    storage_identity,
)

__all__ = [
    "fake_sample",
    "hot_check",
    "is_batched",
    "layout_bound_constants",
    "layout_key",
    "offset_bound_inputs",
    "offsets_hold",
    "offsets_of",
    "real_sample",
    "sample_bytes",
]

#: Offsets a graph is held to: (graph input position, storage offset) pairs.
Offsets = tuple[tuple[int, int], ...]


def is_batched(tensor: Any) -> bool:
    """Whether ``tensor`` is batched by a ``vmap`` at any level of the transforms around it.

    Example::

        >>> torch.func.vmap(lambda x: torch.tensor(is_batched(x)))(torch.ones(2, 3))
        tensor([True, True])
    """
    while isinstance(tensor, torch.Tensor) and is_functorch_wrapped_tensor(tensor):
        if is_batchedtensor(tensor):
            return True
        tensor = get_unwrapped(tensor)
    return False


def layout_key(tensor: torch.Tensor) -> Any:
    """The part of ``tensor``'s layout that selects a graph: the strides of the sample it is
    traced on, its own where it is called directly, contiguous ones where vmap batches it (see
    the Note).

    Example::

        >>> layout_key(torch.ones(2, 3).t())
        (1, 3)
    """
    if is_batched(tensor):
        return tuple(make_contiguous_strides_for(tensor.shape))
    return tensor.stride() if tensor.layout == torch.strided else None


def _innermost(tensor: torch.Tensor) -> torch.Tensor:
    while is_functorch_wrapped_tensor(tensor):
        tensor = get_unwrapped(tensor)
    return tensor


def _traced_exactly(value: torch.Tensor) -> bool:
    """Whether ``value`` is traced on its own geometry: called directly, strided, and a plain or
    fake tensor (a subclass such as DTensor is traced on a plain tensor of its logical shape)."""
    if is_batched(value):
        return False
    inner = _innermost(value)
    plain = type(inner) in (torch.Tensor, torch.nn.Parameter) or isinstance(inner, FakeTensor)
    return inner.layout == torch.strided and plain


def _extent(tensor: torch.Tensor) -> int:
    """How many elements from its storage offset ``tensor``'s geometry spans (0 if empty)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))


def sample_bytes(value: torch.Tensor) -> int:
    """The bytes a recording's sample of ``value`` holds (see :func:`real_sample`)."""
    if not _traced_exactly(value):
        return value.numel() * value.element_size()
    inner = _innermost(value)
    return int(inner.storage_offset() + _extent(inner)) * inner.element_size()


def real_sample(value: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """A fresh tensor a recording runs on for argument ``value``, holding ``sample``'s values (one
    sample of it, unwrapped): contiguous where vmap batches ``value``, else of ``sample``'s exact
    geometry over a storage of its own holding the same memory from the offset on.

    Example::

        >>> x = torch.arange(12.0).view(3, 4)[:, 1:3]
        >>> copy = real_sample(x, x)
        >>> copy.stride(), copy.storage_offset(), torch.equal(copy, x)
        ((4, 1), 1, True)
    """
    with torch.no_grad():
        if not _traced_exactly(value):
            return sample.detach().clone(memory_format=torch.contiguous_format)
        offset, extent = sample.storage_offset(), _extent(sample)
        memory = torch.empty(offset + extent, dtype=sample.dtype, device=sample.device)
        if extent:  # the memory the geometry spans, gaps between its elements included
            memory[offset:].copy_(sample.detach().as_strided((extent,), (1,), offset))
        return _over(memory, sample)


def fake_sample(value: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
    """A fake tensor of ``mode`` a fake-mode trace runs on for argument ``value``: contiguous
    where vmap batches it, else of its exact geometry over a storage of its storage's size."""
    if not _traced_exactly(value):
        with mode:
            return torch.empty(value.shape, dtype=value.dtype, device=value.device)
    inner = _innermost(value)
    elements = inner.untyped_storage().nbytes() // inner.element_size()
    with mode:
        memory = torch.empty(elements, dtype=value.dtype, device=value.device)
        return _over(memory, inner)


def _over(memory: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s geometry over ``memory``'s storage, not a view of ``memory``: the
    traced function may write it in place, which autograd refuses (or make_fx records as an
    ``as_strided`` of the base) for a view of a tensor the trace did not make."""
    fresh = torch.empty(0, dtype=like.dtype, device=memory.device)
    return fresh.set_(memory.untyped_storage(), like.storage_offset(), like.shape, like.stride())


def offset_bound_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of ``gm``'s inputs whose storage offset the graph depends on: inputs an
    ``as_strided``-family node reads through a view, or whose offset Python read (see the Note).

    Example::

        >>> offset_bound_inputs(fxviews.trace(lambda x: x.as_strided((2,), (1,), 0), x))
        [0]
    """
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    storages = {_storage(node): i for i, node in enumerate(placeholders)}
    storages.pop(None, None)
    bound: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in AS_STRIDED_OPS:
            read = node.args[0]
        elif node.meta.get(OFFSET_READ):
            read = node
        else:
            continue
        position = storages.get(_storage(read)) if isinstance(read, torch.fx.Node) else None
        if position is not None:
            bound.add(position)
    return sorted(bound)


def layout_bound_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm`` holds (its ``get_attr`` constants: a module's parameters, a closed-over
    tensor) whose layout the graph depends on: an ``as_strided``-family node reads their memory
    through a view, or Python read their strides, contiguity or offset while it was traced.

    ``model.to(memory_format=torch.channels_last)`` swaps such a parameter's ``.data`` for
    another layout, under the same object: eager then reads other memory, or takes the other
    branch, so ``transform``'s guard holds these tensors' strides and offsets.

    Example::

        >>> w = torch.randn(4, 4)
        >>> layout_bound_constants(fxviews.trace(lambda x: x + w.as_strided((4,), (5,)), x))
        [tensor(...)]  # w
    """
    constants = [node for node in gm.graph.nodes if node.op == "get_attr"]
    storages = {_storage(node): node for node in constants}
    storages.pop(None, None)
    bound = {node for node in constants if node.meta.get(LAYOUT_READ)}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in AS_STRIDED_OPS:
            read = node.args[0]
            held = storages.get(_storage(read)) if isinstance(read, torch.fx.Node) else None
            if held is not None:
                bound.add(held)
    tensors: list[Any] = [
        functools.reduce(getattr, str(node.target).split("."), gm)
        for node in constants
        if node in bound
    ]
    return [t for t in tensors if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def _storage(node: torch.fx.Node) -> int | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    return storage_identity(value)


def offsets_of(tensors: Sequence[torch.Tensor], positions: Sequence[int]) -> Offsets:
    """The offsets a graph traced on ``tensors`` is held to, of those at ``positions``."""
    return tuple((i, _traced_offset(tensors[i])) for i in positions)


def offsets_hold(tensors: Sequence[Any], offsets: Offsets) -> bool:
    """Whether ``tensors`` are traced at the storage offsets a graph is held to."""
    return all(_traced_offset(tensors[i]) == offset for i, offset in offsets)


def _traced_offset(tensor: torch.Tensor) -> int:
    # A batched sample is traced at offset 0, whatever its physical tensor's offset.
    return int(_innermost(tensor).storage_offset()) if _traced_exactly(tensor) else 0


def hot_check(tensors: Sequence[torch.Tensor], offsets: Offsets) -> Callable[..., bool]:
    """The hot call's check that tensors are of the kind of ``tensors`` (Note [The cached call]):
    Dynamo's C++ check, with the strides of those called directly; where ``tensors`` hold
    grad or jvp wrappers, whether each is batched as its counterpart is; the ``offsets``.

    Example::

        >>> check = hot_check([torch.ones(2, 3)], ())
        >>> check(torch.zeros(2, 3)), check(torch.zeros(3, 2).t())
        (True, False)
    """
    batched = [is_batched(t) for t in tensors]
    strides = [None if b else layout_key(t) for t, b in zip(tensors, batched, strict=True)]
    same_kind = same_kind_check(tensors, strides)
    wrappers = tuple(
        (i, batched[i])
        for i, t in enumerate(tensors)
        if is_functorch_wrapped_tensor(t) and not is_batchedtensor(t)
    )
    # A batched sample is traced at offset 0 whatever its memory (_traced_offset), and a call
    # passing the checks above is batched where these tensors are: only the others' offsets
    # can change.
    offsets = tuple((i, offset) for i, offset in offsets if not batched[i])
    if not wrappers and not offsets:
        return same_kind

    def check(*args: torch.Tensor) -> bool:
        return (
            same_kind(*args)
            and all(is_batched(args[i]) == batched for i, batched in wrappers)
            and offsets_hold(args, offsets)
        )

    return check
