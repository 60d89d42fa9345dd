"""Synthesis over symbolic shapes: one chain for every size, with arguments vmap can batch.

Note [A chain for every size]
-----------------------------
A symbolic target (``as_strided(x, [s - 2, 3], [1, 1])`` on ``x`` of size ``[s]``) needs view
ops whose arguments follow the sizes: ``unfold(x, 0, 3, 1)`` here, ``slice(x, 0, 1, s - 1)``
elsewhere. Writing ``s - 1`` into the graph would need a ``sym_size`` node on the input, and
``vmap`` of a graph holding ``aten.sym_size.int`` of a batched tensor raises (it has no batching
rule). So every argument is emitted as an int that PyTorch itself reads relative to the dim
it applies to:

- a constant (``select(x, 0, 0)``, an ``unfold`` window, a ``view`` size of 6);
- a position counted from the end of its dim: ``slice(x, 0, 1, -1)`` for the end ``s - 1``,
  ``None`` for the end itself, ``select(x, 0, -1)`` for the last index;
- ``-1`` for the one size a ``view`` infers, or for a dim ``expand`` keeps;
- in graphs whose inputs hold sizes (``torch.compile``'s), that input, or int arithmetic on
  it (``2 * k`` for an input ``k``): ints too, so vmap batches the graph.

The form of each argument is chosen by synthesizing the concrete chain (``synthesize``) at three
points: the symbols' hints, and two points that move every symbol by a different amount and
keep their order (see ``ShapeFacts.points``). An argument equal at every point is a constant;
one whose distance to the end of its dim is equal at every point is counted from the end; a
size a graph input holds at every point is that input, and one an affine function of an input
gives at every point is that function of it; anything else (an argument that follows the
sizes some other way) gives no chain, and the node is kept.

A slice end is not always unique: a stepped slice (``x[0:7:2]`` is ``x[0:8:2]``), or a slice
whose elements past the last a later stepped ``unfold`` takes are never read, may stop
anywhere within a step. Every end that gives the same result at a point (checked on meta
tensors) is a reading of it there, and a reading common to all points is chosen: the target
``((s + 1)//2,)`` strides ``(2,)`` is ``slice(x, 0, 0, 7, 2)`` at ``s = 8`` and
``slice(x, 0, 0, 17, 2)`` at ``s = 17``, both read as ``slice(x, 0, 0, None, 2)``. And where
synthesis splits a dim with ``view`` into windows that tile it, a count that follows the sizes
by a floor division has no view size; the same windows taken by ``unfold`` with a step equal to
the window are a second candidate.

The choice is only a candidate: the chain is then proven for every size by
``verify_symbolic_chain`` (floor divisions included) before it is used.

Example::

    >>> chain = next(synthesize_symbolic(SymbolicGeometry((s0, 6), (6, 1), 0),
    ...                                  SymbolicGeometry((s0 - 1, 6), (6, 1), 6), facts))
    >>> describe_chain(chain, "x")
    'slice(x, 0, 1)'
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..geometry.concrete import Geometry
from ..geometry.symbolic import ShapeFacts, SizeFromInput, SymbolicGeometry
from .chain import ViewChain, ViewStep
from .synthesis import synthesize, synthesize_sliced, synthesize_uniform
from .verification import verify_chain

aten = torch.ops.aten

#: Per op: the argument positions (after the input) that index into a dim, and that dim's
#: position among the arguments. Such an argument may be counted from the dim's end.
_POSITIONS = {aten.select.int: ((1,), 0), aten.slice.Tensor: ((1, 2), 0)}
#: Ops whose first argument is a list of sizes, one of which may be inferred (-1).
_SIZE_LISTS = {aten.view.default, aten.expand.default}


def synthesize_symbolic(
    source: SymbolicGeometry, target: SymbolicGeometry, facts: ShapeFacts
) -> Iterator[ViewChain]:
    """Candidate chains for every size (see the Note above), not yet proven, best first.

    The chains of plain synthesis, then of :func:`~.synthesis.synthesize_uniform` (windows by
    ``unfold``, every dim sliced), then of :func:`~.synthesis.synthesize_sliced` (every dim
    sliced), each generalized in the orders of :data:`_PREFERENCES`; each distinct chain once.
    """
    points = facts.points(source.free_symbols() | target.free_symbols())
    if not points:
        return
    plain = (synthesize, synthesize_uniform, synthesize_sliced)
    finders: list[Callable[[Geometry, Geometry], ViewChain | None]] = list(plain)
    # Windows counted along the dims whose sizes follow the symbols keep every window's size
    # constant (windows of 3 over a dim of s: the count is s - 2, the window 3).
    counted = frozenset(j for j, size in enumerate(target.sizes) if size.free_symbols)
    if counted:
        finders += [functools.partial(find, counted=counted) for find in plain]
    seen: list[ViewChain] = []  # steps hold lists (view sizes): compared, not hashed
    for find in finders:
        forms = _forms_at_points(find, source, target, points)
        for preference in _PREFERENCES:
            chain = None if forms is None else _generalized(forms, facts, points, preference)
            if chain is not None and chain not in seen:
                seen.append(chain)
                yield chain


def _forms_at_points(
    find: Callable[[Geometry, Geometry], ViewChain | None],
    source: SymbolicGeometry,
    target: SymbolicGeometry,
    points: list[dict[Any, int]],
) -> list[list[_StepForm]] | None:
    """The chain ``find`` gives at each point, step by step; None if a point has none, or
    the points' chains differ in length."""
    forms: list[list[_StepForm]] = []
    for point in points:
        at_source, at_target = source.at(point), target.at(point)
        if at_source is None or at_target is None:
            return None
        chain = find(at_source, at_target)
        if chain is None:
            return None
        forms.append(_argument_forms(chain, at_source, at_target))
    return forms if len({len(f) for f in forms}) == 1 else None


