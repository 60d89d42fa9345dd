"""fxviews.dtensor: DTensor answers ``as_strided`` with the view chain it stands for.

Note [as_strided on DTensor]
----------------------------
DTensor refuses ``aten.as_strided`` (a raw walk over memory has no sharding rule) unless the
request is the tensor's own geometry, and has no sharding strategy for ``aten.unfold``. After
:func:`register`:

1. DTensor's handler for ``aten.as_strided`` is fxviews': the request is read on the *global*
   tensor's geometry (``x.shape``, ``x.stride()``, what DTensor reports and the caller computed
   its arguments from; the offset relative to ``x.storage_offset()``, which DTensor reports for
   the *local* shard, so an explicit offset other than a nonzero reported one is refused as
   ambiguous), and the engine's proven chain of view ops for it
   (:func:`fxviews.passes.runtime.runtime_views.proven_chain`) is applied to the DTensor op by
   op, so DTensor propagates the sharding through each view as it does for the user's own views;
2. before each step, placements the step cannot keep are made ``Replicate()`` on their mesh
   dim, the others stay, and the ``fxviews`` logger says so once per request and placement.
   Kept are ``Replicate()``, a plain ``Partial`` and a plain ``Shard(d)`` of a dim the step
   leaves whole (not a ``select``/``slice``/``unfold`` dim, the two dims of a ``diagonal``, the
   dims a ``view`` merges or splits, the dims an ``expand`` grows); never a ``_StridedShard``
   (``is_shard()`` is False for it on torch 2.13), shards nested out of the default order, or a
   placement type these rules do not know. A chain that leaves the sharded dim alone moves no
   data;
3. sharding strategies for the views the chains use where DTensor has none or an all-gathering
   one: ``unfold`` (the window dim must be whole; the others keep their placements, by the
   rule of step 2) and ``diagonal`` (its two dims must be whole; DTensor's own replicates
   every dim), and for their backwards;
4. ``DTensor.as_strided`` (the method user code calls) applies the same chain *above*
   autograd, so its gradient is the chain's own; PyTorch's ``as_strided`` backward (it writes
   the gradient through an ``as_strided`` view of a buffer, which a redistributing chain would
   not alias) is refused where it reaches the handler;
5. AOTAutograd's ``gen_alias_from_base``, which remakes a compiled graph's outputs that alias
   an input with ``base.as_strided(global sizes, global strides, local shard's offset)``,
   answers DTensor bases itself (:func:`_dtensor_alias`); the handler refuses requests from
   PyTorch's own copy, kept by graphs compiled before :func:`register` (from torch 2.13 on;
   on 2.11 and 2.12 compiled graphs look the function up on each call, and get fxviews').

Under ``torch.compile`` DTensor's ops are traced through the same handler table and strategy
functions (on fake local tensors), so the compiled graph holds the chain's local views and the
redistributions of step 2; the method of step 4 enters Dynamo's graph as one call
(``allow_in_graph``), which AOTAutograd runs on DTensors. Symbolic sizes are read as ints there
(a guard): the chain is proven for the sizes at hand, and other sizes recompile.

:func:`unregister` puts back exactly what :func:`register` replaced; both are idempotent.

Example::

    >>> fxviews.dtensor.register()
    >>> windows = x.as_strided((x.shape[0], n, w), (x.stride(0), 1, 1))  # x: Shard(0) rows
    >>> windows.placements
    (Shard(dim=0),)
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from fxviews.passes.chains.chain import ViewStep
from fxviews.passes.compat import torch_internals as internals
from fxviews.passes.errors import FxViewsError
from fxviews.passes.geometry.concrete import Geometry
from fxviews.passes.runtime.runtime_views import proven_chain, requested_geometry

aten = torch.ops.aten
logger = logging.getLogger("fxviews")

#: How to put back each thing register() replaced, in order. Empty while unregistered.
_undo: list[Callable[[], None]] = []
_ABSENT = object()
#: Code of the callers that send ``as_strided`` requests in a DTensor's *local* coordinates
#: (AOTAutograd's gen_alias_from_base: the offset of a compiled output's local shard), found on
#: the stack when a graph compiled before register() still calls them.
_local_coordinate_callers: set[CodeType] = set()
_lock = threading.Lock()
#: Redistribution messages already logged (each is logged once per process).
_said: set[str] = set()


def register() -> None:
    """Make DTensor answer ``as_strided`` by fxviews' view chains (see the Note). Idempotent."""
    with _lock:
        if _undo:
            return
        tables = internals.dtensor_strategy_tables()
        schema_info = internals.RuntimeSchemaInfo(1)  # dims, sizes and steps key the cache
        _replace(internals.dtensor_op_handlers(), aten.as_strided.default, _as_strided_handler)
        for op, strategy in _STRATEGIES.items():
            _replace(tables.strategies, op, strategy)
            _replace(tables.schema_infos, op, schema_info)
            # torch 2.15 consults single-dim strategies (its diagonal's among them) first:
            # fxviews' strategy must be the one found.
            if op in tables.single_dim_strategies:
                _withdraw(tables.single_dim_strategies, op)
        for op in _SHAPE_ARGUMENTS:
            _replace(tables.shape_and_stride_indices, op, 1)
        for module in internals.aot_alias_regeneration_modules():
            original = module.gen_alias_from_base
            _local_coordinate_callers.add(original.__code__)
            _set_attribute(module, "gen_alias_from_base", _alias_regeneration(original))
        _set_attribute(DTensor, "as_strided", torch.compiler.allow_in_graph(_as_strided_method))
        internals.clear_sharding_prop_cache()


