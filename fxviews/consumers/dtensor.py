"""fxviews.dtensor: DTensor answers ``as_strided`` with the view chain it stands for.

Note [as_strided on DTensor]
----------------------------
DTensor refuses ``aten.as_strided`` (a raw walk over memory has no sharding rule) unless the
request is the tensor's own geometry, and has no sharding strategy for ``aten.unfold``. After
:func:`register`:

1. DTensor's handler for ``aten.as_strided`` is fxviews': the request is read on the *global*
   tensor's geometry (``x.shape``, ``x.stride()``, ``x.storage_offset()``, what DTensor reports
   and the caller computed its arguments from), and the engine's proven chain of view ops for
   it (:func:`fxviews.passes.runtime_views.proven_chain`) is applied to the DTensor op by op,
   so DTensor propagates the sharding through each view as it does for the user's own views;
2. before each step, the dims that step re-indexes (a ``select``/``slice``/``unfold`` dim, the
   two dims of a ``diagonal``, the dims a ``view`` merges or splits, the dims an ``expand``
   grows) are made whole where they are sharded: only those mesh dims go from ``Shard(d)`` to
   ``Replicate()``, the other placements stay, and the ``fxviews`` logger says so once per
   request and placement. A chain that leaves the sharded dim alone moves no data;
3. sharding strategies for the views the chains use where DTensor has none or an all-gathering
   one: ``unfold`` (the window dim must be whole; the others keep their placements) and
   ``diagonal`` (its two dims must be whole; DTensor's own replicates every dim), and for their
   backwards, so gradients flow through :func:`fxviews.as_strided` called on a DTensor (the
   handler of step 1 runs below autograd, which records ``x.as_strided`` itself: its backward
   is PyTorch's, which DTensor cannot run).

Under ``torch.compile`` DTensor's ops are traced through the same handler table and strategy
functions (on fake local tensors), so the compiled graph holds the chain's local views and the
redistributions of step 2. Symbolic sizes are read as ints there (a guard): the chain is proven
for the sizes at hand, and other sizes recompile.

:func:`unregister` puts back exactly what :func:`register` replaced; both are idempotent.

Example::

    >>> fxviews.dtensor.register()
    >>> windows = x.as_strided((x.shape[0], n, w), (x.stride(0), 1, 1))  # x: Shard(0) rows
    >>> windows.placements
    (Shard(dim=0),)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from fxviews.passes import torch_internals as internals
from fxviews.passes.chain import ViewStep
from fxviews.passes.geometry import Geometry
from fxviews.passes.runtime_views import proven_chain, requested_geometry

aten = torch.ops.aten
logger = logging.getLogger("fxviews")

#: What register() replaced, to be put back by unregister(): (table, op, previous entry or
#: _ABSENT). Empty while unregistered.
_replaced: list[tuple[dict[Any, Any], Any, Any]] = []
_ABSENT = object()
_lock = threading.Lock()
#: Redistribution messages already logged (each is logged once per process).
_said: set[str] = set()


def register() -> None:
    """Make DTensor answer ``as_strided`` by fxviews' view chains (see the Note). Idempotent."""
    with _lock:
        if _replaced:
            return
        propagator = internals.dtensor_sharding_propagator()
        schema_info = internals.RuntimeSchemaInfo(1)  # dims, sizes and steps key the cache
        _replace(internals.dtensor_op_handlers(), aten.as_strided.default, _as_strided_handler)
        # torch 2.15 keeps single-dim strategies (its diagonal's among them) in a table of
        # their own that is consulted first: fxviews' strategy must be the one found.
        single_dim = getattr(propagator, "op_single_dim_strategy_funcs", {})
        for op, strategy in _STRATEGIES.items():
            _replace(propagator.op_strategy_funcs, op, strategy)
            _replace(propagator.op_to_schema_info, op, schema_info)
            if op in single_dim:
                _withdraw(single_dim, op)
        for op in _SHAPE_ARGUMENTS:
            _replace(propagator.op_to_shape_and_stride_idx, op, 1)
        internals.clear_sharding_prop_cache()


