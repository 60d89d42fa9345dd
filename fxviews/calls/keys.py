"""The signature a transformed function's call is cached under (Note [The cached call] in
``fxviews/calls/cache.py``): what of its arguments selects a graph.

Note [Keys of the user's objects]
---------------------------------
A non-tensor argument is part of the signature: by value where Python's or PyTorch's own types
define it (numbers, strings, dtypes, devices; a float by its repr, so the sign of a zero
counts), by identity where it is unhashable or its ``__hash__`` raises or lies (two reads
differ), and by value otherwise, through its own ``==`` made safe: a dict compares keys with
``==``, and an ``==`` of the user's may raise or return an array (NumPy's), on the second call
with another object of equal hash. Such a comparison is "not equal": the call traces its own
graph, never an error of fxviews'. A call whose arguments cannot be flattened or keyed at all
(a container of the user's whose iteration raises) runs eagerly, saying why (:mod:`.cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxviews.passes.compat.torch_internals import (
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    make_contiguous_strides_for,
)
from fxviews.state.guard import same_kind_check
from fxviews.state.reachable import of_type
from fxviews.tracing.samples import is_batched, traced_offset, untraced_kind

__all__ = [
    "hot_check",
    "layout_key",
    "leaf_key",
    "Offsets",
    "offsets_hold",
    "offsets_of",
    "positional_key",
    "tensor_key",
]


def positional_key(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The key of a call of positional tensors only (Note [The cached call] in
    ``fxviews/calls/cache.py``); None for any other call.

    Example::

        >>> positional_key((torch.ones(2),)) == positional_key((torch.zeros(2),))
        True
    """
    if not all(of_type(arg, torch.Tensor) for arg in args):
        return None
    return tuple(map(tensor_key, args))


def tensor_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What of ``tensor`` selects a graph: its logical sizes, dtype, device, requires_grad,
    traced layout, lazy bits and whether it is a Parameter."""
    # Logical metadata: inside vmap/grad these are the wrapper's, which is what fn sees. A
    # torch.Size hashes and compares as the tuple of its sizes. requires_grad: the trace's
    # tensors require grad where the call's do (Note [What autograd sees is part of the trace]).
    # The layout: Note [The layout of a call]. The lazy conjugate and negative bits: such a
    # call runs eagerly (transforming._check_no_lazy_bits), a plain one of the same values
    # does not. A Parameter's sample is one to isinstance (requiring_grad_like).
    kind = untraced_kind(tensor)
    if kind is not None:  # runs eagerly (Note [The layout of a call]); its sizes may not read
        return (kind, type(tensor), tensor.dtype, tensor.device, tensor.requires_grad)
    return (
        tensor.shape,
        tensor.dtype,
        tensor.device,
        tensor.requires_grad,
        layout_key(tensor),
        tensor.is_conj() or tensor.is_neg(),
        type(tensor) is torch.nn.Parameter,
    )


def leaf_key(leaf: Any, keepalive: list[Any]) -> Any:
    """The key of one leaf of a call's arguments (Note [Keys of the user's objects]); one keyed
    by identity is appended to ``keepalive`` (whose holder keeps its id unique).

    Example::

        >>> leaf_key(0.0, []) == leaf_key(-0.0, [])
        False
    """
    kind = type(leaf)
    if issubclass(kind, torch.Tensor):
        return (torch.Tensor, tensor_key(leaf))
    if kind is float or kind is complex:
        # 0.0 == -0.0, but a graph bakes the sign in (atan2, division, copysign).
        return (kind, leaf, repr(leaf))
    if kind in _VALUE_KEYS:
        # The type keeps 1, 1.0 and True apart: they hash equal but trace differently.
        return (kind, leaf)
    try:
        hashed = hash(leaf)
        steady = hash(leaf) == hashed
    except Exception:  # noqa: BLE001 - unhashable, or a __hash__ of the user's that raises
        steady = False
    if not steady:
        keepalive.append(leaf)
        return (kind, "id", id(leaf))
    return (kind, _ByValue(leaf, hashed))


#: Leaves keyed by their own value: the types whose ``==`` and ``hash`` are Python's or
#: PyTorch's.
_VALUE_KEYS = frozenset(
    {type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.layout,
     torch.memory_format, torch.Size}
)  # fmt: skip


class _ByValue:
    """Another object as a key, by its value, its ``==`` made safe (Note [Keys of the user's
    objects]): equal only where ``==`` says True; never raising."""

    __slots__ = ("hashed", "value")

    def __init__(self, value: Any, hashed: int) -> None:
        self.value, self.hashed = value, hashed

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        if type(other) is not _ByValue:
            return False
        if other.value is self.value:
            return True
        try:
            return bool(self.value == other.value)
        except Exception:  # noqa: BLE001 - an == of the user's that raises, or returns an array
            return False


#: Offsets a graph is held to: (graph input position, storage offset) pairs.
Offsets = tuple[tuple[int, int], ...]


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


def offsets_of(tensors: Sequence[torch.Tensor], positions: Sequence[int]) -> Offsets:
    """The offsets a graph traced on ``tensors`` is held to, of those at ``positions``."""
    return tuple((i, traced_offset(tensors[i])) for i in positions)


def offsets_hold(tensors: Sequence[Any], offsets: Offsets) -> bool:
    """Whether ``tensors`` are traced at the storage offsets a graph is held to."""
    return all(traced_offset(tensors[i]) == offset for i, offset in offsets)


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
    # A batched sample is traced at offset 0 whatever its memory (traced_offset), and a call
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
