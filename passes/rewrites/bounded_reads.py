"""Bounded reads: an as_strided of a dense input as view ops over its flat buffer, right
wherever the as_strided reads inside its input, and a runtime assertion of that condition.

Note [Rewrites that assert their reads stay inside the input]
-------------------------------------------------------------
Some symbolic as_strided nodes have no view chain that is right for every size a guard-free
graph allows, because at some of those sizes the as_strided itself reads past its input (eager
raises "out of bounds for storage" there, for a tensor whose storage is its own elements):
``x.as_strided((n - 1, 2, 3), (3, 3, 1))`` on an ``(n, c)`` input reads ``3n`` elements, more
than ``n*c`` when ``c = 2``; a view chain clamps or raises differently there. Where the read
fits, such a node is a geometry over the input's flat buffer, and one chain follows the symbols:

1. The input must be proven *dense*: a permutation of its dims (by its strides at the hints)
   makes it contiguous at offset 0, each stride proven to be the product of the sizes after
   it. ``permute`` (if the order is not the identity) and ``view(x, [-1])`` give its flat
   buffer of ``N`` elements; a 1-D contiguous input is its own.
2. The target must have sizes proven ``>= 1`` and strides proven ``>= 1`` (a dim of size 1
   has any). Ordered by decreasing stride at the hints (``d_1, ..., d_k``), its reads span
   ``E = offset + sum((size_i - 1) * stride_i) + 1`` elements, and the chain is: ``slice`` the
   buffer to ``[offset, E)``; for each ``d_j`` but the last, ``unfold`` the last dim into
   windows as long as what the later dims read (``sum over i > j of (size_i - 1) * stride_i + 1``)
   every ``stride_j``, which makes ``size_j`` windows exactly; where the windows tile (the
   window is ``stride_j``) a ``view`` splits off ``size_j`` instead: ``unfold`` takes ints
   only (a symbolic window would be specialized), and Inductor (torch 2.13) copies an
   ``unfold`` of an ``unfold`` with symbolic sizes, which breaks an output that aliases an
   input; ``slice`` the last dim with step
   ``stride_k``; ``permute`` back to the target's order. A 1-D target is the one stepped slice
   ``slice(flat, 0, offset, E, stride)`` (a diagonal of an ``(n, m)`` input with stride
   ``n + 1``). Arguments that follow the symbols are int arithmetic on the graph inputs that
   hold the symbols (``SizeOfInputs``): no tensor is read, so vmap batches the graph.
3. The condition is ``E <= N``: the last element read is inside the input. If the ShapeEnv
   proves it (a backward's buffer is sized ``Max(N, E)`` for it), nothing more is needed.
   Otherwise the chain is proven under it as an assumption (``ShapeFacts.assuming``: nothing
   else is weakened, nothing is decided on the hints) and the rewrite emits
   ``aten._assert_scalar(E <= N, message)`` computed from the graph's int inputs beside it: a
   runtime check, not a Dynamo guard, so no recompile condition is added. At a size where it
   fails, eager's as_strided raises too; the rewritten graph raises there with a message that
   names the node and the condition, and is never silently wrong.

The chain is then proven like every symbolic chain (``verify_symbolic_chain``). It is offered
only where the usual candidates found none, only where every symbol of the condition is held by
a graph input (``torch.compile`` graphs: make_fx and export graphs keep the as_strided, with its
reason), and only where the condition holds at the hints: a graph traced at a size where the
as_strided reads past its input keeps it, so the inner compiler gets what it got before.

Example::

    >>> # x.as_strided((n - 1, 2, 3), (3, 3, 1)) on an (n, c) input, n = s77 and c = s27
    >>> [(describe_chain(c, "x"), str(a)) for c, _, a in bounded_candidates(src, dst, facts)]
    [('view(unfold(slice(view(x, [-1]), 0, 0, 3*s77), 0, 6, 3), [s77 - 1, -1, 3])',
      '3*s77 <= s27*s77')]
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from sympy import Expr

from ..chains.chain import ViewChain, ViewStep
from ..chains.emission import GraphEmitter, emit_size_expression, has_int_arithmetic_form
from ..compat.torch_internals import assert_scalar
from ..geometry.symbolic import ShapeFacts, SizeOfInputs, SymbolicGeometry

aten = torch.ops.aten


@dataclass(frozen=True)
class InBounds:
    """The condition ``end <= numel`` (in elements) a rewrite asserts at run time, and the
    graph inputs holding its symbols.

    Example::

        >>> str(InBounds(3 * n, n * c, ((n, arg0_1), (c, arg1_1))))
        '3*n <= c*n'
    """

    end: Expr
    numel: Expr
    inputs: tuple[tuple[sympy.Symbol, torch.fx.Node], ...]

    def __str__(self) -> str:
        return f"{self.end} <= {self.numel}"

    def emit(
        self, graph: torch.fx.Graph, like: torch.fx.Node, before: torch.fx.Node
    ) -> list[torch.fx.Node]:
        """``_assert_scalar(end <= numel, message)`` for ``like`` (the as_strided node),
        inserted before ``before`` (the first node of its chain); the nodes made."""
        emit = GraphEmitter(graph, like)
        inputs = dict(self.inputs)
        with graph.inserting_before(before):
            end = emit_size_expression(emit, self.end, inputs)
            numel = emit_size_expression(emit, self.numel, inputs)
            holds = emit(operator.le, end, numel)
            message = (
                f"fxviews: the view ops that replace {like.name!r} need its reads inside its "
                f"input ({self} elements, as {describe_sizes(self.inputs)}); at these sizes "
                "the as_strided reads past its input, where eager as_strided raises"
            )
            # Made directly: running _assert_scalar on a SymBool for its value would guard.
            check = graph.call_function(assert_scalar, (holds, message))
        check.meta["val"] = None
        made = [*emit.created, check]
        if "stack_trace" in like.meta:
            check.meta["stack_trace"] = like.meta["stack_trace"]
        return made


def describe_sizes(inputs: tuple[tuple[sympy.Symbol, torch.fx.Node], ...]) -> str:
    """Which graph input holds each symbol: ``s77 = arg0_1, s27 = arg1_1``."""
    return ", ".join(f"{symbol} = {node.name}" for symbol, node in inputs)


def bounded_candidates(
    source: SymbolicGeometry, target: SymbolicGeometry, facts: ShapeFacts
) -> Iterator[tuple[ViewChain, ShapeFacts, InBounds | None]]:
    """The flat-buffer chain of the Note, the facts it is to be proven with, and the condition
    to assert (None if the ShapeEnv proves it); nothing where the Note's conditions fail."""
    plan = _plan(source, target, facts)
    if plan is None:
        return
    to_flat, steps, end, numel = plan
    inputs = {expr: node for expr, node in facts.size_inputs.items() if expr.is_Symbol}
    if facts.proves(sympy.Le(end, numel)):
        chain = _emittable((*to_flat, *_whole_end(steps, end, numel)), facts, inputs)
        if chain is not None:
            yield chain, facts, None
        return
    symbols = sorted(end.free_symbols | numel.free_symbols, key=str)
    if not set(symbols) <= inputs.keys() or not sympy.Le(end, numel).xreplace(facts.hints):
        return
    if not (has_int_arithmetic_form(end) and has_int_arithmetic_form(numel)):
        return
    chain = _emittable((*to_flat, *steps), facts, inputs)
    if chain is not None:
        yield (
            chain,
            facts.assuming(numel - end),
            InBounds(end, numel, tuple((s, inputs[s]) for s in symbols)),
        )