def unregister() -> None:
    """Restore PyTorch's own DTensor behaviour exactly. Idempotent."""
    with _lock:
        while _replaced:
            table, op, previous = _replaced.pop()
            if previous is _ABSENT:
                del table[op]
            else:
                table[op] = previous
        internals.clear_sharding_prop_cache()


def is_registered() -> bool:
    """Whether :func:`register` is in effect."""
    return bool(_replaced)


def _replace(table: dict[Any, Any], op: Any, value: Any) -> None:
    _replaced.append((table, op, table.get(op, _ABSENT)))
    table[op] = value


def _withdraw(table: dict[Any, Any], op: Any) -> None:
    """Remove ``op`` from ``table`` until :func:`unregister` puts it back."""
    _replaced.append((table, op, table.pop(op)))


def _as_strided_handler(
    op: internals.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> DTensor:
    """DTensor's handler for ``aten.as_strided``: the proven chain, step by step."""
    x, size, stride, *rest = args
    offset = rest[0] if rest else kwargs.get("storage_offset")
    source, target = requested_geometry(x, size, stride, offset)
    out = x
    for step in proven_chain(source, target):
        out = _whole_where_reindexed(out, step, target)
        out = step.op(out, *step.args)
    return out


def _whole_where_reindexed(x: DTensor, step: ViewStep, target: Geometry) -> DTensor:
    """``x`` with the dims ``step`` re-indexes unsharded, every other placement kept."""
    dims = reindexed_dims(step, tuple(int(s) for s in x.shape))
    placements = tuple(
        Replicate() if p.is_shard() and _shard_dim(p, x.ndim) in dims else p for p in x.placements
    )
    if placements == tuple(x.placements):
        return x
    message = (
        f"as_strided {target} on a DTensor of shape {list(x.shape)} placed {x.placements}: "
        f"{step.name()} re-indexes a sharded dim, so it is redistributed to {placements} "
        "(that dim only)"
    )
    if message not in _said:
        _said.add(message)
        logger.warning("dtensor: %s", message)
    return x.redistribute(x.device_mesh, placements)


def _shard_dim(placement: Any, ndim: int) -> int:
    return placement.dim % ndim


def reindexed_dims(step: ViewStep, shape: Sequence[int]) -> set[int]:
    """The dims of a tensor of ``shape`` whose indexing ``step`` changes (all others it keeps
    whole, possibly moved).

    Example::

        >>> reindexed_dims(ViewStep(aten.unfold.default, (1, 3, 1)), (4, 6))
        {1}
        >>> reindexed_dims(ViewStep(aten.view.default, ([4, 2, 3],)), (4, 6))
        {1}
    """
    ndim = len(shape)
    op, args = step.op, step.args
    if op in _KEEPS_EVERY_DIM:
        return set()
    if op in (aten.select.int, aten.slice.Tensor, aten.unfold.default, aten.narrow.default):
        dims = {args[0]}
    elif op is aten.diagonal.default:
        dims = {args[1], args[2]}
    elif op is aten.squeeze.dims:
        dims = set(args[0])
    elif op is aten.expand.default:
        sizes = args[0][len(args[0]) - ndim :]
        dims = {d for d in range(ndim) if sizes[d] not in (-1, shape[d])}
    elif op is aten.view.default:
        dims = _regrouped_dims(shape, args[0])
    else:  # an op this table does not know: treat every dim as re-indexed
        dims = set(range(ndim))
    return {d % ndim for d in dims}


_KEEPS_EVERY_DIM = {aten.alias.default, aten.permute.default, aten.unsqueeze.default}


def _regrouped_dims(shape: Sequence[int], sizes: Sequence[int]) -> set[int]:
    """Input dims of a ``view`` that do not map one to one onto an output dim."""
    if 0 in shape or -1 in sizes:
        return set(range(len(shape)))
    regrouped: set[int] = set()
    i = j = 0
    while i < len(shape) and j < len(sizes):
        if shape[i] == sizes[j]:
            i, j = i + 1, j + 1
            continue
        group, have, want = [i], shape[i], sizes[j]
        i, j = i + 1, j + 1
        while have != want:
            if have < want:
                have *= shape[i]
                group.append(i)
                i += 1
            else:
                want *= sizes[j]
                j += 1
        regrouped.update(group)
    regrouped.update(range(i, len(shape)))  # trailing size-1 dims the view drops
    return regrouped


# --------------------------------------------------------------------------------------------
# Sharding strategies


def _reindexing_strategy(
    whole: Callable[[tuple[Any, ...], int], set[int]],
    moved: Callable[[int, tuple[Any, ...], int], int],
) -> Callable[[Any], Any]:
    """A strategy for an op that re-indexes its input (a view, or a view's backward): the dims
    in ``whole(args, ndim)`` must be unsharded (Replicate on their mesh dims); a ``Shard(d)`` on
    another dim becomes ``Shard(moved(d, args, ndim))``; ``Replicate`` and ``Partial`` pass
    through (these ops are linear). One OpSpec per input spec."""

    def strategy(op_schema: Any) -> Any:
        input_strategy, *args = op_schema.args_schema
        ndim = input_strategy.ndim
        needs_whole = {d % ndim for d in whole(tuple(args), ndim)}
        specs = []
        for candidate in input_strategy.strategies:
            spec = candidate.output_spec
            inputs, outputs = [], []
            for p in spec.placements:
                if not p.is_shard():
                    inputs.append(p)
                    outputs.append(p)
                elif type(p) is Shard and _shard_dim(p, ndim) not in needs_whole:
                    inputs.append(p)
                    outputs.append(Shard(moved(_shard_dim(p, ndim), tuple(args), ndim)))
                else:  # re-indexed, or a strided shard whose layout this rule does not track
                    inputs.append(Replicate())
                    outputs.append(Replicate())
            input_spec = internals.DTensorSpec(spec.mesh, tuple(inputs), spec.tensor_meta)
            specs.append(
                internals.OpSpec(
                    output_specs=internals.DTensorSpec(spec.mesh, tuple(outputs)),
                    input_specs=(input_spec,),
                    redistribute_cost=[
                        internals.generate_redistribute_costs(input_strategy, input_spec)
                    ],
                )
            )
        return internals.OpStrategy(specs)

    return strategy


def _diagonal_dims(args: tuple[Any, ...], ndim: int) -> tuple[int, int]:
    dim1 = args[1] if len(args) > 1 else 0
    dim2 = args[2] if len(args) > 2 else 1
    return dim1 % ndim, dim2 % ndim


def _after_diagonal(dim: int, args: tuple[Any, ...], ndim: int) -> int:
    # diagonal removes its two dims and appends the diagonal last
    return dim - sum(d < dim for d in _diagonal_dims(args, ndim))


def _before_diagonal(dim: int, args: tuple[Any, ...], ndim: int) -> int:
    # diagonal_backward(grad, input_sizes, offset, dim1, dim2): grad's dims are the input's
    # other dims, in order, then the diagonal
    input_ndim = len(args[0])
    taken = {args[2] % input_ndim, args[3] % input_ndim}
    return [d for d in range(input_ndim) if d not in taken][dim]


def _keep(dim: int, args: tuple[Any, ...], ndim: int) -> int:
    return dim


_STRATEGIES = {
    # unfold(dim, size, step): the other dims keep their index; the window dim is appended.
    aten.unfold.default: _reindexing_strategy(lambda args, ndim: {args[0]}, _keep),
    aten.diagonal.default: _reindexing_strategy(
        lambda args, ndim: set(_diagonal_dims(args, ndim)), _after_diagonal
    ),
    # Their backwards, for gradients through fxviews.as_strided: the unfolded dim and the
    # window dim (last), or the diagonal (last), must be whole.
    aten.unfold_backward.default: _reindexing_strategy(
        lambda args, ndim: {args[1] % (ndim - 1), ndim - 1}, _keep
    ),
    aten.diagonal_backward.default: _reindexing_strategy(
        lambda args, ndim: {ndim - 1}, _before_diagonal
    ),
}
#: Ops whose argument 1 is the global output shape, which DTensor must make the local one.
_SHAPE_ARGUMENTS = (aten.unfold_backward.default, aten.diagonal_backward.default)

__all__ = ["is_registered", "reindexed_dims", "register", "unregister"]
