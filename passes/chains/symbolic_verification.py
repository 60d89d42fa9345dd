"""Verification over symbolic shapes: a chain is proven to give the target at every size.

Note [Verifying a chain for every size]
---------------------------------------
``verify_chain`` runs a chain on a meta tensor: one size. Here each view op is applied to a
:class:`~.symbolic_geometry.SymbolicGeometry` by its definition (what it does to sizes, strides
and offset), and every condition the op needs to be a plain view, such as ``0 <= index < size``
for ``select`` or ``start <= end <= size`` for ``slice`` (so no clamping happens) or
``window <= size`` for ``unfold``, must be *proven* by :class:`~.symbolic_geometry.ShapeFacts`
for every value the symbols may take. A stepped ``slice`` or ``unfold`` sizes its dim by a
floor division (``FloorDiv``, as the ShapeEnv writes ``(s - 3)//2``). Where an op's result
depends on which of two sizes is smaller (``diagonal``) or whether a size is 1 (``squeeze``,
``view``), the comparison must be decided for every size too. The chain's result must then
be provably equivalent to the target.

Together these are the safety proof: every step is a valid view at every size, so the chain's
result only reads memory of its input, and it is exactly the target. A chain holding an op not
modelled here is not proven, and not used. As a cross-check of the model, the chain must also
verify on meta tensors at the sample points (``verify_chain``).

Arguments are ints, None, or graph inputs holding a size (see ``symbolic_synthesis``): negative
ints count from the end of the dim, as PyTorch reads them, a ``-1`` in ``view``/``expand`` is
inferred, and a graph input stands for its symbol.

Example::

    >>> verify_symbolic_chain((ViewStep(aten.unfold.default, (0, 3, 1)),),
    ...                       SymbolicGeometry((s0,), (1,), 0),
    ...                       SymbolicGeometry((s0 - 2, 3), (1, 1), 0), facts)
    True                     # if the facts prove s0 >= 3
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from sympy import Expr

from ..compat import torch_internals as internals
from ..geometry.symbolic import (
    SIZE_ARGUMENTS,
    ShapeFacts,
    SymbolicGeometry,
    Unproven,
    equivalent_symbolic,
)
from ..op_tables import LAYOUT_VIEWS
from .chain import ViewStep
from .verification import verify_chain

aten = torch.ops.aten

#: Slice ends at least this large mean "to the end" (``x[1:]`` traces as end 2**63 - 1).
_TO_THE_END = 2**62


class _View:
    """A symbolic tensor layout that the modelled view ops transform in place."""

    def __init__(self, geometry: SymbolicGeometry, facts: ShapeFacts) -> None:
        self.sizes = list(geometry.sizes)
        self.strides = list(geometry.strides)
        self.offset = geometry.offset
        self.facts = facts

    def geometry(self) -> SymbolicGeometry:
        return SymbolicGeometry(tuple(self.sizes), tuple(self.strides), self.offset)

    def dim(self, d: Any, extra: int = 0) -> int:
        n = len(self.sizes) + extra
        if not isinstance(d, int) or isinstance(d, bool) or not -n <= d < max(n, 1):
            raise Unproven(f"dim {d!r} out of range")
        return d % max(n, 1)

    def dim_at(self, d: int) -> tuple[Expr, Expr]:
        """The size and stride of dim ``d``."""
        return self.sizes[d], self.strides[d]

    def size_argument(self, size: Any) -> Expr:
        """A size argument: an int, or a graph input holding a size (its symbol)."""
        if isinstance(size, SIZE_ARGUMENTS):
            return self.facts.expression(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise Unproven(f"size argument {size!r}")
        return sympy.Integer(size)

    def step(self, step: Any) -> Expr:
        """A slice step: a positive int, or a size a graph input gives (proven >= 1)."""
        if isinstance(step, SIZE_ARGUMENTS):
            by = self.facts.expression(step)
            self.facts.require(sympy.Ge(by, 1), "step")
            return by
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise Unproven(f"step {step!r}")
        return sympy.Integer(step)

    def index(self, i: Any, size: Expr) -> Expr:
        """A start/end/index argument as PyTorch reads it: negative counts from the end; a
        graph input holding a size stands for its symbol."""
        if isinstance(i, SIZE_ARGUMENTS):
            return self.facts.expression(i)
        if not isinstance(i, int) or isinstance(i, bool):
            raise Unproven(f"argument {i!r} is not an int")
        return size + i if i < 0 else sympy.Integer(i)


def _select(v: _View, dim: Any, index: Any) -> None:
    d = v.dim(dim)
    size = v.sizes[d]
    i = v.index(index, size)
    v.facts.require(sympy.Ge(i, 0), "select index")
    v.facts.require(sympy.Lt(i, size), "select index")
    v.offset += i * v.strides[d]
    del v.sizes[d], v.strides[d]


def _slice(v: _View, dim: Any = 0, start: Any = None, end: Any = None, step: Any = 1) -> None:
    d = v.dim(dim)
    size = v.sizes[d]
    first = sympy.Integer(0) if start is None else v.index(start, size)
    last = size if end is None or (isinstance(end, int) and end >= _TO_THE_END) else None
    if last is None:
        last = v.index(end, size)
    by = v.step(step)
    # No clamping: PyTorch clamps out-of-range starts and ends, the model does not.
    v.facts.require(sympy.Ge(first, 0), "slice start")
    v.facts.require(sympy.Le(first, last), "slice bounds")
    v.facts.require(sympy.Le(last, size), "slice end")
    v.offset += first * v.strides[d]
    length = last - first
    v.sizes[d] = length if by == 1 else internals.FloorDiv(length + by - 1, by)
    v.strides[d] = v.strides[d] * by


def _narrow(v: _View, dim: Any, start: Any, length: Any) -> None:
    d = v.dim(dim)
    first = v.index(start, v.sizes[d])
    if not isinstance(length, int) or length < 0:
        raise Unproven(f"narrow length {length!r}")
    v.facts.require(sympy.Ge(first, 0), "narrow start")
    v.facts.require(sympy.Le(first + length, v.sizes[d]), "narrow end")
    v.offset += first * v.strides[d]
    v.sizes[d] = sympy.Integer(length)


def _diagonal(v: _View, offset: Any = 0, dim1: Any = 0, dim2: Any = 1) -> None:
    d1, d2 = v.dim(dim1), v.dim(dim2)
    if d1 == d2 or not isinstance(offset, int):
        raise Unproven("diagonal arguments")
    s1, s2 = v.sizes[d1], v.sizes[d2]
    rows, cols = (s1, s2 - offset) if offset >= 0 else (s1 + offset, s2)
    length = rows if v.facts.decide(sympy.Le(rows, cols)) else cols
    # PyTorch leaves the offset alone for an empty diagonal: require a non-empty one.
    v.facts.require(sympy.Ge(length, 1), "diagonal length")
    v.offset += offset * v.strides[d2] if offset >= 0 else -offset * v.strides[d1]
    stride = v.strides[d1] + v.strides[d2]
    for d in sorted((d1, d2), reverse=True):
        del v.sizes[d], v.strides[d]
    v.sizes.append(length)
    v.strides.append(stride)


def _unfold(v: _View, dim: Any, size: Any, step: Any) -> None:
    # Ints only: unfold's schema takes int window and step, so a SymInt would be specialized.
    d = v.dim(dim) if v.sizes else None
    if d is None or not isinstance(size, int) or not isinstance(step, int) or step < 1:
        raise Unproven("unfold arguments")
    v.facts.require(sympy.Le(size, v.sizes[d]), "unfold window")
    windows = v.sizes[d] - size
    v.sizes[d] = (windows if step == 1 else internals.FloorDiv(windows, step)) + 1
    stride = v.strides[d]
    v.strides[d] = stride * step
    v.sizes.append(sympy.Integer(size))
    v.strides.append(stride)


def _expand(v: _View, sizes: Any, implicit: bool = False) -> None:
    new = list(sizes)
    lead = len(new) - len(v.sizes)
    if lead < 0 or implicit:
        raise Unproven("expand arguments")
    out_sizes: list[Expr] = []
    out_strides: list[Expr] = []
    for j, want in enumerate(new):
        keep = isinstance(want, int) and not isinstance(want, bool) and want == -1
        if j < lead and keep:
            raise Unproven("expand -1 on a new dim")
        size, stride = (sympy.Integer(1), sympy.Integer(0)) if j < lead else v.dim_at(j - lead)
        if keep:
            out_sizes.append(size)
            out_strides.append(stride)
            continue
        # A size is an int or a graph input holding one (which stands for its symbol).
        wanted = v.size_argument(want)
        if v.facts.equal(size, wanted):
            out_sizes.append(size)
            out_strides.append(stride)
        elif v.facts.equal(size, 1):
            v.facts.require(sympy.Ge(wanted, 0), "expand size")
            out_sizes.append(wanted)
            out_strides.append(sympy.Integer(0))
        else:
            raise Unproven(f"expand of size {size} to {wanted}")
    v.sizes, v.strides = out_sizes, out_strides


def _permute(v: _View, dims: Any) -> None:
    order = [v.dim(d) for d in dims]
    if sorted(order) != list(range(len(v.sizes))):
        raise Unproven(f"permute {dims!r}")
    v.sizes = [v.sizes[d] for d in order]
    v.strides = [v.strides[d] for d in order]


def _transpose(v: _View, dim0: Any, dim1: Any) -> None:
    order = list(range(len(v.sizes)))
    a, b = v.dim(dim0), v.dim(dim1)
    order[a], order[b] = order[b], order[a]
    _permute(v, order)


def _t(v: _View) -> None:
    if len(v.sizes) > 2:
        raise Unproven("t of more than 2 dims")
    if len(v.sizes) == 2:
        _permute(v, [1, 0])


def _movedim(v: _View, source: Any, destination: Any) -> None:
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src, dst = [v.dim(d) for d in src], [v.dim(d) for d in dst]
    if len(src) != len(dst):
        raise Unproven("movedim arguments")
    rest = iter(d for d in range(len(v.sizes)) if d not in src)
    placed = dict(zip(dst, src, strict=True))
    _permute(v, [placed[p] if p in placed else next(rest) for p in range(len(v.sizes))])


def _unsqueeze(v: _View, dim: Any) -> None:
    d = v.dim(dim, extra=1)
    # The stride of a size-1 dim is never read (equivalence ignores it).
    v.sizes.insert(d, sympy.Integer(1))
    v.strides.insert(d, sympy.Integer(1))


def _squeeze(v: _View, dims: Any = None) -> None:
    if dims is None:
        chosen = list(range(len(v.sizes)))
    else:
        chosen = [v.dim(d) for d in ([dims] if isinstance(dims, int) else dims)]
    gone = [d for d in chosen if v.facts.decide(sympy.Eq(v.sizes[d], 1))]
    for d in sorted(set(gone), reverse=True):
        del v.sizes[d], v.strides[d]


def _view(v: _View, sizes: Any) -> None:
    new: list[Any] = [v.facts.expression(s) if isinstance(s, SIZE_ARGUMENTS) else s for s in sizes]
    if not all(isinstance(s, sympy.Expr) or (isinstance(s, int) and s >= -1) for s in new):
        raise Unproven(f"view sizes {sizes!r}")
    if new.count(-1) > 1:
        raise Unproven(f"view sizes {sizes!r}")
    numel = sympy.Mul(*v.sizes)
    if -1 in new:
        known = sympy.Mul(*(s for s in new if not _is_inferred(s)))
        inferred = sympy.cancel(numel / known)
        if not v.facts.proves(sympy.Ge(known, 1)) or sympy.fraction(inferred)[1] != 1:
            raise Unproven("view's -1 is not a whole size for every size")
        shape = [inferred if _is_inferred(s) else sympy.sympify(s) for s in new]
    else:
        shape = [sympy.sympify(s) for s in new]
        v.facts.require(sympy.Eq(sympy.Mul(*shape), numel), "view numel")
    v.facts.require(sympy.Ge(numel, 1), "view of a possibly empty tensor")
    v.strides = _view_strides(v.sizes, v.strides, shape, v.facts)
    v.sizes = shape


def _takes_dim(view_numel: Expr, size: Expr, tensor_numel: Expr, f: ShapeFacts) -> bool:
    """PyTorch's ``view_numel < tensor_numel or size == 1``, decided for every size.

    Either side may depend on the sizes while the disjunction does not: when the dim
    completes the chunk (``view_numel * size == tensor_numel``), it is taken at every size,
    as the one that fills it or as a size-1 dim after it.
    """
    if f.proves(sympy.Lt(view_numel, tensor_numel)) or f.proves(sympy.Eq(size, 1)):
        return True
    if f.proves(sympy.Eq(view_numel * size, tensor_numel)):
        return True
    return f.decide(sympy.Lt(view_numel, tensor_numel)) or f.decide(sympy.Eq(size, 1))


def _is_inferred(size: Any) -> bool:
    return isinstance(size, int) and size == -1


def _view_strides(
    old_sizes: Sequence[Expr], old_strides: Sequence[Expr], new: Sequence[Expr], f: ShapeFacts
) -> list[Expr]:
    """The strides ``view`` gives, by PyTorch's rule (merge or split only runs of dims that tile
    memory), every comparison decided for every size; raises :class:`Unproven` otherwise."""
    if not old_sizes:
        return [sympy.Integer(1)] * len(new)
    strides: list[Expr] = [sympy.Integer(0)] * len(new)
    view_d = len(new) - 1
    chunk_base = old_strides[-1]
    tensor_numel: Expr = sympy.Integer(1)
    view_numel: Expr = sympy.Integer(1)
    for d in range(len(old_sizes) - 1, -1, -1):
        tensor_numel = tensor_numel * old_sizes[d]
        chunk_ends = d == 0 or (
            not f.decide(sympy.Eq(old_sizes[d - 1], 1))
            and not f.decide(sympy.Eq(old_strides[d - 1], tensor_numel * chunk_base))
        )
        if not chunk_ends:
            continue
        while view_d >= 0 and _takes_dim(view_numel, new[view_d], tensor_numel, f):
            strides[view_d] = view_numel * chunk_base
            view_numel = view_numel * new[view_d]
            view_d -= 1
        if not f.decide(sympy.Eq(view_numel, tensor_numel)):
            raise Unproven("view does not tile its input's memory")
        if d > 0:
            chunk_base = old_strides[d - 1]
            tensor_numel = view_numel = sympy.Integer(1)
    if view_d != -1:
        raise Unproven("view does not tile its input's memory")
    return strides


def _identity(v: _View) -> None:
    return None


_MODELS: dict[Any, Callable[..., None]] = {
    aten.alias.default: _identity,
    aten.detach.default: _identity,
    aten.select.int: _select,
    aten.slice.Tensor: _slice,
    aten.narrow.default: _narrow,
    aten.diagonal.default: _diagonal,
    aten.unfold.default: _unfold,
    aten.expand.default: _expand,
    aten.permute.default: _permute,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.swapdims.default: _transpose,
    aten.swapaxes.default: _transpose,
    aten.movedim.int: _movedim,
    aten.movedim.intlist: _movedim,
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.unsqueeze.default: _unsqueeze,
    aten.view.default: _view,
}
assert set(_MODELS) <= LAYOUT_VIEWS


def apply_symbolic(
    chain: Sequence[ViewStep], source: SymbolicGeometry, facts: ShapeFacts
) -> SymbolicGeometry:
    """The geometry ``chain`` gives from ``source`` at every size; raises :class:`Unproven`."""
    view = _View(source, facts)
    for step in chain:
        model = _MODELS.get(step.op)
        if model is None:
            raise Unproven(f"{step.name()} is not modelled for symbolic shapes")
        try:
            model(view, *step.args)
        except TypeError as err:  # arguments that do not fit the op's signature
            raise Unproven(f"{step.name()}{step.args}: {err}") from err
    return view.geometry()


def verify_symbolic_chain(
    chain: Sequence[ViewStep],
    source: SymbolicGeometry,
    target: SymbolicGeometry,
    facts: ShapeFacts,
) -> bool:
    """Whether ``chain`` provably turns ``source`` into ``target`` at every size.

    See Note [Verifying a chain for every size]. Also verified on meta tensors at the sample
    points, a cross-check of the model against PyTorch's own kernels.
    """
    try:
        out = apply_symbolic(chain, source, facts)
    except Unproven:
        return False
    if not equivalent_symbolic(out, target, facts):
        return False
    # Under an assumption the chain need only be right where it holds (see ShapeFacts.assuming).
    points = [
        p for p in facts.points(source.free_symbols() | target.free_symbols()) if facts.holds_at(p)
    ]
    for point in points:
        at_source, at_target = source.at(point), target.at(point)
        if at_source is None or at_target is None:
            return False
        if not verify_chain(_at_point(chain, point, facts), at_source, at_target):
            return False
    return bool(points) or (source.is_static() and target.is_static())


def _at_point(chain: Sequence[ViewStep], point: Any, facts: ShapeFacts) -> tuple[ViewStep, ...]:
    """``chain`` with each graph input that holds a size replaced by its value at ``point``."""

    def value(arg: Any) -> Any:
        if isinstance(arg, SIZE_ARGUMENTS):
            return int(facts.expression(arg).xreplace(point))
        if isinstance(arg, list):
            return [value(a) for a in arg]
        return arg

    return tuple(ViewStep(step.op, tuple(value(a) for a in step.args)) for step in chain)