def why_not_asserted(source: SymbolicGeometry, target: SymbolicGeometry, facts: ShapeFacts) -> str:
    """Why a node the Note's chain would take was kept: its condition could not be asserted
    (no graph input holds its sizes), or it fails at the hints; "" if neither applies."""
    plan = _plan(source, target, facts)
    if plan is None:
        return ""
    end, numel = plan[2:]
    if facts.proves(sympy.Le(end, numel)):
        return ""
    if not sympy.Le(end, numel).xreplace(facts.hints):
        return f"; it reads past its input at the trace-time sizes ({end} > {numel})"
    held = {expr for expr in facts.size_inputs if expr.is_Symbol}
    if (end.free_symbols | numel.free_symbols) <= held:
        return ""  # the chain over the flat buffer was not proven: the failure above says why
    return (
        f"; over its input's flat buffer it is right where {end} <= {numel}, which the graph "
        "cannot assert at run time: no graph input holds those sizes"
    )


def _plan(
    source: SymbolicGeometry, target: SymbolicGeometry, facts: ShapeFacts
) -> tuple[list[ViewStep], list[ViewStep], Expr, Expr] | None:
    """The steps to the flat buffer, the steps from it to the target, the end of the reads
    and the buffer's length; None where the Note's conditions fail."""
    flattening = _flattening(source, facts)
    windows = _windows(target, facts)
    if flattening is None or windows is None:
        return None
    return flattening[0], windows[0], windows[1], flattening[1]


