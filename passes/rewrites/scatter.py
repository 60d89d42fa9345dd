"""Scatter patterns: as_strided over flat gradient buffers, and ``as_strided_scatter``.

Note [The backward buffer pattern]
----------------------------------
Autograd's AsStridedBackward/CopySlices leave this in traced graphs::

    buf = new_zeros(grad, [numel])               # flat buffer of the base's size
    v   = as_strided(buf, view sizes, strides, o) # the view the user took
    copy_(v, grad)
    b   = as_strided(buf, base sizes, contiguous strides, 0)

The as_strided that restores the base's (dense, contiguous) geometry is an unflatten of the
buffer. Every other as_strided on the same buffer is then read relative to that base view, so
the user's own view op can be found by provenance (``select`` where synthesis on the flat buffer
would say ``slice``). :func:`base_geometries` gives those candidate chains; the pass verifies
them like any other.

``as_strided_scatter(self, src, ...)`` is functional: a copy of ``self`` with the view region
replaced by ``src``. Given a view chain for the region, :func:`build_scatter` expresses it with
``select_scatter``/``slice_scatter``/``diagonal_scatter`` nested along the chain, inverting the
pure re-indexing steps (permute, unsqueeze, squeeze, view). Chains with steps that overlap
memory (expand, unfold) have no scatter form and are not rewritten.

Note [Scatter along a chain]
----------------------------
Why the scatter form is exact, for any size, without running it. ``as_strided_scatter(self,
src, S, T, O)`` copies ``self`` into a new tensor ``out`` (keeping ``self``'s strides and
offset over a copy of its storage when ``self`` has no internal overlap, else a plain clone)
and copies ``src`` through ``out.as_strided(S, T, O)``: the target is read in the layout L of
the *output*, which the node's metadata records. If L maps logical indices to addresses
one-to-one, and a chain of scatterable steps applied to a tensor of layout L gives the
target's geometry (``verify_chain``), then each target index m sits at the one element phi(m)
the chain selects (select, slice, diagonal and the re-indexings never repeat an element). So
as_strided_scatter writes ``src[m]`` exactly where the nested ``*_scatter`` ops put it, and
every other element is ``self``'s in both. The pass checks exactly these conditions, plus the
output layout on meta tensors; nothing is sampled, so no size needs a shortcut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..analysis.as_strided_calls import as_strided_op, bind_as_strided
from ..chains.chain import Evaluator, ViewChain, ViewStep
from ..chains.symbolic_verification import apply_symbolic
from ..compat.torch_internals import make_contiguous_strides_for
from ..geometry.concrete import Geometry
from ..geometry.symbolic import ShapeFacts, SymbolicGeometry, Unproven

aten = torch.ops.aten


def base_geometries(buffer: torch.fx.Node, buffer_geometry: Geometry) -> list[Geometry]:
    """Dense geometries covering the whole flat ``buffer`` that its as_strided users restore."""
    if buffer_geometry.ndim != 1 or buffer_geometry.strides[0] != 1 or buffer_geometry.numel < 2:
        return []
    found: dict[tuple, Geometry] = {}  # by key: each base once
    for user in buffer.users:
        if as_strided_op(user) is None:
            continue
        args = bind_as_strided(user)
        sizes, strides, offset = args["size"], args["stride"], args["storage_offset"]
        offset = buffer_geometry.offset if offset is None else offset
        concrete = all(type(v) is int for v in (*sizes, *strides, offset))
        if args["self"] is not buffer or not concrete:
            continue
        candidate = Geometry(tuple(sizes), tuple(strides), offset)
        dense = Geometry(
            candidate.sizes, make_contiguous_strides_for(candidate.sizes), buffer_geometry.offset
        )
        if candidate.key() == dense.key() and candidate.numel == buffer_geometry.numel:
            found.setdefault(candidate.key(), candidate)
    return list(found.values())


def symbolic_base_geometries(
    buffer: torch.fx.Node, buffer_geometry: SymbolicGeometry, facts: ShapeFacts
) -> list[SymbolicGeometry]:
    """:func:`base_geometries` for every size: each dense base is proven dense and to cover
    the whole buffer. Bases restored from an ``as_strided_scatter`` into the buffer count too
    (its output has the buffer's layout: backward graphs restore the base from there). A
    base only proposes candidates; every chain is proven from the buffer's own geometry."""
    flat = buffer_geometry.ndim == 1 and facts.equal(buffer_geometry.strides[0], 1)
    if not flat:
        return []
    scattered = [
        u
        for u in buffer.users
        if as_strided_op(u) is aten.as_strided_scatter.default
        and bind_as_strided(u)["self"] is buffer
    ]
    found: dict[tuple, SymbolicGeometry] = {}
    for user in [*buffer.users, *(u for s in scattered for u in s.users)]:
        if as_strided_op(user) is None or user in scattered:
            continue
        args = bind_as_strided(user)
        if args["self"] is not buffer and args["self"] not in scattered:
            continue
        offset = args["storage_offset"]
        try:
            candidate = SymbolicGeometry.from_values(
                args["size"],
                args["stride"],
                buffer_geometry.offset if offset is None else offset,
                facts,
            )
        except Unproven:
            continue
        if _proven_dense_cover(candidate, buffer_geometry, facts):
            found.setdefault(candidate.key(), candidate)
    return list(found.values())


def _proven_dense_cover(
    base: SymbolicGeometry, buffer: SymbolicGeometry, facts: ShapeFacts
) -> bool:
    expected: Any = 1
    for size, stride in reversed(list(zip(base.sizes, base.strides, strict=True))):
        if not (facts.equal(size, 1) or facts.equal(stride, expected)):
            return False
        expected = expected * size
    return facts.equal(base.offset, buffer.offset) and facts.equal(base.numel, buffer.numel)


def views_split_one_dim(chain: ViewChain, source: SymbolicGeometry, facts: ShapeFacts) -> bool:
    """Whether every ``view`` in ``chain`` unflattens a 1-D tensor or splits one dim of its
    input in two (a ``-1`` only among those two): the scatter form undoes it with the same
    sizes, the two merged into ``-1``, which needs no symbolic size.

    Example::

        >>> views_split_one_dim((ViewStep(aten.view.default, ([r, k, 2],)),),
        ...                     SymbolicGeometry((s0, 2*k0), (s1, 1), 0), facts)
        True                 # [r, 2k] -> [r, k, 2] splits dim 1; undone by [r, -1]
    """
    geometry = source
    for step in chain:
        try:
            out = apply_symbolic((step,), geometry, facts)
        except Unproven:
            return False
        if step.op is aten.view.default and geometry.ndim != 1:
            if not _splits_one_dim(geometry.sizes, out.sizes, list(step.args[0]), facts):
                return False
        geometry = out
    return True


def _splits_one_dim(
    sizes: tuple[Any, ...], split: tuple[Any, ...], arguments: list[Any], facts: ShapeFacts
) -> bool:
    if len(split) != len(sizes) + 1:
        return False
    return any(
        -1 not in arguments[:d] + arguments[d + 2 :]
        and all(
            facts.equal(a, b)
            for a, b in zip(split[:d] + split[d + 2 :], sizes[:d] + sizes[d + 1 :], strict=True)
        )
        for d in range(len(sizes))
    )


def symbolic_base_view_step(base: SymbolicGeometry, facts: ShapeFacts) -> ViewStep | None:
    """The unflatten of a flat buffer into ``base``, with int sizes, graph inputs holding a
    size, and ``-1`` for at most one size left; None if more are left."""
    sizes: list[Any] = []
    for size in base.sizes:
        if size.is_Integer:
            sizes.append(int(size))
        else:
            sizes.append(facts.size_inputs.get(size, -1))
    return ViewStep(aten.view.default, (sizes,)) if sizes.count(-1) <= 1 else None


def base_view_step(base: Geometry) -> ViewStep:
    """The unflatten of a flat buffer into ``base``."""
    return ViewStep(aten.view.default, (list(base.sizes),))


_INVERTIBLE = {
    aten.permute.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.view.default,
    aten.alias.default,
    aten.t.default,
    aten.transpose.int,
}
_SCATTERS: dict[Any, Callable[..., Any]] = {
    aten.select.int: aten.select_scatter.default,
    aten.slice.Tensor: aten.slice_scatter.default,
    aten.diagonal.default: aten.diagonal_scatter.default,
}


def has_scatter_form(chain: ViewChain) -> bool:
    """Whether every step is a scatterable index or a pure re-indexing."""
    return all(step.op in _SCATTERS or step.op in _INVERTIBLE for step in chain)


def build_scatter(ev: Evaluator, base: Any, src: Any, chain: ViewChain) -> Any:
    """``base`` with the region ``chain`` selects replaced by ``src``, functionally, via ``ev``."""
    if not chain:
        return src
    step, rest = chain[0], chain[1:]
    region = ev(step.op, base, *step.args)
    inner = build_scatter(ev, region, src, rest)
    if step.op in _SCATTERS:
        return ev(_SCATTERS[step.op], base, inner, *step.args)
    return _invert(ev, step, base, inner)


def _invert(ev: Evaluator, step: ViewStep, base: Any, inner: Any) -> Any:
    """Undo a re-indexing step: ``inner`` laid out like ``step(base)`` back to ``base``'s shape."""
    op, args = step.op, step.args
    if op is aten.permute.default:
        order = list(args[0])
        ndim = len(order)
        inverse = [0] * ndim
        for position, dim in enumerate(order):
            inverse[dim % ndim] = position
        return ev(aten.permute.default, inner, inverse)
    if op in (aten.t.default, aten.transpose.int):
        dims = args if args else (0, 1)
        if len(_shape(inner)) < 2:  # t() of a 0-d or 1-d tensor is the identity
            return inner
        return ev(aten.transpose.int, inner, *dims)
    if op is aten.alias.default:
        return inner
    # unsqueeze, squeeze and view only rename dims: a view back to the base's shape undoes them.
    shape = list(_shape(base))
    if all(isinstance(size, int) for size in shape):
        return ev(aten.view.default, inner, shape)
    # Symbolic sizes cannot be written into the graph. A 1-D base is the flat buffer a view
    # unflattened: [-1] is its size. A view that split one dim d of the base is undone by
    # its own sizes with d and d + 1 merged into -1 (a view is a row-major reshape: sizes
    # alone define it), as a reshape: whether the scattered values' layout can merge those
    # dims without a copy depends on the sizes, and nothing else reads that intermediate.
    if len(shape) == 1:
        return ev(aten.view.default, inner, [-1])
    if op is not aten.view.default:
        raise RuntimeError(f"{op} of a symbolic shape has no size-free inverse")
    return ev(aten.reshape.default, inner, _merged_sizes(shape, _shape(inner), list(args[0])))


def _merged_sizes(base: Sequence[Any], split: Sequence[Any], sizes: list[Any]) -> list[Any]:
    """``sizes`` (a view's size arguments, giving shape ``split`` from shape ``base``) with the
    two dims it split from one dim of ``base`` merged into -1; RuntimeError if it split none
    (sizes compared as exact expressions: equal sizes written differently count as unequal,
    which only drops the candidate)."""

    def exact(size: Any) -> Any:
        return size.node.expr if isinstance(size, torch.SymInt) else size

    base_exprs, split_exprs = [exact(v) for v in base], [exact(v) for v in split]
    if len(split_exprs) == len(base_exprs) + 1:
        for d in range(len(base_exprs)):
            kept = split_exprs[:d] + split_exprs[d + 2 :]
            rest = sizes[:d] + sizes[d + 2 :]
            if kept == base_exprs[:d] + base_exprs[d + 1 :] and -1 not in rest:
                return [*sizes[:d], -1, *sizes[d + 2 :]]
    raise RuntimeError(f"view to {list(split)} does not split one dim of {list(base)}")


def _shape(value: Any) -> Sequence[int]:
    if isinstance(value, torch.fx.Node):
        return tuple(value.meta["val"].shape)
    return tuple(value.shape)
