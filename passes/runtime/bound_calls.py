"""Call a graph's aten ops through PyTorch's own Python bindings, where they are the same call.

Note [Calling ops through their Python bindings]
------------------------------------------------
A traced graph's code calls each op as ``torch.ops.aten.mul.Tensor(x, y)``: an ``OpOverload``,
whose call goes through a Python frame and then the schema-generic, boxed argument path (every
argument matched against the schema and boxed into a stack). Eager code calls the same op as
``torch.mul(x, y)`` or ``x.mul(y)``: PyTorch's generated binding, which parses its arguments
in C++ and calls the op unboxed. The difference is about a microsecond per op, and on a small
program under ``vmap`` (a few ops of a few microseconds each) it is what makes a graph slower
than the eager code it was recorded from. So, for a graph that is only run (the transform's
cached graph; never one handed to another compiler, which reads the overloads):

1. **Candidates.** For a node calling ``aten.<name>.<overload>``: ``torch.<name>`` (or
   ``torch.nn.functional.<name>``) where it is a C++ builtin that generated code reaches by
   its module and name (``torch.split`` is a Python wrapper of the C++ one: not a candidate),
   else the method
   ``Tensor.<name>`` where it is a C++ method descriptor
   (emitted as FX's ``call_method``, ``x.<name>(...)``). Python-written functions
   (``torch.split``, ``Tensor.__getitem__`` paths) are never candidates: they may do more.
2. **Proof.** The binding must reach the dispatcher with exactly the node's op and arguments.
   Both calls run on meta tensors of the node's inputs' layouts under a dispatch mode that
   stops at the first op either reaches and records it: the same ``OpOverload`` (for a
   ``CompositeImplicitAutograd`` op, the same first op of the same decomposition: both run the
   one C++ kernel), the same arguments (the inputs by identity, Python scalars as the wrapped
   0-d tensors the dispatcher sees). Nothing is computed. A binding that picks another
   overload, reorders or converts an argument, or refuses the call is not used. A one-element
   list for an ``int[1]`` parameter (``sum``'s dims) is passed as its int, as eager code spells
   ``x.sum(-1)``: the parser makes the same list of it, a list parse less per call (~0.2 us),
   and the proof holds it to that.
3. **Once per kind.** The verdict depends on the op and on the Python kinds of its arguments
   (which signature a binding's parser picks), not on shapes or values: it is kept per
   ``(op, kinds)`` for the process, so a graph pays for the proof of the kinds it has not
   met yet (tens of microseconds each).

4. **Constants.** The graph reads each tensor it holds (a closed-over parameter or buffer, a
   ``get_attr`` node) as ``self._tensor_constant0``: on a ``GraphModule`` that is
   ``nn.Module.__getattr__`` looking through ``_parameters`` and ``_buffers`` (~0.7 us), where
   eager code reads a parameter it closes over in ~40 ns. :func:`bind_constants` sets each one
   in the module's instance ``__dict__`` as well, where attribute lookup finds it first; the
   module keeps its parameters and buffers as they were.

Ops whose result is a value or shaped by values (tagged ``data_dependent_output`` or
``dynamic_output_shape``) keep their ``OpOverload``: callers find them by those tags
(``transform`` runs such a graph eagerly where ``vmap`` batches it). Under a
``TorchFunctionMode`` or a tensor subclass, a bound node is seen as its binding
(``torch.mul``), as the eager code's call is, where the overload was seen as
``aten.mul.Tensor``.

Checked: besides the proof of step 2, ``tests/test_opinfo_steps.py`` runs the graph of every
OpInfo sample (float32, CPU; a fixed share under ``make test``, all under ``make fuzz``) with
and without this step, on the traced sample, on another and under ``vmap``, and requires the
same results bit for bit (or the same error).

Example::

    >>> bind_calls(gm)  # torch.ops.aten.mul.Tensor(x, 2) -> torch.mul(x, 2)
    3
"""

from __future__ import annotations

