"""Guards for kept layout-bound nodes: under ``vmap`` they run where they are right, else raise.

Note [Kept nodes under vmap]
----------------------------
A node the rewrite keeps that bakes strides (a kept ``as_strided`` variant, ``_reshape_alias``)
reads memory at addresses computed against the layout its memory had at trace time. Layout
pinning (pinning.py) gives graph-made buffers that layout under ``vmap``; what it cannot pin is
left as it is, most often because the memory is a graph input, laid out by the caller. There
vmap's ``as_strided`` rule reads sample ``i`` at ``offset + i * batch_stride + sum(index *
stride)``: right exactly when every sample is laid out as traced, and silently wrong otherwise
(a batch dim that is not outermost in memory, an input that is an offset view).

So each such node gets a guard, a call right before it that checks, on each run, the tensors
its memory comes from:

1. Its memory comes only from graph inputs (placeholders, ``get_attr``), through views and
   in-place ops that keep the layout (no ``t_``, ``unsqueeze_``, ...): for each, unwrap the
   functorch levels around it. Not batched at any level: the node runs as in eager. Batched:
   the per-sample layout (the innermost tensor's sizes, strides and offset with every batch
   dim removed) must be the input's traced layout (sizes, strides of dims larger than 1, and
   the offset), or the guard raises.
2. Anything else (memory through an opaque call, a storage reset or a layout changed in
   place, a buffer whose traced layout is not dense, ``as_strided_`` and
   ``as_strided_scatter``, which vmap gets wrong or refuses on every layout): the guard raises
   when any tensor argument of the node is batched.

The error (:class:`FxViewsError`) names the node, the user's source line where the trace
recorded it, why the node was kept, and what the guard saw. Without ``vmap`` the guards pass:
a kept node on the caller's layout computes what eager PyTorch computes on it.

Cost: a guard runs only in graphs with such nodes; per run, a few attribute reads per guarded
input.

Example::

    >>> guard_kept_nodes(gm, pin_records)   # one record per kept layout-bound node
    {'as_strided': 'under vmap it runs where each sample is laid out as traced, else raises'}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ..analysis.aliasing import AliasAnalysis, is_opaque
from ..chains.provenance import node_geometry
from ..compat.torch_internals import (
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    maybe_get_bdim,
)
from ..errors import FxViewsError
from ..geometry.concrete import Geometry, equivalent
from ..graph_edits import argument_nodes, op_name, tensor_val
from ..op_tables import METADATA_MUTATIONS
from ..schema import Record, RecordKind
from ..source_lines import describe_node
from .pinning import BAKED_STRIDES, STORAGE_RESETS, VMAP_REFUSES

#: A tensor the guard checks: its node's name, and its traced ``(sizes, strides, offset)``, or
#: None where any batching is refused.
_Expectation = tuple[Any, str, tuple[tuple[int, ...], tuple[int, ...], int] | None]


def guard_kept_nodes(
    graph_module: torch.fx.GraphModule, records: Sequence[Record]
) -> dict[str, str]:
    """Insert a guard before each kept layout-bound node of ``records`` that bakes strides;
    the names of the nodes guarded, each with what its guard does. Leaves ``recompile()`` to
    the caller."""
    why = {
        r.node: r.reason
        for r in records
        if r.method == "kept" and r.kind is RecordKind.LAYOUT_BOUND
    }
    graph = graph_module.graph
    nodes = [n for n in graph.nodes if n.name in why and n.target in BAKED_STRIDES]
    if not nodes:
        return {}
    analysis = AliasAnalysis(graph)
    guarded = {}
    for node in nodes:
        message = (
            f"{op_name(node.target)} node {describe_node(node)} was kept ({why[node.name]}), "
            "and under vmap"
        )
        expectations = _expectations(node, analysis)
        with graph.inserting_before(node):
            graph.call_function(check_batched_layouts, (message, expectations))
        refused = any(traced is None for _, _, traced in expectations)
        guarded[node.name] = _REFUSES if refused else _CHECKS
    return guarded


#: What a guard does, for the node's record.
_CHECKS = "under vmap it runs where each sample is laid out as traced, else raises"
_REFUSES = "under vmap it raises (guarded)"


def _expectations(node: torch.fx.Node, analysis: AliasAnalysis) -> tuple[_Expectation, ...]:
    """What the guard checks (step 1 or 2 of the Note)."""
    source = node.args[0]
    if node.target in VMAP_REFUSES or not isinstance(source, torch.fx.Node):
        return _refused_when_batched(node)
    ancestry = analysis.ancestry(source)
    origins = analysis.origins(source)
    followable = not any(is_opaque(n) or n.target in STORAGE_RESETS for n in ancestry)
    # A layout changed in place: the inputs' traced layouts are not those the node reads.
    restrided = any(u.target in METADATA_MUTATIONS for n in ancestry for u in n.users)
    if restrided or not followable or any(o.op not in ("placeholder", "get_attr") for o in origins):
        return _refused_when_batched(node)
    expected: list[_Expectation] = []
    for origin in origins:
        geometry = node_geometry(origin)
        traced = None if geometry is None else (geometry.sizes, geometry.strides, geometry.offset)
        expected.append((origin, origin.name, traced))
    return tuple(expected)


def _refused_when_batched(node: torch.fx.Node) -> tuple[_Expectation, ...]:
    arguments = dict.fromkeys(argument_nodes((node.args, node.kwargs)))
    return tuple((a, a.name, None) for a in arguments if tensor_val(a) is not None)


def check_batched_layouts(message: str, expectations: tuple[_Expectation, ...]) -> None:
    """The guard (see the Note): raise :class:`FxViewsError` where a batched tensor's samples
    are not laid out as traced, or where any batching is refused."""
    for tensor, name, traced in expectations:
        sample = per_sample_geometry(tensor)
        if sample is None:
            continue
        if traced is None:
            raise FxViewsError(
                f"{message} its argument {name!r} is batched: vmap would read other memory "
                "than each sample's own, or refuse it. Call it outside vmap, or write the "
                "as_strided as view ops"
            )
        expected = Geometry(*traced)
        if isinstance(sample, str) or not equivalent(sample, expected):
            raise FxViewsError(
                f"{message} it reads {name!r} at the addresses of its traced layout "
                f"({expected}), but each sample of {name!r} is laid out as {sample}: it would "
                "read other elements than each sample's. Pass that input with the batch dim "
                "outermost and each sample contiguous (torch.stack(samples), .contiguous()), "
                "or write the as_strided as view ops"
            )


def per_sample_geometry(value: Any) -> Geometry | str | None:
    """The layout of one sample of ``value`` batched by ``vmap``: None if it is not batched, a
    description if its layout cannot be read.

    Example::

        >>> torch.func.vmap(lambda x: print(per_sample_geometry(x)), in_dims=1)(torch.zeros(4, 3))
        sizes=[4] strides=[3] offset=0
    """
    bdims: list[int] = []
    while isinstance(value, torch.Tensor) and is_functorch_wrapped_tensor(value):
        if is_batchedtensor(value):
            bdims.append(int(maybe_get_bdim(value)))
        value = get_unwrapped(value)
    if not bdims:
        return None
    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
        return f"a {type(value).__name__} of layout {value.layout}, whose strides say nothing"
    dims = list(range(value.dim()))
    for bdim in reversed(bdims):  # the innermost level's batch dim is a dim of the physical one
        dims.pop(bdim)
    return Geometry(
        tuple(int(value.shape[d]) for d in dims),
        tuple(int(value.stride(d)) for d in dims),
        int(value.storage_offset()),
    )


__all__ = ["check_batched_layouts", "guard_kept_nodes", "per_sample_geometry"]
