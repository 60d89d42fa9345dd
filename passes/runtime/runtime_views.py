"""The engine at run time: an ``as_strided`` on a live tensor, answered by its proven view chain.

Note [The engine at run time]
-----------------------------
The graph pass reads an ``as_strided`` node relative to its input's trace-time geometry. This
driver does the same for a live tensor ``x`` and a request ``(size, stride, storage_offset)``:

1. the *source* is the geometry ``x`` itself reports (``x.shape``, ``x.stride()``,
   ``x.storage_offset()``), the coordinates every caller of ``as_strided`` computes its
   arguments in (Longformer writes strides from ``x.stride()``); the *target* is the request,
   with ``storage_offset=None`` meaning ``x.storage_offset()``, as in ``torch.as_strided``;
2. both are moved to offset 0 together (view ops never see absolute offsets, so the chain depends
   only on the relative offset) and symbolic sizes are read as ints, which under
   ``torch.compile`` installs a guard: the chain is proven for the sizes at hand;
3. ``synthesize`` derives the chain and verifies it on a meta tensor of the source geometry; the
   result is cached by the two geometries, so a request seen before costs a dictionary look-up;
4. no chain: the request is refused with :class:`AsStridedRequestError`, naming both
   geometries and, when a cheap probe finds one, an address it reads that ``x`` does not expose;
5. the chain is applied op by op to ``x`` itself, as aten view ops.

Step 5 is why the result is right where ``torch.as_strided`` is not: each view op is defined on
logical dims, so ``vmap`` batches it whatever the batch dim's place in memory, autograd and
forward AD differentiate it as the view it is, and a tensor subclass (DTensor) sees ops it can
propagate one by one instead of a raw memory walk. Where ``x`` is what it reports (a plain
tensor, outside any transform), the result has exactly the geometry ``torch.as_strided`` gives.

Example::

    >>> x = torch.arange(10.0)
    >>> as_strided_views(x, (4, 3), (2, 1)).tolist()[1]
    [2.0, 3.0, 4.0]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from ..chains.chain import ViewChain, ViewStep, apply_chain
from ..chains.synthesis import synthesize
from ..compat.torch_internals import disable_current_modes, temporarily_clear_interpreter_stack
from ..errors import AsStridedRequestError
from ..geometry.concrete import Geometry, find_exposed_address

aten = torch.ops.aten

#: The chain of a request equal to the tensor's own geometry: a new view of the same memory,
#: as ``torch.as_strided`` returns, not the tensor object itself.
IDENTITY: ViewChain = (ViewStep(aten.alias.default, ()),)


def requested_geometry(
    x: torch.Tensor,
    size: Sequence[Any],
    stride: Sequence[Any],
    storage_offset: Any = None,
) -> tuple[Geometry, Geometry]:
    """The tensor's own geometry and the request's, in ints (see step 2 of the Note)."""
    # Without an offset the request starts where x does, so under torch.compile, which cannot
    # trace storage_offset(), both are read at 0: the chain depends only on the difference.
    skip_own = storage_offset is None and torch.compiler.is_compiling()
    own = 0 if skip_own else int(x.storage_offset())
    offset = own if storage_offset is None else int(storage_offset)
    source = Geometry(_ints(x.shape), _ints(x.stride()), own)
    return source, Geometry(_ints(size), _ints(stride), offset)


def _ints(values: Sequence[Any]) -> tuple[int, ...]:
    # int() of a SymInt guards on its value: the compiled graph is only reused for these sizes.
    return tuple(int(v) for v in values)


def proven_chain(source: Geometry, target: Geometry) -> ViewChain:
    """The verified view chain taking ``source`` to ``target``; raises when there is none.

    Example::

        >>> [s.name() for s in proven_chain(Geometry((3, 3), (3, 1), 0), Geometry((3,), (4,), 0))]
        ['diagonal']
    """
    relative = target.offset - source.offset
    found = _cached_chain(
        Geometry(source.sizes, source.strides, 0),
        Geometry(target.sizes, target.strides, relative),
    )
    if isinstance(found, str):
        raise AsStridedRequestError(source, target, found)
    return found


# torch.compile runs the engine as plain Python between graphs (a graph break), not traced into
# one: verification builds meta tensors, which Dynamo would record.
@torch.compiler.disable
@functools.lru_cache(maxsize=4096)
def _cached_chain(source: Geometry, target: Geometry) -> ViewChain | str:
    """The chain, or why there is none; both geometries start at the source's offset 0."""
    if source.key() == target.key():
        return IDENTITY
    if target.offset < 0:
        return f"unsafe: its offset is {-target.offset} below the tensor's own, outside the tensor"
    # Verification builds meta tensors: out of reach of any mode that would record or fake them
    # (torch.compile traces DTensor ops under FakeTensorMode and proxy modes), and of the
    # caller's torch.func transforms, whose levels would wrap them (a jvp's GradTrackingTensor
    # has no storage to compare).
    with disable_current_modes(), temporarily_clear_interpreter_stack():
        chain = synthesize(source, target)
    if chain is not None:
        return chain or IDENTITY
    witness = find_exposed_address(source, target)
    if witness is not None:
        return (
            f"unsafe: it reads the element {witness} past the tensor's offset, which the tensor "
            "does not expose"
        )
    return "no chain of view ops gives this geometry from the tensor's: it has no view form"


def as_strided_views(
    x: torch.Tensor,
    size: Sequence[Any],
    stride: Sequence[Any],
    storage_offset: Any = None,
) -> torch.Tensor:
    """``x.as_strided(size, stride, storage_offset)``, computed as the view ops it stands for.

    See the Note at the top of this module for what the request means.

    Example::

        >>> x = torch.arange(12.0).view(3, 4)
        >>> as_strided_views(x, (3,), (5,)).tolist()      # the diagonal: diagonal(x)
        [0.0, 5.0, 10.0]
    """
    source, target = requested_geometry(x, size, stride, storage_offset)
    return apply_chain(proven_chain(source, target), x)


__all__ = ["IDENTITY", "AsStridedRequestError", "as_strided_views", "proven_chain"]
