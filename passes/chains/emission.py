"""Emission: an evaluator that turns a chain's steps into graph nodes with metadata.

Example::

    >>> emit = GraphEmitter(graph, like=as_strided_node)
    >>> with graph.inserting_before(as_strided_node):
    ...     out = apply_chain(chain, as_strided_node.args[0], emit)
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..compat import torch_internals as internals
from ..compat.fake_modes import in_one_fake_mode
from ..compat.torch_internals import FakeTensor, OpOverload, no_dispatch, pytree
from ..geometry.symbolic import SizeFromInput, SizeOfInputs
from ..op_tables import LAYOUT_VIEWS
from .chain import ViewStep


def fake_view_value(op: Callable[..., Any], val: Any, *args: Any) -> Any:
    """``op(val, *args)`` for a layout view of a fake tensor, without a FakeTensorMode dispatch.

    None where that cannot be exactly what the dispatch would give; the caller dispatches then.

    Note [Fake values of emitted views]
    -----------------------------------
    A FakeTensorMode dispatch costs a fraction of a millisecond per op: on a graph with
    thousands of emitted views, most of the pass. A fake tensor is a wrapper whose data is a meta
    tensor, so with dispatch modes off the view op runs its meta kernel on a meta tensor of the
    input's geometry over that storage: the result has the op's exact sizes, strides and
    offset, and shares the input's storage (the storage identity alias checks compare). (Run on
    the fake tensor itself, the op would go to the kernel of its fake device, which a torch
    built without that backend lacks: fake CUDA tensors on a CPU-only build.) Wrapping it as a
    fake tensor of the input's mode and device gives what the dispatch returns: same geometry,
    dtype, device, storage and mode.
    Left to the dispatch: inputs that require grad (the dispatch returns a non-leaf with a
    grad_fn), fake constants (the dispatch computes the op on the constant too), symbolic
    geometry (the meta kernel would guard on it), and ops outside :data:`LAYOUT_VIEWS`.
    ``reshape`` (the reshape step emits one per view it frees) returns exactly the ``view`` of
    its input wherever the input's layout admits that view: the ``view`` kernel runs, and only
    where it refuses (reshape would copy) the dispatch decides. tests/test_fake_values.py
    compares both values on the differential corpus.

    Example::

        >>> fake_view_value(aten.select.int, fake_8x8, 0, 1).stride()
        (1,)
    """
    copies_where_view_fails = op is _reshape
    if copies_where_view_fails:
        op = _view
    if not isinstance(op, OpOverload) or op not in LAYOUT_VIEWS:
        return None
    if type(val) is not FakeTensor or val.requires_grad or val.constant is not None:
        return None
    geometry = (*val.shape, *val.stride(), val.storage_offset())
    if not all(type(v) is int for v in geometry) or not _is_static(args):
        return None
    with no_dispatch():
        meta = torch.empty(0, dtype=val.dtype, device="meta")
        meta.set_(val.untyped_storage(), val.storage_offset(), val.shape, val.stride())
        try:
            out = op(meta, *args)
        except (RuntimeError, ValueError):  # the meta view kernel raises either, by release
            if copies_where_view_fails:
                return None  # not viewable: reshape copies, the dispatch says how
            raise
    if isinstance(out, torch.Tensor):
        return FakeTensor(val.fake_mode, out, val.device)
    return [FakeTensor(val.fake_mode, t, val.device) for t in out]  # split-like views: a list


_reshape, _view = torch.ops.aten.reshape.default, torch.ops.aten.view.default


def _is_static(args: Sequence[Any]) -> bool:
    """Whether a view op's arguments (ints, int lists, None) hold no symbolic value or tensor."""
    for arg in args:
        if isinstance(arg, (list, tuple)):
            if not _is_static(arg):
                return False
        elif isinstance(arg, (torch.SymInt, torch.SymBool, torch.Tensor)):
            return False
    return True