import functools
import operator
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ..compat.torch_internals import OpOverload, TorchDispatchMode, op_schema

__all__ = ["bind_calls", "bind_constants"]

aten = torch.ops.aten

#: The tags of ops whose result is a value or shaped by values (see the Note).
_VALUE_TAGS = frozenset({torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape})
#: The verdict per ``(op, argument kinds)``: the node's new ``(op, target)``, or None.
_VERDICTS: dict[tuple[Any, ...], tuple[str, Any] | None] = {}
#: ``aten.slice.Tensor``'s defaults for dim, start, end and step.
_SLICE_DEFAULTS: tuple[Any, ...] = (0, None, None, 1)


def bind_calls(gm: torch.fx.GraphModule) -> int:
    """Point each node of ``gm`` whose op has an equivalent Python binding at that binding, in
    place (see the Note). Returns how many nodes changed; the caller recompiles."""
    bound = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        if _VALUE_TAGS.intersection(node.target.tags):
            continue
        if node.target is aten.slice.Tensor:
            bound += _bind_slice(node)
            continue
        spelled = _single_ints(node.target, node.args)
        key = (node.target, _kinds(node.args), tuple(sorted(node.kwargs)), spelled is not None)
        if key not in _VERDICTS:
            _VERDICTS[key] = _prove(node, _candidate(node.target), spelled)
        verdict = _VERDICTS[key]
        if verdict is not None:
            node.op, node.target = verdict
            if spelled is not None:
                node.args = spelled
            bound += 1
    return bound


