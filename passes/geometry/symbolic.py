"""Symbolic geometry: sizes, strides and offsets as expressions in a graph's ShapeEnv, and proofs.

Note [Proofs over symbolic shapes]
----------------------------------
A graph traced with dynamic shapes (make_fx's symbolic mode, torch.compile's automatic dynamic
or ``dynamic=True``, ``torch.export`` with ``Dim``\\ s) records sizes, strides and offsets as
SymInts: sympy expressions over symbols ``s0, s1, ...`` that stand for every size the graph
will run at. A rewrite of such a graph must be right for *every* value the symbols may take,
not only for the example the graph was traced on (the symbols' *hints*).

What the symbols may take is what the graph's ShapeEnv knows: each symbol's value range (sizes
of dynamic dims are at least 2: PyTorch specializes 0 and 1), replacements made by guards such
as ``Eq(s26, 9)`` (such a SymInt is an int), and the guards the trace recorded (a graph is only
valid where its guards hold: Dynamo checks them before each call, and export's
``range_constraints`` state them). :class:`ShapeFacts` proves a relation when

1. the ShapeEnv itself decides it statically (``statically_known_true``: value ranges and the
   guards as axioms, never adding a guard), or
2. bounding the difference of its two sides over the value ranges, each narrowed by the guards
   that bound one symbol linearly (``3*s - 6 >= 2`` gives ``s >= 3``), shows it. Each floor
   division ``a//k`` (stepped slices and windows are sized by them) is first written exactly
   as ``(a - r)/k`` with a fresh remainder ``0 <= r < k``, so that ``2*((s + 1)//2) - 1 <= s``
   is ``s - r <= s``; an equality is proven as two inequalities. A ``Max`` the side that must
   be larger holds with a positive coefficient is at least each of its arguments, so the
   relation is proven if it holds for one of them (``n*m <= Max(n*m, 3*n - 3)``). Where the
   bounds of a polynomial are lost to interval arithmetic (``n**2 - n - 1`` over ``n >= 2``),
   each symbol is written as its lower bound plus a non-negative ``t`` first
   (``t**2 + 3*t + 1``). An expression that is an integer at every point (integer
   coefficients, sizes and floor divisions) is ``>= 0`` where its bound is ``> -1``:
   ``s//2 - 1`` is ``(s - r)/2 - 1 >= -1/2`` over ``s >= 2``.
3. Facts made with :meth:`ShapeFacts.assuming` also hold a condition ``a >= 0`` the graph
   asserts at run time (see ``bounded_reads``): ``e >= 0`` is proven from it where ``e - a``
   is bounded below by 0 as above. Only proofs made for that graph's rewrite use it.

4. Where the graph's consumer checks the ShapeEnv's guards before each call (the compile
   backend: Dynamo builds its guards after the backend returns; it says so with
   :func:`guards_allowed`), a proof may be made true by recording a guard: the graph is then
   used only for sizes where it holds, and Dynamo compiles again for the others. Two kinds,
   each asked for where nothing else holds: an inequality that holds at the hints (inside
   :func:`guarding_unproven_bounds`; ``3 <= s`` for an ``unfold`` of 3 over a dim of ``s``,
   for a node under vmap that no chain or asserted chain rewrites), and a symbol equal to its
   hint (:meth:`ShapeFacts.pinned_at_hints`: a node whose input's layout is known at the hints
   alone), which specializes a size.

Anything else counts as unproven, and unproven means the as_strided is kept. Outside those
contexts nothing here asks a SymInt for a bool (which would install a guard decided on the
hint); expressions are sympy, whose relations refuse to become bools.

Example::

    >>> facts = ShapeFacts.of(gm)                 # the graph's ShapeEnv, or None if static
    >>> g = SymbolicGeometry.of(node.meta["val"], facts)
    >>> g.sizes, facts.proves(sympy.Ge(g.sizes[0], 2))
    ((s0, 6), True)
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from sympy import Expr

from ..compat import torch_internals as internals
from .concrete import Geometry


@dataclass(frozen=True)
class SymbolicGeometry:
    """Sizes, strides and storage offset as sympy expressions (integers for static values).

    Example::

        >>> SymbolicGeometry((s0, 6), (6, 1), 0).at({s0: 4})
        Geometry(sizes=(4, 6), strides=(6, 1), offset=0)
    """

    sizes: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    offset: Expr

    @classmethod
    def of(cls, tensor: torch.Tensor, facts: ShapeFacts) -> SymbolicGeometry:
        """The geometry of a fake tensor whose sizes may be SymInts of ``facts``' ShapeEnv."""
        return cls.from_values(tensor.shape, tensor.stride(), tensor.storage_offset(), facts)

    @classmethod
    def from_values(
        cls, sizes: Sequence[Any], strides: Sequence[Any], offset: Any, facts: ShapeFacts
    ) -> SymbolicGeometry:
        return cls(
            tuple(facts.expression(v) for v in sizes),
            tuple(facts.expression(v) for v in strides),
            facts.expression(offset),
        )

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> Expr:
        return sympy.Mul(*self.sizes)

    def values(self) -> tuple[Expr, ...]:
        return (*self.sizes, *self.strides, self.offset)

    def is_static(self) -> bool:
        return all(v.is_Integer for v in self.values())

    def free_symbols(self) -> set[sympy.Symbol]:
        return set().union(*(v.free_symbols for v in self.values()))

    def key(self) -> tuple[Expr, ...]:
        """Exact expressions, hashable: equal keys mean the same geometry at every size."""
        return self.values()

    def at(self, point: Mapping[sympy.Symbol, int]) -> Geometry | None:
        """The concrete geometry at ``point`` (values for the free symbols), or None if invalid."""
        values = [sympy.sympify(v.xreplace(point)) for v in self.values()]
        if not all(v.is_Integer for v in values):
            return None
        ints = [int(v) for v in values]
        n = self.ndim
        sizes, strides, offset = ints[:n], ints[n : 2 * n], ints[-1]
        if min([*sizes, *strides, offset], default=0) < 0:
            return None
        return Geometry(tuple(sizes), tuple(strides), offset)

    def __str__(self) -> str:
        return f"sizes={list(self.sizes)} strides={list(self.strides)} offset={self.offset}"