def unregister() -> None:
    """Restore PyTorch's own DTensor behaviour exactly. Idempotent."""
    with _lock:
        while _undo:
            _undo.pop()()
        internals.clear_sharding_prop_cache()


def is_registered() -> bool:
    """Whether :func:`register` is in effect."""
    return bool(_undo)


def _replace(table: dict[Any, Any], op: Any, value: Any) -> None:
    _undo.append(functools.partial(_put_back, table, op, table.get(op, _ABSENT)))
    table[op] = value


def _withdraw(table: dict[Any, Any], op: Any) -> None:
    """Remove ``op`` from ``table`` until :func:`unregister` puts it back."""
    _undo.append(functools.partial(_put_back, table, op, table.pop(op)))


def _put_back(table: dict[Any, Any], key: Any, previous: Any) -> None:
    if previous is _ABSENT:
        del table[key]
    else:
        table[key] = previous


def _set_attribute(owner: Any, name: str, value: Any) -> None:
    """``setattr(owner, name, value)`` until :func:`unregister` restores the attribute (or its
    absence from ``owner`` itself, where it was inherited)."""
    previous = vars(owner).get(name, _ABSENT)
    _undo.append(functools.partial(_restore_attribute, owner, name, previous))
    setattr(owner, name, value)


def _restore_attribute(owner: Any, name: str, previous: Any) -> None:
    if previous is _ABSENT:
        delattr(owner, name)
    else:
        setattr(owner, name, previous)