class GraphEmitter:
    """An evaluator that inserts ``op(*args)`` as graph nodes, with ``meta['val']`` filled in.

    Values for the new nodes are computed by running the op on the arguments' ``meta['val']``
    (fake or real tensors), so downstream passes see correct metadata; layout views of fake
    tensors take the cheaper, equal path of :func:`fake_view_value`.
    """

    def __init__(self, graph: torch.fx.Graph, like: torch.fx.Node) -> None:
        self.graph = graph
        self.like = like
        self.created: list[torch.fx.Node] = []

    def __call__(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(op, args, kwargs)
        vals, kwvals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta.get("val"))
        val = None if kwargs or not vals else fake_view_value(op, *vals)
        node.meta["val"] = self._value(op, vals, kwvals) if val is None else val
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in self.like.meta:
                node.meta[key] = self.like.meta[key]
        self.created.append(node)
        return node

    def _value(self, op: Callable[..., Any], vals: Any, kwvals: Any) -> Any:
        """``op``'s value on the arguments' values; a factory's (``arange``: no tensor argument)
        is made in the fake mode of the node the emitted ones stand in for."""
        if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves((vals, kwvals))):
            return op(*in_one_fake_mode(vals), **kwvals)
        mode = getattr(self.like.meta.get("val"), "fake_mode", None)
        with contextlib.nullcontext() if mode is None else mode:
            return op(*vals, **kwvals)


def with_size_nodes(emit: GraphEmitter, step: ViewStep) -> ViewStep:
    """``step`` with each size computed from a graph input (a
    :class:`~.symbolic_geometry.SizeFromInput`) emitted as int arithmetic on that input.

    Example::

        >>> with_size_nodes(emit, ViewStep(aten.slice.Tensor, (0, 0, SizeFromInput(k, 2, 0))))
        ViewStep(op=aten.slice.Tensor, args=(0, 0, mul))     # mul = k * 2, a new node
    """
    args = tuple(_size_node(emit, a) for a in step.args)
    return step if args == step.args else dataclasses.replace(step, args=args)


def _size_node(emit: GraphEmitter, arg: Any) -> Any:
    if isinstance(arg, list):
        return [_size_node(emit, a) for a in arg]
    if isinstance(arg, SizeOfInputs):
        return emit_size_expression(emit, arg.expr, dict(arg.inputs))
    if not isinstance(arg, SizeFromInput):
        return arg
    size: Any = arg.node
    if arg.scale != 1:
        size = emit(operator.mul, size, arg.scale)
    return emit(operator.add, size, arg.shift) if arg.shift else size


def has_int_arithmetic_form(expr: Any) -> bool:
    """Whether :func:`emit_size_expression` can emit ``expr`` (no ``Max``, no division)."""
    if expr.is_Integer or expr.is_Symbol:
        return True
    if expr.is_Pow:
        return bool(expr.exp.is_Integer and expr.exp > 0) and has_int_arithmetic_form(expr.base)
    if expr.is_Add or expr.is_Mul or isinstance(expr, internals.FloorDiv):
        return all(has_int_arithmetic_form(a) for a in expr.args)
    return False


def emit_size_expression(
    emit: GraphEmitter, expr: Any, inputs: dict[Any, torch.fx.Node]
) -> torch.fx.Node | int:
    """``expr`` (a sympy polynomial in symbols, with floor divisions) as int arithmetic on the
    graph inputs holding its symbols (``inputs``); an int if it is one.

    Example::

        >>> emit_size_expression(emit, n**2 - n - 1, {n: primals_1})
        add_1    # mul = primals_1 * primals_1; mul_1 = -1 * primals_1;
                 # add = -1 + mul; add_1 = add + mul_1  (sympy's order of terms)
    """
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return inputs[expr]
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return _folded(emit, operator.mul, [expr.base] * int(expr.exp), inputs)
    if expr.is_Add or expr.is_Mul:
        return _folded(emit, operator.add if expr.is_Add else operator.mul, expr.args, inputs)
    if isinstance(expr, internals.FloorDiv):
        return _folded(emit, operator.floordiv, expr.args, inputs)
    raise ValueError(f"{expr} has no int arithmetic form")


def _folded(
    emit: GraphEmitter, op: Callable[..., Any], terms: Sequence[Any], inputs: dict[Any, Any]
) -> Any:
    """``op`` applied left to right over the emitted ``terms``."""
    values = [emit_size_expression(emit, t, inputs) for t in terms]
    out = values[0]
    for value in values[1:]:
        out = emit(op, out, value)
    return out