@dataclass(frozen=True)
class SizeFromInput:
    """A view op's argument computed from a graph input holding a size: ``scale * node + shift``.

    Emitted as int arithmetic on that input (no tensor is read, so vmap batches the graph).
    The end of the windows a backward scatters into, ``2 * (s//2 - 1)`` for ``s//2 - 1``
    pairs, is ``SizeFromInput(sub, 2, 0)`` where the graph's input ``sub`` holds ``s//2 - 1``.
    """

    node: torch.fx.Node
    scale: int
    shift: int

    def __str__(self) -> str:
        scaled = self.node.name if self.scale == 1 else f"{self.scale} * {self.node.name}"
        return scaled if self.shift == 0 else f"{scaled} {'+-'[self.shift < 0]} {abs(self.shift)}"


@dataclass(frozen=True)
class SizeOfInputs:
    """A view op's argument computed by int arithmetic from graph inputs that hold symbols.

    ``expr`` is a polynomial (with floor divisions) in symbols; ``inputs`` names the graph
    input holding each. The end of a diagonal's stepped slice over an ``(n, m)`` input's flat
    buffer, ``(n - 2) * (n + 1) + 1``, is ``SizeOfInputs(n**2 - n - 1, ((n, primals_1),))``.
    """

    expr: Expr
    inputs: tuple[tuple[sympy.Symbol, torch.fx.Node], ...]

    def __str__(self) -> str:
        return str(self.expr)


#: What a view op's argument may be besides an int: a size a graph input gives.
SIZE_ARGUMENTS = (torch.fx.Node, SizeFromInput, SizeOfInputs)


#: Whether the graph's guards are checked before each call, so a proof may add one (Note, 4).
_GUARDS_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "fxviews_guards_allowed", default=False
)
#: Whether proofs record an inequality that holds at the hints as a guard (Note, 4).
_GUARDING: contextvars.ContextVar[bool] = contextvars.ContextVar("fxviews_guarding", default=False)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar[bool]) -> Iterator[None]:
    token = var.set(True)
    try:
        yield
    finally:
        var.reset(token)


def guards_allowed() -> contextlib.AbstractContextManager[None]:
    """A context saying that the graphs rewritten in it are used only where their ShapeEnv's
    guards hold (the compile backend's), so proofs may add guards (see the Note, 4)."""
    return _setting(_GUARDS_ALLOWED)


def guarding_unproven_bounds() -> contextlib.AbstractContextManager[None]:
    """Inside :func:`guards_allowed`, a context in which :meth:`ShapeFacts.proves` makes an
    inequality that holds at the hints true by guarding on it (see the Note, 4).

    Example::

        >>> with guards_allowed(), guarding_unproven_bounds():
        ...     facts.proves(sympy.Le(3, s0))    # hint 8: True, and the ShapeEnv guards 3 <= s0
        True
    """
    return _setting(_GUARDING)