def _as_strided_handler(
    op: internals.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> DTensor:
    """DTensor's handler for ``aten.as_strided`` (below autograd): the proven chain."""
    x, size, stride, *rest = args
    node = internals.current_autograd_node()
    if node is not None and type(node).__name__.startswith("AsStridedBackward"):
        # PyTorch's as_strided backward scatters the gradient into a buffer through a view of
        # it, which a redistributing chain would not alias: it would lose the gradient.
        raise FxViewsError(
            "fxviews.dtensor: PyTorch's as_strided backward cannot run on a DTensor (it writes "
            "the gradient through an as_strided view of a buffer); call x.as_strided eagerly or "
            "under torch.compile after fxviews.dtensor.register(), where its gradient is the "
            "chain's own, or use fxviews.as_strided(x, ...)"
        )
    return _viewed(x, size, stride, rest[0] if rest else kwargs.get("storage_offset"))


def _as_strided_method(
    self: DTensor, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None
) -> DTensor:
    """``DTensor.as_strided`` while registered: the chain applied above autograd, so a gradient
    flows back through the chain's own ops (PyTorch's ``as_strided`` backward scatters into a
    plain index buffer, which DTensor cannot mix with a DTensor). register() lets it into
    Dynamo's graphs as one call, which AOTAutograd then runs on DTensors: the chain there too."""
    return _viewed(self, size, stride, storage_offset)


def _viewed(x: DTensor, size: Sequence[Any], stride: Sequence[Any], offset: Any) -> DTensor:
    """``x.as_strided(size, stride, offset)`` read on ``x``'s global geometry (see the Note):
    the proven chain, step by step, each made on dims it may re-index."""
    _refuse_local_coordinates(x, offset)
    source, target = requested_geometry(x, size, stride, offset)
    out = x
    for step in proven_chain(source, target):
        out = _whole_where_reindexed(out, step, target)
        out = step.op(out, *step.args)
    return out


def _refuse_local_coordinates(x: DTensor, offset: Any) -> None:
    """Raise where ``offset`` may be in coordinates other than those the handler reads.

    A DTensor reports its global sizes and strides but its local shard's ``storage_offset()``.
    The handler reads an offset relative to that (``offset - x.storage_offset()``, in global
    strides), which is right for user code (it can only have computed the offset from what
    the DTensor reports) while the DTensor reports 0, and for ``offset == x.storage_offset()``.
    Two requests are refused: an offset that differs from a nonzero reported one (an offset
    written for the plain tensor's storage cannot be told from one computed from the local
    shard's), and any request from a caller that sends the local shard's offset with global
    sizes (AOTAutograd's alias regeneration in a graph compiled before register())."""
    for code in internals.calling_code():
        if code in _local_coordinate_callers:
            raise FxViewsError(
                f"fxviews.dtensor: {code.co_name} asks a DTensor of shape "
                f"{list(x.shape)} placed {x.placements} for an as_strided view at its local "
                "shard's storage offset, which does not say which global view it is: this graph "
                "was compiled before fxviews.dtensor.register(); call torch._dynamo.reset() "
                "after register() so that it is compiled again"
            )
    if offset is None or torch.compiler.is_compiling() and not isinstance(offset, int):
        return
    own = x.storage_offset()
    if own != 0 and offset != own:
        raise FxViewsError(
            f"fxviews.dtensor: as_strided at storage offset {offset} on a DTensor of shape "
            f"{list(x.shape)} placed {x.placements} that reports offset {own}, its local "
            "shard's: an offset other than the reported one is ambiguous on a view of a "
            "DTensor; make the request on the tensor the view was taken from, or give no offset"
        )


def _alias_regeneration(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """AOTAutograd's ``gen_alias_from_base``, answering DTensor bases itself (see
    :func:`_dtensor_alias`) and passing every other base to ``original``."""

    @functools.wraps(original)
    def gen_alias_from_base(
        aliased_base_tensor: torch.Tensor,
        target_meta_tensor: torch.Tensor,
        target_requires_grad: bool,
        target_view_meta_sequence: Any = None,
        *,
        replay_views: bool,
    ) -> torch.Tensor:
        if isinstance(aliased_base_tensor, DTensor):
            return _dtensor_alias(aliased_base_tensor, target_meta_tensor, target_requires_grad)
        return original(
            aliased_base_tensor,
            target_meta_tensor,
            target_requires_grad,
            target_view_meta_sequence,
            replay_views=replay_views,
        )

    return gen_alias_from_base


def _dtensor_alias(base: DTensor, target: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """The output ``target`` of a compiled graph, remade as an alias of its input ``base``.

    AOTAutograd remakes such outputs at run time with ``base.as_strided(target.size(),
    target.stride(), target.storage_offset())``: global sizes and strides with the *local*
    shard's offset, which do not name one global view. The compiled graph computed
    ``target``'s local shard itself, so where that shard lies in ``base``'s local storage it is
    remade exactly there (``as_strided`` of the plain local tensor, between ``to_local`` and
    ``from_local``, which carry gradients). Where DTensor redistributed on the way (the shard
    lies in a buffer of its own, as eagerly), ``target`` is what eager DTensor returns, and is
    returned when no gradient must flow to ``base``; else this raises.
    """
    out: torch.Tensor
    if (
        isinstance(target, DTensor)
        and target.device_mesh == base.device_mesh
        and target.dtype == base.dtype
        and _same_storage(target.to_local(), base.to_local())
    ):
        local = target.to_local()
        shard = base.to_local().as_strided(local.size(), local.stride(), local.storage_offset())
        out = DTensor.from_local(
            shard,
            base.device_mesh,
            target.placements,
            run_check=False,
            shape=target.shape,
            stride=target.stride(),
        )
    elif not (base.requires_grad and requires_grad):
        out = target.detach()
    else:
        raise FxViewsError(
            "fxviews.dtensor: a compiled graph returns a view of its DTensor input "
            f"(shape {list(base.shape)} placed {base.placements}) that DTensor computed from a "
            "redistributed copy, and gradients must flow through it to the input: return it "
            "from outside the compiled function, or return a copy (.clone())"
        )
    # requires_grad as AOTAutograd sets it on the outputs it remakes
    if base.requires_grad and not requires_grad:
        return out.detach()
    if requires_grad and not out.requires_grad:
        out.requires_grad_(True)
    return out


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _whole_where_reindexed(x: DTensor, step: ViewStep, target: Geometry) -> DTensor:
    """``x`` with every placement ``step`` cannot keep made ``Replicate()``, the others kept."""
    dims = reindexed_dims(step, tuple(int(s) for s in x.shape))
    keeps = _placements_kept(internals.dtensor_spec(x), x.ndim, dims)
    placements = tuple(
        p if keep else Replicate() for p, keep in zip(x.placements, keeps, strict=True)
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


def _placements_kept(spec: Any, ndim: int, reindexed: set[int]) -> tuple[bool, ...]:
    """Per mesh dim, whether a view that re-indexes the tensor dims ``reindexed`` (and keeps
    every other dim whole, possibly moved) can keep the placement of ``spec`` on it.

    Kept: ``Replicate()``, a plain ``Partial`` (a view is linear and moves elements whole) and
    a plain ``Shard`` of a dim the view leaves alone. Everything else is made whole first: a
    ``Shard`` of a re-indexed dim; a ``_StridedShard`` (what DTensor makes of a sharded dim
    that a reshape flattened; its ``is_shard()`` is False on torch 2.13 and its layout is not
    one these rules move); dims sharded on several mesh dims in an order other than the
    default one; and any placement type these rules do not know.
    """
    out_of_order = internals.dtensor_shards_out_of_order(spec)
    return tuple(
        p.is_replicate()
        or type(p) is Partial
        or (type(p) is Shard and not out_of_order and p.dim % ndim not in reindexed)
        for p in spec.placements
    )


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
    through (these ops are linear); anything else is made whole (see _placements_kept). One
    OpSpec per input spec."""

    def strategy(op_schema: Any) -> Any:
        input_strategy, *args = op_schema.args_schema
        ndim = input_strategy.ndim
        needs_whole = {d % ndim for d in whole(tuple(args), ndim)}
        specs = []
        for candidate in input_strategy.strategies:
            spec = candidate.output_spec
            inputs: list[Any] = []
            outputs: list[Any] = []
            for p, keep in zip(
                spec.placements, _placements_kept(spec, ndim, needs_whole), strict=True
            ):
                if not keep:
                    inputs.append(Replicate())
                    outputs.append(Replicate())
                elif type(p) is Shard:
                    inputs.append(p)
                    outputs.append(Shard(moved(p.dim % ndim, tuple(args), ndim)))
                else:
                    inputs.append(p)
                    outputs.append(p)
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
