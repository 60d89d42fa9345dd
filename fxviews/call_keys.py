"""The signature a transformed function's call is cached under (Note [The cached call] in
``fxviews/transforming.py``): what of its arguments selects a graph."""

from __future__ import annotations

from typing import Any

import torch

from fxviews.call_layouts import layout_key

__all__ = ["leaf_key", "positional_key", "tensor_key"]


def positional_key(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The key of a call of positional tensors only (Note [The cached call] in
    ``fxviews/transforming.py``); None for any other call.

    Example::

        >>> positional_key((torch.ones(2),)) == positional_key((torch.zeros(2),))
        True
    """
    if not all(isinstance(arg, torch.Tensor) for arg in args):
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
    """The key of one leaf of a call's arguments; an unhashable one is keyed by identity and
    appended to ``keepalive`` (whose holder keeps its id unique).

    Example::

        >>> leaf_key(0.0, []) == leaf_key(-0.0, [])
        False
    """
    if isinstance(leaf, torch.Tensor):
        return (torch.Tensor, tensor_key(leaf))
    try:
        hash(leaf)
    except TypeError:
        keepalive.append(leaf)
        return (type(leaf), "id", id(leaf))
    if isinstance(leaf, (float, complex)):
        # 0.0 == -0.0, but a graph bakes the sign in (atan2, division, copysign).
        return (type(leaf), leaf, repr(leaf))
    # The type keeps 1, 1.0 and True apart: they hash equal but trace differently.
    return (type(leaf), leaf)
