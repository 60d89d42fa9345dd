"""The autograd API that dispatches no op, as a torch function mode sees it while a trace runs
(step 3 of Note [What autograd sees is part of the trace] in ``fxviews/autograd_structure.py``).

``requires_grad_``, ``detach_``, ``.data``, a factory's ``requires_grad=True`` become nodes
doing the same to the graph's tensor when it runs (:func:`set_requires_grad`,
:func:`tensor_data`); ``torch.autograd.grad`` runs with its backward recorded as ops, where
the graph can give eager's gradients; hooks, ``backward()``, ``.grad`` reads of tensors the
trace did not make and reads of an argument's autograd state the trace's stand-in answers
otherwise are refused.

Example::

    >>> with AutogradCalls(watch):
    ...     fn(x)   # each call of the API above goes to its handler with the watch
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, Protocol

import torch
from torch.overrides import TorchFunctionMode

from fxviews.passes.torch_internals import (
    functorch_transforms_active,
    tensor_hooks,
    tensor_is_view,
)

__all__ = ["HOOK", "AutogradCalls", "Watch", "set_requires_grad", "tensor_data"]


class Watch(Protocol):
    """What the handlers ask of the trace's watch: an
    :class:`~fxviews.autograd_structure.AutogradWatch`."""

    arguments: set[int]  # ids of the tensors fn is called with
    argument_nodes: set[Any]  # their autograd nodes, where they have one

    def refuse(self, construct: str, why: str) -> NoReturn: ...

    def note(self, what: str) -> None: ...

    def made_by_trace(self, tensor: torch.Tensor) -> bool: ...

    def keep_data_read(self, tensor: torch.Tensor, read: Callable[[torch.Tensor], Any]) -> Any: ...

    def keep_tensor_call(
        self, target: Callable[..., Any], tensor: torch.Tensor, *args: Any
    ) -> None: ...

    def deeper(self, counter: str) -> contextlib.AbstractContextManager[None]: ...


def set_requires_grad(tensor: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    """``tensor.requires_grad_(requires_grad)``: a node doing what ``fn`` did to that tensor.

    Example::

        >>> set_requires_grad(torch.zeros(2)).requires_grad
        True
    """
    return tensor.requires_grad_(requires_grad)


def tensor_data(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor.data``: a node reading it from the graph's tensor when the graph runs.

    No aten op is ``.data``: it shares ``tensor``'s memory with a version counter of its own
    and no autograd history, where ``detach`` (make_fx's record of it) and ``alias`` share the
    version counter, so a write through the graph's would fail the backward of an op that
    saved ``tensor``, and eager's does not. Under the caller's ``vmap`` it raises as eager's.

    Example::

        >>> w = torch.ones(2, requires_grad=True)
        >>> tensor_data(w).mul_(2)._version, w._version, tensor_data(w).requires_grad
        (1, 0, False)
    """
    return tensor.data


_GRAD_SIGNATURE = inspect.signature(torch.autograd.grad)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _backward_nodes(outputs: Sequence[torch.Tensor], stops: Sequence[Any] = ()) -> Iterator[Any]:
    """The autograd nodes a backward pass from ``outputs`` reaches, going no further than the
    nodes in ``stops`` (which are reached)."""
    seen: set[Any] = set()
    pending: list[Any] = [t.grad_fn for t in outputs]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        if node not in stops:
            pending += [next_node for next_node, _ in node.next_functions]


