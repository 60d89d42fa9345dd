"""Record ``linear``, ``matmul`` and ``dropout`` as the one call eager code makes, not as their
decomposition.

Note [Composite calls in a recording]
-------------------------------------
``F.linear`` and ``matmul`` (``@``) are composite ops: ATen decomposes them into ``t``,
``reshape``, ``expand``, ``addmm``, ``bmm``, ``_unsafe_view``, ... before any dispatch mode
sees them, choosing the decomposition by the shapes it is given. A recording on one sample
therefore holds the decomposition of one sample's shapes, and under ``vmap`` every op of it
goes through its own batching rule: ``addmm`` of a one-row matrix costs more than ``vmap``'s
own handling of ``linear`` (a single batched ``mm`` over the batch folded into the rows),
which eager ``vmap(fn)`` gets by calling ``linear`` itself. So, while recording,
:class:`CompositeCalls` records such a call as one node (``aten.linear.default``,
``aten.matmul.default``): the ops of its decomposition run for real, unrecorded (their
memory still the trace's, and still refused where a recording would refuse them), and the
call's result is recorded as made by that node. When the graph runs, the call decomposes as
eager's would, for the shapes (and batch) it meets then.

``F.dropout`` and ``F.alpha_dropout`` are kept whole for the random stream: on a CPU sample
they decompose into ``empty_like`` and an in-place ``bernoulli_``, and under ``vmap`` an
in-place draw fills the batch in its memory order, where eager ``vmap`` (``randomness=
"different"``) runs its own rule for the call and draws the batch in logical order: with the
batch dim anywhere but first in memory the masks would differ from eager's. Kept whole, the
graph's call draws as eager's does, directly and under ``vmap``. Only a training call with a
probability in (0, 1] is kept: otherwise the op returns its input itself, which is no new
memory (below).

Only where the decomposition is all a recording would miss:

* no ``torch.func`` transform is active inside the function (its layers act on the
  decomposition's ops, and their effects are recorded op by op), no forward-AD level
  (tangents are computed op by op below the call), and autocast is off (the casts it inserts
  are recorded op by op: Note [Modes inside fn]);
* the recorder is recording (not inside a call it keeps as one node already, such as a custom
  ``autograd.Function``'s forward);
* every tensor argument is a plain tensor (not a subclass);
* the result shares no memory with the call's arguments (its schema says it is new memory; a
  result that is not would make the graph's alias facts wrong: the recording is refused and
  fake mode traces instead).

A backward run inside the function reads what the decomposition saved: a tensor saved from
the trace's memory is one no recorded op made, which the recorder refuses (fake mode then
traces); one saved from a parameter's memory is read by reference, as every constant is.

Example::

    >>> gm = transform's recording of lambda x: torch.nn.functional.linear(x, w, b)
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
    [aten.linear.default]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
from torch.overrides import TorchFunctionMode

from fxviews.passes.compat.torch_internals import (
    any_autocast_enabled,
    disable_current_modes,
    no_torch_function,
    op_schema,
    peek_interpreter_stack,
    python_dual_level,
    pytree,
)

__all__ = ["CompositeCalls"]

aten = torch.ops.aten

Call = tuple[tuple[Any, ...], dict[str, Any]]


def _as_called(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
    """The arguments of an entry point spelled as its op's (``linear``, ``matmul``)."""
    return args, kwargs


def _as_dropout(
    input: torch.Tensor,  # noqa: A002 - F.dropout's own parameter names, passed by keyword too
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> Call | None:
    """``F.dropout``'s arguments as ``aten.dropout``'s, where the call makes new memory."""
    if inplace or not training or not 0 < p <= 1 or input.numel() == 0:
        return None
    return (input, p, training), {}


#: The Python entry points of the composite calls kept whole: the op each is recorded as, and
#: its arguments spelled as that op's (None where the call is not kept).
_COMPOSITES: dict[Any, tuple[Any, Any]] = {
    F.linear: (aten.linear.default, _as_called),
    torch.matmul: (aten.matmul.default, _as_called),
    torch.Tensor.matmul: (aten.matmul.default, _as_called),
    torch.Tensor.__matmul__: (aten.matmul.default, _as_called),
    F.dropout: (aten.dropout.default, lambda a, k: _as_dropout(*a, **k)),
    F.alpha_dropout: (aten.alpha_dropout.default, lambda a, k: _as_dropout(*a, **k)),
}


class CompositeCalls(TorchFunctionMode):
    """While recording: each call of :data:`_COMPOSITES` that may be kept whole becomes one node
    of ``recorder`` (see the Note)."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self._recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        op, spelled = _COMPOSITES.get(func, (None, None))
        if op is None or not self._recorder.recording:
            return func(*args, **kwargs)
        call = spelled(args, kwargs)
        if call is None or not _keepable(op, *call):
            return func(*args, **kwargs)
        # The recorder's own reads and meta tensors, outside the modes that watch the function.
        with no_torch_function(), disable_current_modes():
            # The arguments' nodes first: a constant seen for the first time gets its node
            # before the decomposition's views of it make its memory the trace's.
            for leaf in pytree.tree_leaves((args, kwargs)):
                self._recorder.node_for(leaf)
        with self._recorder.unrecorded():
            out = func(*args, **kwargs)
        with no_torch_function(), disable_current_modes():
            self._recorder.record_new_result(op, *call, out)
        return out


def _keepable(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if peek_interpreter_stack() is not None or python_dual_level() >= 0:
        return False
    if any_autocast_enabled():
        return False  # its casts are recorded op by op (Note [Modes inside fn], item 1)
    if not set(kwargs) <= {argument.name for argument in op_schema(op).arguments}:
        return False  # spelled otherwise than the op's schema: the node could not be called
    tensors = [
        leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)
    ]
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)