def _single_ints(op: OpOverload, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``args`` with each one-element list of ints passed for an ``int[1]`` parameter spelled as
    the int alone, as eager code writes ``x.sum(-1)`` (the parser makes the same list of it,
    and parsing an int costs ~0.2 us less than a list); None where there is none."""
    spelled = list(args)
    for position in _int1_positions(op):
        value = args[position] if position < len(args) else None
        if isinstance(value, list) and len(value) == 1 and type(value[0]) is int:
            spelled[position] = value[0]
    return tuple(spelled) if spelled != list(args) else None


@functools.cache
def _int1_positions(op: OpOverload) -> tuple[int, ...]:
    """The positions of ``op``'s ``int[1]`` parameters, read from its schema once per op."""
    arguments = op_schema(op).arguments
    # The stubs leave an argument's fixed list length N out.
    return tuple(i for i, a in enumerate(arguments) if getattr(a, "N", None) == 1)


def _bind_slice(node: torch.fx.Node) -> bool:
    """``slice(x, dim, start, end, step)`` as ``x[:, ..., start:end:step]`` (the ``:`` for each
    dim before ``dim``), as eager code spells it, where that indexing reaches exactly this
    slice: ATen's indexing skips a slice of the whole dim, so the proof is per argument values."""
    # The schema's defaults for the arguments the node leaves out: dim 0, start, end, step 1.
    given: list[Any] = [*node.args, *_SLICE_DEFAULTS[len(node.args) - 1 :]]
    x, dim, start, end, step = given[:5]
    if node.kwargs or not isinstance(dim, int) or dim < 0:
        return False
    index = (*[slice(None)] * dim, slice(start, end, step))
    key = (aten.slice.Tensor, dim, start, end, step, _kinds(x))
    if key not in _VERDICTS:
        _VERDICTS[key] = _prove(node, ("call_function", operator.getitem), (x, index))
    if _VERDICTS[key] is None:
        return False
    node.target, node.args = operator.getitem, (x, index)
    return True


def bind_constants(gm: torch.fx.GraphModule) -> None:
    """Put each tensor ``gm``'s graph reads by name (``get_attr``) in ``gm.__dict__`` (step 4
    of the Note), so its generated code reads it without ``nn.Module.__getattr__``."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and "." not in node.target:
            gm.__dict__[node.target] = getattr(gm, node.target)


def _kinds(value: Any) -> Any:
    """The Python kinds a binding's parser tells signatures apart by."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_kinds(item) for item in value))
    if isinstance(value, torch.fx.Node):
        return "tensor" if isinstance(value.meta.get("val"), torch.Tensor) else "node"
    return type(value).__name__


def _candidate(op: OpOverload) -> tuple[str, Any] | None:
    """The binding of ``op``'s name (step 1): ``("call_function", torch.<name>)`` or
    ``("call_method", "<name>")``."""
    name = op.overloadpacket.__name__
    for namespace in (torch, torch.nn.functional):  # F.linear is C++'s, torch.linear is not
        function = getattr(namespace, name, None)
        if isinstance(function, types.BuiltinFunctionType) and _named_as_itself(function):
            return "call_function", function
    if isinstance(getattr(torch.Tensor, name, None), types.MethodDescriptorType):
        return "call_method", name
    return None


def _named_as_itself(function: Any) -> bool:
    """Whether ``function``'s module and name lead back to it: generated code calls it by that
    name (``torch.split`` names the Python wrapper of the C++ ``split``, not the C++ one)."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    return module is not None and getattr(module, function.__name__, None) is function


def _prove(
    node: torch.fx.Node, candidate: tuple[str, Any] | None, spelled: Any = None
) -> tuple[str, Any] | None:
    """``candidate`` if it reaches the dispatcher as ``node``'s op does (step 2), called with
    ``node``'s arguments or, where it spells them otherwise, with ``spelled``."""
    if candidate is None:
        return None
    made: dict[torch.fx.Node, torch.Tensor] = {}  # one meta tensor per input node

    def on_meta(value: Any) -> Any:
        if not isinstance(value, torch.fx.Node):
            return value
        if value not in made:
            val = value.meta.get("val")
            if not isinstance(val, torch.Tensor) or not _static(val):
                raise _Unprovable
            made[value] = torch.empty_strided(
                val.shape, val.stride(), dtype=val.dtype, device="meta"
            )
        return made[value]

    try:
        args = torch.fx.node.map_aggregate(node.args, on_meta)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, on_meta)
        binding_args = args if spelled is None else torch.fx.node.map_aggregate(spelled, on_meta)
    except _Unprovable:
        return None
    inputs = list(made.values())
    kind, target = candidate
    binding: Callable[..., Any] = (
        target if kind == "call_function" else lambda *a, **k: getattr(a[0], target)(*a[1:], **k)
    )
    expected = _first_op(node.target, args, kwargs)  # type: ignore[arg-type]
    reached = _first_op(binding, binding_args, kwargs)
    if expected is None or reached is None or not _same(expected, reached, inputs):
        return None
    return candidate


def _static(value: torch.Tensor) -> bool:
    return all(isinstance(size, int) for size in (*value.shape, *value.stride()))


class _Unprovable(Exception):  # noqa: N818 - a signal inside this module
    pass


class _Reached(Exception):  # noqa: N818 - a signal inside this module
    def __init__(self, func: Any, args: Any, kwargs: Any) -> None:
        super().__init__()
        self.call = (func, args, kwargs)


class _StopAtFirstOp(TorchDispatchMode):
    """Records the first op a call reaches, with its arguments, and stops the call there."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise _Reached(func, args, kwargs or {})


def _first_op(call: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, ...] | None:
    try:
        with _StopAtFirstOp():
            call(*args, **kwargs)
    except _Reached as reached:
        return reached.call
    except Exception:  # noqa: BLE001 - a binding that refuses these arguments is no candidate
        return None
    return None  # it reached no op at all


def _same(a: Any, b: Any, inputs: list[torch.Tensor]) -> bool:
    """Whether two recorded calls are the same call: inputs by identity, scalars wrapped by the
    dispatcher by dtype and value."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if any(a is t for t in inputs) or any(b is t for t in inputs):
            return a is b
        return (
            a.dim() == 0 == b.dim()
            and a.device.type == "cpu" == b.device.type
            and a.dtype == b.dtype
            and a.item() == b.item()
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, inputs) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], inputs) for k in a)
    return type(a) is type(b) and a == b