def _hooked_leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors with hooks that a backward pass from ``outputs`` reaches."""
    # An AccumulateGrad node holds its leaf as its variable.
    leaves = (getattr(node, "variable", None) for node in _backward_nodes(outputs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and tensor_hooks(t)]


def _reaches_an_argument(
    watch: Watch, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> bool:
    """Whether the gradients of ``outputs`` with respect to ``inputs`` reach one of ``fn``'s
    arguments that requires grad: the trace's stand-in for it starts a history of its own,
    where eager's gradient goes on into the caller's (the hooks registered on the argument,
    the tensors it was computed from, such as a parameter ``inputs`` names)."""
    stops = [t.grad_fn for t in inputs if t.grad_fn is not None]
    return any(node in watch.argument_nodes for node in _backward_nodes(outputs, stops))


def _autograd_grad(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    if not functorch_transforms_active():  # fn's own call, not a transform's machinery
        bound = _GRAD_SIGNATURE.bind(*args, **kwargs)
        outputs = _as_tuple(bound.arguments["outputs"])
        inputs = _as_tuple(bound.arguments["inputs"])
        for tensor in outputs + inputs:
            if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
                watch.refuse(
                    "torch.autograd.grad",
                    "one of its outputs or inputs does not require grad while traced (fxviews "
                    "traces on arguments that do not, whatever the caller's do)",
                )
        if _hooked_leaves(outputs):
            watch.refuse("torch.autograd.grad", "it reaches a tensor with hooks")
        if _reaches_an_argument(watch, outputs, inputs):
            watch.refuse(
                "torch.autograd.grad",
                "its gradient reaches an argument of fn, and goes on in eager into the caller's "
                "autograd graph (hooks on the argument, the tensors it was computed from), "
                "which the trace's fresh argument does not have",
            )
        watch.note("torch.autograd.grad: its backward pass kept as ops")
    with watch.deeper("backward"):
        return func(*args, **kwargs)


# Kept only where they change the trace's tensor: its requires_grad is the call's (the trace's
# arguments require grad where the call's do), so a no-op here is one there (nn.Parameter's
# `data.detach().requires_grad_(False)`), and is left out as eager's would do nothing.


def _requires_grad_(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    tensor = args[0]
    before = tensor.requires_grad
    try:
        out = func(*args, **kwargs)
    except RuntimeError:
        if functorch_transforms_active():  # refused for good: no later call can trace it
            watch.refuse("Tensor.requires_grad_", "torch.func transforms refuse it (as eager's "
                         "do; transform's functionalize=True is one)")  # fmt: skip
        raise
    if tensor.requires_grad != before:
        watch.keep_tensor_call(set_requires_grad, tensor, tensor.requires_grad)
    return out


def _detach_(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    # Kept on every argument too: its sample is never a view, where the call's may be, and
    # eager refuses to detach a view in place; the node refuses it on each call's tensor.
    kept = args[0].requires_grad or id(args[0]) in watch.arguments
    out = func(*args, **kwargs)
    if kept:
        watch.keep_tensor_call(torch.ops.aten.detach_.default, args[0])
    return out


def _detach(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    with watch.deeper("user_detach"):
        return func(*args, **kwargs)


def _data_read(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    return watch.keep_data_read(args[0], func)


def _made_requiring_grad(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    """A factory given ``requires_grad=True`` (``torch.zeros``, ``torch.tensor``,
    ``x.new_ones``): PyTorch sets it on the result after the op, as ``requires_grad_`` would,
    so it is kept as that is: the graph's result is the leaf requiring grad eager's is."""
    out = func(*args, **kwargs)
    if isinstance(out, torch.Tensor) and out.requires_grad and out.is_leaf:
        watch.keep_tensor_call(set_requires_grad, out, True)
    return out


def _grad_read(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
    # Of a tensor the trace made, .grad is None in eager and when the graph runs (backward,
    # retain_grad and the setter are refused); of any other, it is autograd's state between
    # calls (zero_grad sets it to None, backward makes a new one), which a graph would bake in.
    if not watch.made_by_trace(args[0]):
        watch.refuse("reading Tensor.grad of a tensor fn did not make", _GRAD_READ)
    return func(*args, **kwargs)


def _argument_read(name: str, history: bool) -> Callable[..., Any]:
    """The handler of a read of ``name`` that refuses it on one of ``fn``'s arguments where the
    trace's could answer otherwise than the call's: for autograd ``history`` (``is_leaf``,
    ``grad_fn``, ``retains_grad``) where it requires grad (the trace's is then a non-leaf copy;
    one that does not is a leaf in both); for the others (``is_inference()``, ``_is_view()``,
    ``_base``) always, as the signature does not hold them."""

    def read(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
        tensor = args[0]
        if id(tensor) in watch.arguments and (tensor.requires_grad or not history):
            watch.refuse(f"reading Tensor.{name} of an argument", _ARGUMENT_READ)
        return func(*args, **kwargs)

    return read


def _refused(construct: str, why: str) -> Callable[..., Any]:
    def refuse(watch: Watch, func: Any, args: Any, kwargs: Any) -> Any:
        watch.refuse(construct, why)

    return refuse


def _setter(name: str) -> Any:
    """What a torch function mode sees for an assignment to the tensor attribute ``name``."""
    return getattr(torch.Tensor, name).__set__


def _getter(name: str) -> Any:
    """What a torch function mode sees for a read of the tensor attribute ``name``."""
    return getattr(torch.Tensor, name).__get__


HOOK = "hooks are Python functions of one call, which a graph cannot keep"
_BACKWARD = "it accumulates gradients into .grad, which a graph cannot keep"
_GRAD_READ = (
    "autograd replaces .grad between calls (zero_grad sets it to None, backward makes a new "
    "one), where a graph would keep reading this call's"
)
_ARGUMENT_READ = (
    "the trace runs fn on a fresh tensor in its place, whose answer the call's may not share "
    "(only requires_grad is part of the signature)"
)

#: Step 3's handlers, by the function a torch function mode sees.
_HANDLERS: dict[Any, Callable[..., Any]] = {
    torch.autograd.grad: _autograd_grad,
    torch.Tensor.requires_grad_: _requires_grad_,
    _setter("requires_grad"): _requires_grad_,
    torch.Tensor.detach_: _detach_,
    torch.Tensor.detach: _detach,
    torch.detach: _detach,
    torch.Tensor.backward: _refused("Tensor.backward()", _BACKWARD),
    torch.autograd.backward: _refused("torch.autograd.backward", _BACKWARD),
    torch.Tensor.register_hook: _refused("Tensor.register_hook", HOOK),
    torch.Tensor.register_post_accumulate_grad_hook: _refused(
        "Tensor.register_post_accumulate_grad_hook", HOOK
    ),
    torch.Tensor.retain_grad: _refused("Tensor.retain_grad", HOOK),
    _setter("grad"): _refused("setting Tensor.grad", "a graph cannot keep an assignment to .grad"),
    _getter("grad"): _grad_read,
    _getter("is_leaf"): _argument_read("is_leaf", history=True),
    _getter("grad_fn"): _argument_read("grad_fn", history=True),
    _getter("retains_grad"): _argument_read("retains_grad", history=True),
    torch.Tensor.is_inference: _argument_read("is_inference()", history=False),
    tensor_is_view: _argument_read("_is_view()", history=False),
    _getter("_base"): _argument_read("_base", history=False),
    _getter("data"): _data_read,
    _setter("data"): _refused(
        "setting Tensor.data", "it swaps a tensor's memory behind autograd, out of any graph"
    ),
}


class AutogradCalls(TorchFunctionMode):
    """Above autograd, at every torch function: step 3."""

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is None:
            if not kwargs.get("requires_grad"):
                return func(*args, **kwargs)
            handler = _made_requiring_grad
        return handler(self.watch, func, args, kwargs)