class Unproven(Exception):
    """A relation the ShapeEnv's facts neither prove nor refute: the chain cannot be trusted."""


class ShapeFacts:
    """What a graph's ShapeEnv says about its symbols, and proofs from it (see the Note above)."""

    def __init__(self, shape_env: Any) -> None:
        self.shape_env = shape_env
        # Every guard recorded so far is an axiom of the proofs (the compile backend proves in
        # Dynamo's graph, then AOTAutograd's, and guards are added in between).
        internals.forget_static_evaluations(shape_env)
        self.ranges = _ranges_narrowed_by_guards(shape_env)
        self.hints: dict[sympy.Symbol, int] = {
            s: int(v) for s, v in internals.symbol_hints(shape_env).items()
        }
        #: Graph inputs that are sizes themselves (AOTAutograd passes each symbol as an int
        #: argument, and a backward graph the sizes its forward saved, such as ``s//2 - 1``),
        #: by expression: a chain may take a size from them. See bind_size_inputs.
        self.size_inputs: dict[Expr, torch.fx.Node] = {}
        #: Conditions ``a >= 0`` the rewritten graph asserts at run time (see ``assuming``).
        self.assumptions: tuple[Expr, ...] = ()

    def assuming(self, condition: Expr) -> ShapeFacts:
        """These facts and ``condition >= 0``: for proofs of a rewrite that asserts it.

        Example::

            >>> facts.assuming(n * m - 3 * n).proves(sympy.Le(3 * n, n * m))
            True
        """
        assumed = copy.copy(self)
        assumed.assumptions = (*self.assumptions, sympy.expand(condition))
        return assumed

    def holds_at(self, point: Mapping[sympy.Symbol, int]) -> bool:
        """Whether every assumption holds at ``point`` (values for the symbols)."""
        return all(bool(a.xreplace(point) >= 0) for a in self.assumptions)

    def settled(self, geometry: SymbolicGeometry) -> SymbolicGeometry:
        """``geometry`` with each ``Max``/``Min`` these facts settle replaced by its argument."""
        return SymbolicGeometry(
            tuple(self._settle_extrema(v) for v in geometry.sizes),
            tuple(self._settle_extrema(v) for v in geometry.strides),
            self._settle_extrema(geometry.offset),
        )

    def bind_size_inputs(self, graph: torch.fx.Graph) -> None:
        """Record the graph's inputs whose value is a symbolic size.

        They are plain ints when the graph runs, so a view op reading one needs no
        ``sym_size`` of a tensor (which vmap cannot batch). make_fx and export graphs read
        sizes from tensors instead, and have none.
        """
        for node in graph.find_nodes(op="placeholder"):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt) and val.node.shape_env is self.shape_env:
                expr = self.expression(val)
                if not expr.is_Integer:
                    self.size_inputs.setdefault(expr, node)

    @classmethod
    def of(cls, values: Iterable[Any]) -> ShapeFacts | None:
        """Facts of the ShapeEnv behind the first symbolic value among ``values``, or None."""
        for value in values:
            for v in _ints_of(value):
                if isinstance(v, torch.SymInt):
                    return cls(v.node.shape_env)
        return None

    def expression(self, value: Any) -> Expr:
        """``value`` (an int, a SymInt or a graph node holding one) as a simplified expression.

        A SymInt of another ShapeEnv, or anything else, raises :class:`Unproven`.
        """
        if isinstance(value, SizeFromInput):
            return value.scale * self.expression(value.node) + value.shift
        if isinstance(value, SizeOfInputs):
            return value.expr
        if isinstance(value, torch.fx.Node):
            value = value.meta.get("val")
        if isinstance(value, bool):
            raise Unproven(f"{value!r} is not a size")
        if isinstance(value, sympy.Expr):
            return value
        if isinstance(value, int):
            return sympy.Integer(value)
        if isinstance(value, torch.SymInt):
            constant = value.node.maybe_as_int()
            if constant is not None:
                return sympy.Integer(constant)
            if value.node.shape_env is self.shape_env:
                # simplify applies the guards' replacements: Eq(s26, 9) makes s26 the integer 9.
                expr = sympy.sympify(sympy.expand(self.shape_env.simplify(value.node.expr)))
                return self._settle_extrema(expr)
        raise Unproven(f"{value!r} is not a size of this graph's shape environment")

    def _settle_extrema(self, expr: Expr) -> Expr:
        """``Max``/``Min`` replaced by the argument proven largest/smallest for every size.

        Flat gradient buffers have ``Max(6, 6*s0)`` elements; with ``s0 >= 2`` that is ``6*s0``.
        """

        def is_extremum(e: Any) -> bool:
            return getattr(e.func, "__name__", "") in ("Max", "Min") and len(e.args) > 1

        def settle(e: Any) -> Any:
            order = sympy.Ge if e.func.__name__ == "Max" else sympy.Le
            for a in e.args:
                if all(self.proves(order(a, b)) for b in e.args if b is not a):
                    return a
            return e

        return expr.replace(is_extremum, settle)

    def proves(self, relation: Any) -> bool:
        """Whether ``relation`` (sympy) holds for every value the symbols may take."""
        relation = sympy.sympify(relation)
        if relation is sympy.true:
            return True
        if relation is sympy.false:
            return False
        symbool = self.shape_env.create_symboolnode(relation)
        if internals.statically_known_true(symbool):
            return True
        if isinstance(relation, sympy.Eq):
            difference = sympy.expand(relation.lhs - relation.rhs)
            return difference == 0 or (
                self._bounded_below(difference, strict=False)
                and self._bounded_below(-difference, strict=False)
            )
        if isinstance(relation, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)):
            low, strict = _lower_side(relation)
            return self._bounded_below(low, strict) or self._guarded(relation, symbool)
        return False

    def pinned_at_hints(self, symbols: Iterable[sympy.Symbol]) -> bool:
        """Inside :func:`guards_allowed`, guard each of ``symbols`` to its hint (the graph is
        then used at these sizes only, and Dynamo compiles again for others): whether it did.
        For a node whose sizes must be known: no chain is proven for it at every size."""
        symbols = sorted(symbols, key=str)
        if not _GUARDS_ALLOWED.get() or any(s not in self.hints for s in symbols):
            return False
        for symbol in symbols:
            bool(self.shape_env.create_symboolnode(sympy.Eq(symbol, self.hints[symbol])))
        return True

    def _guarded(self, relation: Any, symbool: Any) -> bool:
        """Whether ``relation`` holds at the hints and is now guarded (see the Note, 4)."""
        allowed = _GUARDS_ALLOWED.get() and _GUARDING.get()
        if not allowed or relation.xreplace(self.hints) is not sympy.true:
            return False
        return bool(symbool)  # a SymBool's bool() records the guard in the ShapeEnv

    def _bounded_below(self, expr: Expr, strict: bool) -> bool:
        """Whether ``expr > 0`` (strict) or ``expr >= 0`` for every value, alone, with one of
        the arguments of a ``Max`` it grows with, or less an assumption (see the Note)."""
        expr = sympy.expand(expr)
        for case in (expr, *_without_maxima(expr)):
            if any(self._bounds_show(c, strict) for c in (case, *self._less_assumptions(case))):
                return True
        return False

    def _less_assumptions(self, expr: Expr) -> list[Expr]:
        return [sympy.expand(expr - a) for a in self.assumptions]

    def _bounds_show(self, expr: Expr, strict: bool) -> bool:
        """Whether ``expr``'s bounds over the value ranges show it ``> 0`` (strict) or ``>= 0``,
        each floor division written exactly with a remainder of known range (see
        :func:`_without_floor_divisions`), and again with each symbol shifted to its lower
        bound."""
        linear, remainders = _without_floor_divisions(expr)
        ranges = {**self.ranges, **remainders}
        # An integer is >= 0 where it is > -1: bounds of the exact linear form may be
        # fractions (n//2 - 1 over n >= 2 is (n - r)/2 - 1 >= -1/2), the value is not.
        least = 0 if strict or not _is_integer_valued(expr) else -1
        forms = [(sympy.expand(linear), ranges), _shifted_to_lower_bounds(linear, ranges)]
        for form, form_ranges in forms:
            bound = internals.bound_sympy(form, form_ranges)
            if bool(bound.lower > least) or (least == 0 and not strict and bound.lower >= 0):
                return True
        return False

    def decide(self, relation: Any) -> bool:
        """``relation``'s truth value if it is proven or refuted for every value, else raise."""
        if self.proves(relation):
            return True
        if self.proves(sympy.Not(relation)):
            return False
        raise Unproven(f"{relation} depends on the sizes")

    def equal(self, a: Any, b: Any) -> bool:
        return self.proves(sympy.Eq(a, b))

    def require(self, relation: Any, what: str) -> None:
        if not self.proves(relation):
            raise Unproven(f"{what}: {relation} is not proven for every size")

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """A context in which PyTorch's fake kernels record no guard in the ShapeEnv."""
        return self.shape_env.suppress_guards()

    def points(self, symbols: Iterable[sympy.Symbol]) -> list[dict[sympy.Symbol, int]]:
        """The hint, and two points that move every symbol by a different amount and keep
        their order: ``s -> (k + 1) * s + i`` and ``(k + 1) * s + i + 1`` for the ``i``-th
        of ``k`` symbols.

        Used to choose the form of a chain's arguments (constant, relative to a dim's end, a
        graph input); the choice is then proven for every size, so the points need no other
        property. Keeping the order keeps the hint's chain: ``s0 - s1`` stays positive. The
        two moved points differ by one, so a floor division by 2 tells them apart (``s - 2``
        and ``2 * (s//2 - 1)`` agree at even sizes only).
        """
        symbols = sorted(symbols, key=str)
        hint = {s: self.hints[s] for s in symbols if s in self.hints}
        if len(hint) != len(symbols):
            return []
        scale = len(hint) + 1
        return [
            hint,
            *(
                {s: scale * v + i + extra for i, (s, v) in enumerate(hint.items())}
                for extra in (0, 1)
            ),
        ]


