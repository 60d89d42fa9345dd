"""Kept ``as_strided`` nodes in consumers that read tensors flat: right only on dense inputs.

ONNX and ExecuTorch tensors are values laid out densely, not views of a storage: both run
``as_strided(x, S, T, O)`` as a read of ``x``'s elements in row-major order at the addresses
``O + sum(i * T)`` (ONNX as a Gather, ExecuTorch as ``as_strided_copy`` of a dense copy). That is
eager's result only when ``x`` was contiguous from storage offset 0 when traced. A node fxviews
had to keep is therefore checked before such a consumer gets it.

Example::

    >>> check_flat_read(node, "ONNX")   # as_strided of a transposed input
    FxViewsError: node 'as_strided' stays in the program ... is not provably contiguous ...
"""

from __future__ import annotations

import torch
import torch.fx

from fxviews.passes import FxViewsError, Geometry
from fxviews.passes.analysis.as_strided_calls import bind_as_strided
from fxviews.passes.compat import torch_internals as internals
from fxviews.passes.compat.torch_internals import make_contiguous_strides_for

__all__ = ["check_flat_read"]

aten = torch.ops.aten


def check_flat_read(node: torch.fx.Node, consumer: str) -> None:
    """Raise unless ``consumer``'s flat read of this as_strided(_scatter) gives eager's values.

    The input must be contiguous from offset 0 for every value of the dynamic dims, a concrete
    target must stay inside it, and a scatter must not write an element twice.
    """
    statically_known_true = internals.statically_known_true

    bound = bind_as_strided(node)
    source, sizes, strides = bound["self"], bound["size"], bound["stride"]
    offset = bound["storage_offset"] or 0
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise FxViewsError(f"node {node.name!r} has no input metadata to check")
    expected = make_contiguous_strides_for(val.shape)
    contiguous = statically_known_true(val.storage_offset() == 0) and all(
        statically_known_true(size == 1) or statically_known_true(stride == want)
        for size, stride, want in zip(val.shape, val.stride(), expected, strict=True)
    )
    if not contiguous:
        raise FxViewsError(
            f"node {node.name!r} stays in the program (see fxviews.rewrite's records) and its "
            f"input {source.name!r} is not provably contiguous from offset 0: {consumer}'s "
            "lowering would read other elements than eager"
        )
    values = (*sizes, *strides, offset, val.numel())
    if not all(type(v) is int for v in values):
        return  # symbolic: out of range fails at run time, never reads the wrong element
    target = Geometry(tuple(sizes), tuple(strides), offset)
    if target.numel and (target.bounds()[1] >= val.numel()):
        raise FxViewsError(
            f"node {node.name!r} reads past its input {source.name!r}: {consumer} cannot read "
            "memory outside a tensor"
        )
    scatter = node.target is aten.as_strided_scatter.default
    if scatter and len(set(target.addresses())) != target.numel:
        raise FxViewsError(
            f"node {node.name!r} writes some elements twice; {consumer}'s order differs"
        )
