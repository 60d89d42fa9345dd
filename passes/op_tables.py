"""Op tables: which aten ops the engine treats as as_strided, as layout views, as restrides.

Example::

    >>> torch.ops.aten.select.int in LAYOUT_VIEWS, is_view_op(torch.ops.aten.t.default)
    (True, True)
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from .compat.torch_internals import OpOverload, op_schema

aten = torch.ops.aten

#: The as_strided family the pass rewrites.
AS_STRIDED_OPS = (
    aten.as_strided.default,
    aten.as_strided_.default,
    aten.as_strided_copy.default,
    aten.as_strided_scatter.default,
)

#: Torch-level spellings (symbolic_trace graphs) of the same ops: functions and method names.
TORCH_LEVEL_AS_STRIDED: dict[Any, OpOverload] = {
    torch.as_strided: aten.as_strided.default,
    torch.as_strided_copy: aten.as_strided_copy.default,
    torch.as_strided_scatter: aten.as_strided_scatter.default,
    "as_strided": aten.as_strided.default,
    "as_strided_": aten.as_strided_.default,
    "as_strided_scatter": aten.as_strided_scatter.default,
}

#: The aten ops fxviews' tracer records for a Python call that decides view or copy by its
#: input's layout (Note [Layout decisions at run time] in fxviews/tracing/layout_decisions.py).
LAYOUT_DECIDING_OPS = frozenset(
    {aten.reshape.default, aten.ravel.default, aten.contiguous.default, aten.to.dtype_layout}
)

#: In-place ops that change a tensor's sizes/strides (its metadata) rather than its values.
METADATA_MUTATIONS = {
    aten.as_strided_.default,
    aten.t_.default,
    aten.transpose_.default,
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.unsqueeze_.default,
    aten.swapdims_.default,
    aten.swapaxes_.default,
    aten.resize_.default,
    aten.resize_as_.default,
    aten.set_.source_Tensor,
}

#: Views that only reorder dims: each is a ``permute``, whatever the sizes.
DIM_REORDERINGS = frozenset(
    {
        aten.t.default,
        aten.transpose.int,
        aten.swapdims.default,
        aten.swapaxes.default,
        aten.movedim.int,
        aten.movedim.intlist,
    }
)

#: The view ops a chain may hold: each re-indexes its input's memory and nothing else. Views
#: that also change what the memory means (``_conj``, ``_neg_view``, ``real``, ``view.dtype``,
#: ...) or bake in a layout (``as_strided``, ``_reshape_alias``) are not replayed; ``getitem``
#: picks from the list a split-like view returns.
LAYOUT_VIEWS = frozenset(
    {
        operator.getitem,
        aten.alias.default,
        aten.detach.default,
        aten.select.int,
        aten.slice.Tensor,
        aten.narrow.default,
        aten.diagonal.default,
        aten.unfold.default,
        aten.expand.default,
        aten.permute.default,
        *DIM_REORDERINGS,
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.unsqueeze.default,
        aten.view.default,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.tensor_split.sections,
        aten.tensor_split.indices,
        aten.chunk.default,
        aten.unbind.int,
    }
)


def is_view_op(op: Callable[..., Any]) -> bool:
    """Whether ``op`` returns an alias of its first argument without writing to it."""
    if op is operator.getitem:
        return True
    return isinstance(op, OpOverload) and _schema_is_view(op)


@functools.cache
def _schema_is_view(op: OpOverload) -> bool:
    # Cached: asked for every node of every graph, and an op's schema never changes.
    schema = op_schema(op)
    if not schema.arguments or not schema.returns:
        return False
    source_alias = schema.arguments[0].alias_info
    result_alias = schema.returns[0].alias_info
    return (
        source_alias is not None
        and not source_alias.is_write
        and result_alias is not None
        and not result_alias.is_write
    )