def equivalent_symbolic(a: SymbolicGeometry, b: SymbolicGeometry, facts: ShapeFacts) -> bool:
    """Proven, for every size: same sizes; same strides on dims not of size 1; same offset.

    Stricter than :func:`~.geometry.equivalent` where a size may be 0 (the offset must still
    agree), which only ever keeps a node.
    """
    if a.ndim != b.ndim or not all(
        facts.equal(x, y) for x, y in zip(a.sizes, b.sizes, strict=True)
    ):
        return False
    for size, x, y in zip(a.sizes, a.strides, b.strides, strict=True):
        if not (facts.equal(x, y) or facts.equal(size, 1)):
            return False
    return facts.equal(a.offset, b.offset)


def is_one_to_one_symbolic(geometry: SymbolicGeometry, facts: ShapeFacts) -> bool:
    """:func:`~.geometry.is_one_to_one` for every size: in the order of the strides' trace-time
    values, each walking dim's stride is proven to exceed the furthest address the dims before
    it reach. The order is only a candidate; the inequalities are what is proven.

    Example::

        >>> is_one_to_one_symbolic(SymbolicGeometry((s0, 3), (3, 1), 0), facts)
        True
    """
    walking = []
    for size, stride in zip(geometry.sizes, geometry.strides, strict=True):
        if facts.equal(size, 1):
            continue
        hint = sympy.sympify(stride.xreplace(facts.hints))
        if not hint.is_Integer:
            return False
        walking.append((int(hint), stride, size))
    reach: Expr = sympy.Integer(0)
    for _, stride, size in sorted(walking, key=lambda item: item[0]):
        if not facts.proves(sympy.Gt(stride, reach)):
            return False
        reach = reach + (size - 1) * stride
    return True