def _generalized(
    forms: list[list[_StepForm]],
    facts: ShapeFacts,
    points: list[dict[Any, int]],
    preference: str,
) -> ViewChain | None:
    """One chain for all points, each argument in a form that holds at every point;
    ``preference``: which form an argument takes first (see :data:`_PREFERENCES`)."""

    inputs = [
        (node, [int(expr.xreplace(point)) for point in points])
        for expr, node in facts.size_inputs.items()
        if expr.free_symbols <= points[0].keys()
    ]

    def size_input(values: list[Any], affine: bool = True) -> torch.fx.Node | SizeFromInput | None:
        """A graph input holding a size equal to ``values`` at every point, or (``affine``)
        an affine function of one (two points fit one exactly: a candidate, proven later)."""
        if not all(type(v) is int for v in values):
            return None
        for node, held in inputs:
            if held == values:
                return node
        for node, held in inputs if affine else ():
            if held[0] == held[1]:
                continue
            scale, rest = divmod(values[1] - values[0], held[1] - held[0])
            shift = values[0] - scale * held[0]
            if (
                rest == 0
                and scale != 0
                and all(scale * h + shift == v for h, v in zip(held, values, strict=True))
            ):
                return SizeFromInput(node, scale, shift)
        return None

    steps = []
    for per_point in zip(*forms, strict=True):
        step = _common_step(per_point, size_input, preference)
        if step is None:
            return None
        if not _is_whole_slice(step):
            steps.append(step)
    return tuple(steps)


#: The orders in which an argument's forms are tried, one candidate chain each: its own
#: readings (constant, from the end), then those of equivalent values, then a graph input;
#: the equivalent values' readings first; a graph input (or a size computed from one) first
#: for an argument that differs between the points (an end counted from the end may hold at
#: the points and not at every size, where ``2 * k`` for an input ``k`` does).
_OWN, _COMMON, _INPUTS = "own", "common", "inputs"
_PREFERENCES = (_OWN, _COMMON, _INPUTS)

#: ``size_input(values, affine=True)``: a graph input holding a size with ``values`` at the
#: points, or (``affine``) a size computed from one; None if there is none.
SizeInput = Callable[..., "torch.fx.Node | SizeFromInput | None"]


@dataclass(frozen=True)
class _StepForm:
    """A step of the chain at one point, with the ways each argument can be read.

    ``own[p]`` holds the readings of argument ``p`` itself: ``(_CONSTANT, v)``, and for an
    index argument ``(_FROM_END, r)``, ``r`` elements before the end of its dim (``r = 0``: the
    end itself). ``readings(p)`` adds those of every other value that gives the same chain
    result at this point: a slice end may stop anywhere past the last element that a stepped
    slice, or a later stepped ``unfold``, takes. Readings of the argument itself are preferred
    (each alternative is only checked with the other steps as they are); the others are found
    on meta tensors, on first use.
    """

    op: Any
    args: tuple[Any, ...]
    own: tuple[frozenset[tuple[str, int]], ...]
    #: Per argument position with readings beyond its own: what finds them.
    more: dict[int, Callable[[], frozenset[tuple[str, int]]]]

    def readings(self, position: int) -> frozenset[tuple[str, int]]:
        more = self.more.get(position)
        return self.own[position] if more is None else more()


_CONSTANT = "constant"
_FROM_END = "from end"


def _argument_forms(chain: ViewChain, source: Geometry, target: Geometry) -> list[_StepForm]:
    """Per step of ``chain`` at one point: its arguments and their readings."""
    value = source.meta_tensor()
    out = []
    for i, step in enumerate(chain):
        args = step.args
        own = [frozenset({(_CONSTANT, a)}) if isinstance(a, int) else frozenset() for a in args]
        more: dict[int, Callable[[], frozenset[tuple[str, int]]]] = {}
        if step.op in _POSITIONS and args:
            positions, dim_at = _POSITIONS[step.op]
            size = value.shape[args[dim_at]]
            for p in positions:
                if p >= len(args) or not isinstance(args[p], int):
                    continue
                own[p] = _index_readings({args[p]}, size)
                if step.op is aten.slice.Tensor and p == 2:
                    more[p] = functools.cache(
                        functools.partial(_end_readings, chain, i, size, source, target)
                    )
        out.append(_StepForm(step.op, args, tuple(own), more))
        value = step.op(value, *args)
    return out