def _by_stride(geometry: SymbolicGeometry, facts: ShapeFacts) -> list[int] | None:
    """The dims in order of decreasing stride at the hints (ties in dim order), or None."""
    hints = [sympy.sympify(s.xreplace(facts.hints)) for s in geometry.strides]
    if not all(h.is_Integer for h in hints):
        return None
    return sorted(range(geometry.ndim), key=lambda d: -int(hints[d]))


def _flattening(source: SymbolicGeometry, facts: ShapeFacts) -> tuple[list[ViewStep], Expr] | None:
    """The steps giving a dense input's flat buffer, and its length (step 1 of the Note)."""
    order = _by_stride(source, facts)
    if not order or not facts.equal(source.offset, 0):
        return None
    numel: Expr = sympy.Integer(1)
    for d in reversed(order):
        size, stride = source.sizes[d], source.strides[d]
        if not (facts.equal(size, 1) or facts.equal(stride, numel)):
            return None
        numel = numel * size
    steps = [] if order == sorted(order) else [ViewStep(aten.permute.default, (order,))]
    if source.ndim > 1:
        steps.append(ViewStep(aten.view.default, ([-1],)))
    return steps, sympy.expand(numel)


def _windows(target: SymbolicGeometry, facts: ShapeFacts) -> tuple[list[ViewStep], Expr] | None:
    """The steps taking the target from a flat buffer, arguments as sympy expressions, and
    the end of its reads (step 2 of the Note)."""
    if not all(facts.proves(sympy.Ge(size, 1)) for size in target.sizes):
        return None
    strides = [
        sympy.Integer(1) if facts.equal(size, 1) else stride
        for size, stride in zip(target.sizes, target.strides, strict=True)
    ]
    if not all(facts.proves(sympy.Ge(stride, 1)) for stride in strides):
        return None
    order = _by_stride(SymbolicGeometry(target.sizes, tuple(strides), target.offset), facts)
    if not order:
        return None
    reach = [(size - 1) * stride for size, stride in zip(target.sizes, strides, strict=True)]
    end = sympy.expand(target.offset + sum(reach) + 1)
    last = order[-1]
    if len(order) == 1:
        return [ViewStep(aten.slice.Tensor, (0, target.offset, end, strides[last]))], end
    steps = [ViewStep(aten.slice.Tensor, (0, target.offset, end))]
    for k, d in enumerate(order[:-1]):
        window = sympy.expand(sum(reach[e] for e in order[k + 1 :]) + 1)
        if sympy.expand(window - strides[d]) == 0:  # windows that tile: split by a view
            sizes = [target.sizes[e] for e in order[:k]]
            steps.append(ViewStep(aten.view.default, ([*sizes, -1, window],)))
        elif window.is_Integer and strides[d].is_Integer:
            steps.append(ViewStep(aten.unfold.default, (k, window, strides[d])))
        else:  # unfold's window and step are ints: a symbolic one would be specialized
            return None
    if strides[last] != 1:
        steps.append(ViewStep(aten.slice.Tensor, (len(order) - 1, 0, None, strides[last])))
    if order != sorted(order):
        steps.append(ViewStep(aten.permute.default, ([order.index(d) for d in range(len(order))],)))
    return steps, end


def _whole_end(steps: list[ViewStep], end: Expr, numel: Expr) -> list[ViewStep]:
    """``steps`` with a first slice that ends at the buffer's end written ``None``."""
    first = steps[0]
    if sympy.expand(end - numel) != 0:
        return steps
    return [ViewStep(first.op, (*first.args[:2], None, *first.args[3:])), *steps[1:]]


def _emittable(
    steps: tuple[ViewStep, ...], facts: ShapeFacts, inputs: dict[Expr, torch.fx.Node]
) -> ViewChain | None:
    """``steps`` with each symbolic argument as a graph input holding it or int arithmetic on
    the inputs holding its symbols; None if a symbol has no such input (make_fx graphs)."""

    def argument(value: Any) -> Any:
        if isinstance(value, list):
            return [argument(v) for v in value]
        if not isinstance(value, sympy.Expr):
            return value
        if value.is_Integer:
            return int(value)
        held = facts.size_inputs.get(value)
        if held is not None:
            return held
        if not value.free_symbols <= inputs.keys() or not has_int_arithmetic_form(value):
            raise LookupError(value)
        symbols = sorted(value.free_symbols, key=str)
        return SizeOfInputs(value, tuple((s, inputs[s]) for s in symbols))

    try:
        return tuple(ViewStep(step.op, tuple(argument(a) for a in step.args)) for step in steps)
    except LookupError:
        return None