def _ints_of(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [*value.shape, *value.stride(), value.storage_offset()]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _ints_of(item)]
    if isinstance(value, torch.fx.Node):
        return _ints_of(value.meta.get("val"))
    return [value]


def _lower_side(relation: Any) -> tuple[Expr, bool]:
    """``(e, strict)`` with the relation equivalent to ``e > 0`` (strict) or ``e >= 0``."""
    if isinstance(relation, (sympy.Ge, sympy.Gt)):
        return relation.lhs - relation.rhs, isinstance(relation, sympy.Gt)
    return relation.rhs - relation.lhs, isinstance(relation, sympy.Lt)


def _without_floor_divisions(expr: Expr) -> tuple[Expr, dict[sympy.Symbol, Any]]:
    """``expr`` with each ``FloorDiv(a, k)`` (``k`` a positive integer) replaced by the exact
    ``(a - r) / k`` for a fresh remainder ``r`` in ``[0, k - 1]``, and those remainders' ranges.

    Bounding the result bounds ``expr``: ``2*((s + 1)//2) - 1 <= s`` becomes ``s - r <= s``,
    which holds for every ``r >= 0``, where interval arithmetic on ``(s + 1)//2`` alone loses
    the relation between the two sides.
    """
    remainders: dict[sympy.Symbol, Any] = {}
    while True:
        innermost = [
            d
            for d in expr.atoms(internals.FloorDiv)
            if not any(a.atoms(internals.FloorDiv) for a in d.args)
        ]
        divisions = [d for d in innermost if d.args[1].is_Integer and d.args[1] > 0]
        if not divisions:
            return expr, remainders
        for division in divisions:
            numerator, divisor = division.args
            remainder = sympy.Dummy("r", integer=True)
            remainders[remainder] = internals.ValueRanges(0, int(divisor) - 1)
            expr = expr.xreplace({division: (numerator - remainder) / divisor})


