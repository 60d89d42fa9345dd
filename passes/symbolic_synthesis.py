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
- ``-1`` for the one size a ``view`` infers, or for a dim ``expand`` keeps.

The form of each argument is chosen by synthesizing the concrete chain (``synthesize``) at two
points: the symbols' hints, and every symbol moved by a different amount. An argument equal at
both points is a constant; one whose distance to the end of its dim is equal at both points is
counted from the end; anything else (an argument that follows the sizes some other way) gives
no chain, and the node is kept. The choice is only a candidate: the chain is then proven for
every size by ``verify_symbolic_chain`` before it is used.

Example::

    >>> chain = synthesize_symbolic(SymbolicGeometry((s0, 6), (6, 1), 0),
    ...                             SymbolicGeometry((s0 - 1, 6), (6, 1), 6), facts)
    >>> describe_chain(chain, "x")
    'slice(x, 0, 1)'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .chain import ViewChain, ViewStep
from .geometry import Geometry
from .symbolic_geometry import ShapeFacts, SymbolicGeometry
from .synthesis import synthesize

aten = torch.ops.aten

#: Per op: the argument positions (after the input) that index into a dim, and that dim's
#: position among the arguments. Such an argument may be counted from the dim's end.
_POSITIONS = {aten.select.int: ((1,), 0), aten.slice.Tensor: ((1, 2), 0)}
#: Ops whose first argument is a list of sizes, one of which may be inferred (-1).
_SIZE_LISTS = {aten.view.default, aten.expand.default}
#: The form of a slice end at the end of its dim: emitted as None.
_END = "end"


def synthesize_symbolic(
    source: SymbolicGeometry,
    target: SymbolicGeometry,
    facts: ShapeFacts,
    find: Callable[[Geometry, Geometry], ViewChain | None] = synthesize,
) -> ViewChain | None:
    """A candidate chain for every size (see the Note above), not yet proven; or None.

    ``find`` gives the concrete chain at a point (default: synthesis).
    """
    points = facts.points(source.free_symbols() | target.free_symbols())
    if not points:
        return None
    forms: list[list[tuple[Any, ...]]] = []
    for point in points:
        at_source, at_target = source.at(point), target.at(point)
        if at_source is None or at_target is None:
            return None
        chain = find(at_source, at_target)
        if chain is None:
            return None
        forms.append(_argument_forms(chain, at_source))
    if len({len(f) for f in forms}) != 1:
        return None

    def size_input(values: list[Any]) -> torch.fx.Node | None:
        """A graph input holding a size equal to ``values`` at every point, if any."""
        for symbol, node in facts.size_inputs.items():
            if all(point.get(symbol) == v for point, v in zip(points, values, strict=True)):
                return node
        return None

    steps = []
    for per_point in zip(*forms, strict=True):
        step = _common_step(per_point, size_input)
        if step is None:
            return None
        steps.append(step)
    return tuple(steps)


def _argument_forms(chain: ViewChain, source: Geometry) -> list[tuple[Any, ...]]:
    """Per step: ``(op, args, from_end)``; ``from_end`` holds each argument counted from the
    end of its dim (negative, or ``_END`` for a slice end at the end), None where it cannot be
    counted so."""
    value = source.meta_tensor()
    out = []
    for step in chain:
        args = step.args
        from_end: list[Any] = [None] * len(args)
        if step.op in _POSITIONS and args:
            positions, dim_at = _POSITIONS[step.op]
            size = value.shape[args[dim_at]]
            for p in positions:
                if p < len(args) and isinstance(args[p], int):
                    relative = _normalized(args[p], size) - size
                    if relative < 0:
                        from_end[p] = relative
                    elif p == 2:  # a slice end at the end of its dim
                        from_end[p] = _END
        out.append((step.op, args, tuple(from_end)))
        value = step.op(value, *args)
    return out


def _normalized(index: int, size: int) -> int:
    """An index or slice bound as PyTorch reads it: negative from the end, clamped to the dim."""
    if index < 0:
        index += size
    return min(max(index, 0), size)


def _common_step(
    per_point: tuple[tuple[Any, ...], ...],
    size_input: Callable[[list[Any]], torch.fx.Node | None],
) -> ViewStep | None:
    """The step whose every argument has the same form at every point, or None."""
    ops = {op for op, _, _ in per_point}
    if len(ops) != 1 or len({len(args) for _, args, _ in per_point}) != 1:
        return None
    [op] = ops
    args: list[Any] = []
    for position in range(len(per_point[0][1])):
        values = [a[position] for _, a, _ in per_point]
        relatives = [r[position] for _, _, r in per_point]
        if op in _SIZE_LISTS and position == 0:
            sizes = _common_sizes(values, size_input)
            if sizes is None:
                return None
            args.append(sizes)
        elif all(v == values[0] for v in values):
            args.append(values[0])
        elif relatives[0] is not None and all(r == relatives[0] for r in relatives):
            args.append(None if relatives[0] is _END else relatives[0])
        else:
            node = size_input(values)
            if node is None:
                return None
            args.append(node)
    return ViewStep(op, tuple(args))


def _common_sizes(
    values: list[Any], size_input: Callable[[list[Any]], torch.fx.Node | None]
) -> list[Any] | None:
    """A size list for every point: constant sizes, then a graph input holding the size, and
    ``-1`` for at most one size left; else None."""
    if len({len(v) for v in values}) != 1:
        return None
    sizes: list[Any] = []
    for column in zip(*values, strict=True):
        if all(c == column[0] for c in column):
            sizes.append(column[0])
        else:
            node = size_input(list(column))
            sizes.append(-1 if node is None else node)
    return sizes if sizes.count(-1) <= 1 else None