def _index_readings(values: set[int], size: int) -> frozenset[tuple[str, int]]:
    """Each index or slice bound in ``values`` as a constant and counted from the end."""
    return frozenset(
        {(_CONSTANT, v) for v in values}
        | {(_FROM_END, _normalized(v, size) - size) for v in values}
    )


def _end_readings(
    chain: ViewChain, at: int, size: int, source: Geometry, target: Geometry
) -> frozenset[tuple[str, int]]:
    """The readings of every end of the slice ``chain[at]`` that gives the same result."""
    return _index_readings(_equivalent_ends(chain, at, size, source, target), size)


def _equivalent_ends(
    chain: ViewChain, at: int, size: int, source: Geometry, target: Geometry
) -> set[int]:
    """The ends of the slice ``chain[at]`` (a dim of ``size``) with which ``chain`` still gives
    ``target``: its own, and those within the largest step or window of the chain of it."""
    _, start, end, *rest = chain[at].args
    reach = max([1, *(a for step in chain for a in _steps_and_windows(step))])
    first = _normalized(start, size)
    own = _normalized(end, size)
    ends = {end}
    for other in range(max(first, own - reach), min(size, own + reach) + 1):
        if other == own:
            continue
        step = ViewStep(aten.slice.Tensor, (chain[at].args[0], start, other, *rest))
        if verify_chain((*chain[:at], step, *chain[at + 1 :]), source, target):
            ends.add(other)
    return ends


def _steps_and_windows(step: ViewStep) -> list[int]:
    """The step of a slice, the window and step of an unfold: how far a slice end may move
    without changing what they take."""
    if step.op is aten.slice.Tensor:
        return [a for a in step.args[3:4] if type(a) is int]
    if step.op is aten.unfold.default:
        return [a for a in step.args[1:3] if type(a) is int]
    return []


def _normalized(index: int, size: int) -> int:
    """An index or slice bound as PyTorch reads it: negative from the end, clamped to the dim."""
    if index < 0:
        index += size
    return min(max(index, 0), size)


def _common_step(
    per_point: tuple[_StepForm, ...],
    size_input: SizeInput,
    preference: str,
) -> ViewStep | None:
    """The step whose every argument has one reading at every point, or None."""
    ops = {form.op for form in per_point}
    if len(ops) != 1 or len({len(form.args) for form in per_point}) != 1:
        return None
    [op] = ops
    args: list[Any] = []
    for position in range(len(per_point[0].args)):
        values = [form.args[position] for form in per_point]
        if op in _SIZE_LISTS and position == 0:
            sizes = _common_sizes(values, size_input)
            if sizes is None:
                return None
            args.append(sizes)
            continue
        if all(v == values[0] for v in values) and not isinstance(values[0], int):
            args.append(values[0])  # None, a list of dims, a bool
            continue
        is_end = op is aten.slice.Tensor and position == 2
        if preference == _INPUTS and len(set(values)) > 1:
            node = size_input(values)
            if node is not None:
                args.append(node)
                continue
        own = frozenset.intersection(*(form.own[position] for form in per_point))
        reading = _preferred(own, values[0], is_end) if preference != _COMMON else ()
        if not reading:
            common = frozenset.intersection(*(form.readings(position) for form in per_point))
            reading = _preferred(common, values[0], is_end)
        if reading:
            args.extend(reading)
            continue
        node = size_input(values)
        if node is None:
            return None
        args.append(node)
    return ViewStep(op, tuple(args))


def _preferred(common: frozenset[tuple[str, int]], first: Any, is_end: bool) -> tuple[Any, ...]:
    """``(argument,)`` for a reading common to all points, or ``()`` if there is none: the
    value itself if it is constant, then the end of the dim (a slice end, emitted as None),
    then another constant, then a position counted from the end."""
    if (_CONSTANT, first) in common:
        return (first,)
    if is_end and (_FROM_END, 0) in common:
        return (None,)
    constants = sorted(v for kind, v in common if kind == _CONSTANT)
    if constants:
        return (constants[0],)
    before_end = sorted((v for kind, v in common if kind == _FROM_END and v < 0), reverse=True)
    return (before_end[0],) if before_end else ()


def _is_whole_slice(step: ViewStep) -> bool:
    """A slice of a whole dim with step 1 (what an end read as the dim's end can leave)."""
    return step.op is aten.slice.Tensor and tuple(step.args[1:]) in ((0, None), (0, None, 1))


def _common_sizes(values: list[Any], size_input: SizeInput) -> list[Any] | None:
    """A size list for every point: constant sizes, then a graph input holding the size,
    ``-1`` for one size left, or else a size computed from a graph input; else None."""
    if len({len(v) for v in values}) != 1:
        return None
    columns = list(zip(*values, strict=True))
    sizes: list[Any] = []
    for column in columns:
        if all(c == column[0] for c in column):
            sizes.append(column[0])
        else:
            sizes.append(size_input(list(column), False))
    left = [i for i, size in enumerate(sizes) if size is None]
    if len(left) == 1:
        sizes[left[0]] = -1
        return sizes
    for i in left:
        sizes[i] = size_input(list(columns[i]))
    return None if None in sizes else sizes