def _ranges_narrowed_by_guards(shape_env: Any) -> dict[sympy.Symbol, Any]:
    """Each symbol's value range, narrowed by every recorded guard linear in that one symbol.

    The ShapeEnv keeps ranges as declared (sizes >= 2) and guards such as ``3*s - 6 >= 2`` as
    axioms it matches only verbatim; solving the linear ones gives the bound they imply.
    """
    ranges = dict(shape_env.var_to_range)
    for guard in shape_env.guards:
        relation = guard.expr
        if not isinstance(relation, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)):
            continue
        if len(relation.free_symbols) != 1:
            continue
        [symbol] = relation.free_symbols
        if not symbol.is_integer:  # a float symbol (a scalar Dynamo traces as a tensor)
            continue
        side, strict = _lower_side(relation)
        if not sympy.expand(side).is_polynomial(symbol):  # Max(...), FloorDiv(...)
            continue
        poly = sympy.Poly(sympy.expand(side), symbol)
        if poly.degree() != 1 or not all(c.is_Integer for c in poly.all_coeffs()):
            continue
        a, b = (int(c) for c in poly.all_coeffs())
        current = ranges.get(symbol)
        if current is None:
            continue
        bound = sympy.Rational((1 if strict else 0) - b, a)  # a*s + b >= (1 if strict else 0)
        if a > 0:
            lower = max(current.lower, int(sympy.ceiling(bound)))
            ranges[symbol] = internals.ValueRanges(lower, current.upper)
        else:
            upper = min(current.upper, int(sympy.floor(bound)))
            ranges[symbol] = internals.ValueRanges(current.lower, upper)
    return ranges


def _without_maxima(expr: Expr) -> list[Expr]:
    """``expr`` with a ``Max`` it holds with a positive coefficient replaced by each of its
    arguments: each is at most ``expr``, so one bounded below bounds ``expr`` below."""
    out: list[Expr] = []
    for extremum in set(sympy.preorder_traversal(expr)):
        if getattr(extremum.func, "__name__", "") != "Max":
            continue
        coefficient = expr.coeff(extremum)
        rest = sympy.expand(expr - coefficient * extremum)
        if coefficient.is_number and coefficient > 0 and not rest.has(extremum):
            out.extend(rest + coefficient * a for a in extremum.args)
    return out


def _shifted_to_lower_bounds(expr: Expr, ranges: Mapping[Any, Any]) -> tuple[Expr, dict[Any, Any]]:
    """``expr`` with each symbol ``s`` of finite lower bound ``L`` written ``L + t`` for a
    fresh ``t`` in ``[0, upper - L]``, expanded, and the ranges for it. Interval arithmetic
    then keeps what the lower bounds give (``n**2 - n - 1`` over ``n >= 2`` is
    ``t**2 + 3*t + 1``, at least 1)."""
    shifts, shifted_ranges = {}, dict(ranges)
    for symbol in expr.free_symbols:
        value_range = ranges.get(symbol)
        if value_range is None or not sympy.sympify(value_range.lower).is_Integer:
            continue
        t = sympy.Dummy("t", integer=True)
        shifts[symbol] = value_range.lower + t
        shifted_ranges[t] = internals.ValueRanges(0, value_range.upper - value_range.lower)
    return sympy.expand(expr.xreplace(shifts)), shifted_ranges


def _is_integer_valued(expr: Expr) -> bool:
    """Whether ``expr`` is an integer wherever its symbols are: integer symbols, integer
    coefficients, and only sums, products, powers, floor divisions and extrema of those."""
    if not all(symbol.is_integer for symbol in expr.free_symbols):
        return False
    for node in sympy.preorder_traversal(expr):
        if node.is_Number and not node.is_Integer:
            return False
        if node.is_Pow and not (node.exp.is_Integer and node.exp >= 0):
            return False
        if node.is_Function and node.func.__name__ not in ("FloorDiv", "Max", "Min"):
            return False
    return True
