"""The guard every trace runs under: what tracing writes outside its own tensors is undone, and
what a graph must not bake in is refused.

Tracing executes the function: a recording runs every op for real, and make_fx runs ops on real
tensors even in fake mode when all their inputs are real constants. :class:`TraceGuard` is a
dispatch mode entered inside the trace (:func:`traced_under_guard`) that snapshots each foreign
storage an op may write before the op runs, and puts the bytes back when the trace ends, so a
call's state changes happen once, when the graph runs (Note [The state a graph bakes in] in
``fxviews/state/guard.py``). It also stops at ops a graph cannot capture for every value, and notes
the user's source line on the as_strided nodes make_fx makes.

Example::

    >>> guard = TraceGuard([x])
    >>> gm = traced_under_guard(lambda f: make_fx(f)(x), fn, guard)   # fn's writes undone
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fxviews.passes.analysis.aliasing import written_slots
from fxviews.passes.analysis.as_strided_calls import refuse_negative_request
from fxviews.passes.compat.torch_internals import (
    FakeTensor,
    OpOverload,
    TorchDispatchMode,
    disable_current_modes,
    efficient_zero_tensor,
    get_proxy_mode,
    get_proxy_slot,
    has_storage,
    is_zerotensor,
)
from fxviews.passes.random_state import RandomDraws
from fxviews.passes.source_lines import NOTED_OPS, note_user_frames
from fxviews.tracing.recording import below_torch_functions, reads_values_into_shape
from fxviews.tracing.tensor_indices import TensorIndexGathers, refuse_observable_gathers

__all__ = ["ConstantRead", "DataDependentOp", "TraceGuard", "traced_under_guard"]


class DataDependentOp(RuntimeError):
    """A real-mode trace met an op whose result depends on tensor values (``func``)."""

    def __init__(self, func: Any) -> None:
        super().__init__(f"it calls {func}, whose result depends on tensor values")
        self.func = func


class ConstantRead(RuntimeError):
    """A fake-mode trace read the value of a real tensor the function closes over (``.item()``
    of a buffer, as BatchNorm with ``momentum=None`` does of ``num_batches_tracked``)."""


def traced_under_guard(
    tracer: Callable[[Callable[..., Any]], torch.fx.GraphModule],
    call: Callable[..., Any],
    guard: TraceGuard,
) -> torch.fx.GraphModule:
    """``tracer`` applied to ``call`` run with ``guard`` active inside the trace; foreign
    writes undone in any case.

    Example::

        >>> traced_under_guard(lambda f: make_fx(f)(x), fn, TraceGuard([x]))
    """

    # wraps: make_fx names the graph's inputs after the innermost wrapped function's parameters.
    @functools.wraps(call)
    def guarded(*inputs: Any) -> Any:
        # A 0-d tensor index is the gather eager vmap runs (Note [A 0-d integer tensor as an
        # index]), checked once the graph is whole.
        with guard, TensorIndexGathers(), guard.random_draws():
            return call(*inputs)

    try:
        gm = tracer(guarded)
    finally:
        guard.restore_foreign_writes()
    refuse_observable_gathers(gm)
    return gm


class TraceGuard(TorchDispatchMode):
    """Runs inside a trace: undoes writes to foreign tensors, refuses data-dependent ops.

    Tracing executes ``fn``: a recording runs every op for real, and make_fx runs ops on real
    tensors even in fake mode when all their inputs are real constants (a closed-over buffer, a
    KV cache). Such writes would happen once at trace time and again whenever the graph runs
    (BatchNorm's running statistics updated twice by a first call), so the first time an op
    may write a storage the trace did not create, the guard snapshots it, and
    :meth:`restore_foreign_writes` puts the bytes back. Which arguments an op may write is read
    from its schema (every argument annotated ``Tensor(a!)``, not only ``self`` and ``out``),
    and, where schemas are silent, assumed of every tensor that does not require grad:
    ``native_batch_norm`` updates ``running_mean`` and ``running_var``, which its schema does
    not annotate, and a kernel cannot write a tensor that requires grad behind autograd's back
    without breaking it. Snapshots cost one copy of the buffers and plain tensors ``fn``
    closes over, once per trace. In a real-mode trace, ``refuse_data_dependent`` also stops at
    every op whose result depends on tensor values (a real trace would bake the example's). In
    fake mode, ``refuse_constant_reads`` stops at such an op run on real tensors alone (fake
    mode runs it for real, on the closed-over tensors' values of this call, and the graph would
    keep that number while eager reads the tensor afresh each call).

    ``dense_zero_tangents`` (fake mode) makes forward AD's zero tangents ordinary zeros, see
    Note [Zero tangents in fake mode]. Given ``generators`` (those ``fn`` may draw from besides
    the default ones), the guard refuses random state a graph would not replay: set from
    Python, or drawn from a generator ``fn`` makes (Note [Random state set from Python]).
    """

    def __init__(
        self,
        inputs: Sequence[Any],
        *,
        refuse_data_dependent: bool = False,
        refuse_constant_reads: bool = False,
        dense_zero_tangents: bool = False,
        generators: Sequence[torch.Generator] | None = None,
    ) -> None:
        super().__init__()
        self._draws = None if generators is None else RandomDraws(generators, inputs)
        self._refuse_data_dependent = refuse_data_dependent
        self._refuse_constant_reads = refuse_constant_reads
        self._dense_zero_tangents = dense_zero_tangents
        self._owned: set[int] = set()
        self._own(inputs)
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        # In-place metadata changes (t_, squeeze_, as_strided_) of foreign tensors, by tensor.
        self._layouts: dict[
            int, tuple[torch.Tensor, torch.Size, tuple[int, ...], int | torch.SymInt]
        ] = {}

    @below_torch_functions
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        refusing = self._refuse_data_dependent or self._refuse_constant_reads
        if refusing and reads_values_into_shape(func, args):
            if self._refuse_data_dependent:
                raise DataDependentOp(func)
            if not any(isinstance(t, FakeTensor) for t in _tensor_arguments(args)):
                raise ConstantRead(f"it reads the value of a tensor it closes over ({func})")
        refuse_negative_request(func, args, kwargs)  # as eager does, not as fake mode fails
        if self._dense_zero_tangents and func is efficient_zero_tensor:
            func = torch.ops.aten.zeros.default  # the same schema: size, dtype, layout, device
        for written in _tensors_it_may_write(func, args, kwargs):
            self._snapshot_if_foreign(written)
        draws = self._draws
        drawn_from = draws.before(func, args, kwargs) if draws is not None else None
        out = func(*args, **kwargs)
        if draws is not None:
            draws.after(drawn_from)
        self._own(out)
        if func in NOTED_OPS and isinstance(out, torch.Tensor):
            _note_source_line(out)
        return out

    def random_draws(self) -> contextlib.AbstractContextManager[Any]:
        """The watch of the random state over ``fn``'s run (nothing without ``generators``)."""
        return self._draws or contextlib.nullcontext()

    def _own(self, values: Any) -> None:
        for tensor in _tensor_arguments([values]):
            key = _storage_key(tensor)
            if key is not None:
                self._owned.add(key)

    def _snapshot_if_foreign(self, tensor: torch.Tensor) -> None:
        key = _storage_key(tensor)
        if key is None or key in self._owned:
            return
        layout = (tensor, tensor.shape, tensor.stride(), tensor.storage_offset())
        self._layouts.setdefault(id(tensor), layout)
        if key not in self._saved:
            storage = tensor.untyped_storage()
            with disable_current_modes(), torch.no_grad():
                self._saved[key] = (storage, storage.clone())

    def restore_foreign_writes(self) -> None:
        with disable_current_modes(), torch.no_grad():
            for tensor, shape, stride, offset in self._layouts.values():
                if (tensor.shape, tensor.stride(), tensor.storage_offset()) != (
                    shape,
                    stride,
                    offset,
                ):
                    tensor.as_strided_(shape, stride, offset)
            for storage, saved in self._saved.values():
                storage.copy_(saved)
        self._saved.clear()
        self._layouts.clear()


def _note_source_line(result: torch.Tensor) -> None:
    """Record the user's stack on the node make_fx made for ``result`` (make_fx records none
    unless asked, and then only frames named ``forward``): messages about kept as_strided
    nodes name the user's line."""
    mode = get_proxy_mode()
    traced = get_proxy_slot(result, mode.tracer, None) if mode is not None else None
    if traced is not None:
        note_user_frames(traced.proxy.node)


def _storage_key(value: Any) -> int | None:
    """The address of ``value``'s memory; None for non-tensors and storage-less tensors."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    if isinstance(value, FakeTensor) or value.device.type == "meta":
        return None  # no memory a trace could write for real
    # Efficient zero tensors (forward AD's zero tangents) carry a storage without memory.
    if is_zerotensor(value) or not has_storage(value):
        return None
    return value.untyped_storage().data_ptr()


def _tensors_it_may_write(
    func: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The tensors ``func`` may write to: its schema's written arguments, and every argument
    that does not require grad, which a kernel may write without saying so (see TraceGuard)."""
    unannotated = [
        tensor
        for tensor in _tensor_arguments((*args, *kwargs.values()))
        if not tensor.requires_grad
    ]
    return _written_tensors(func, args, kwargs) + unannotated


def _tensor_arguments(values: Sequence[Any]) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments (lists and tuples nest in aten schemas), without
    pytree's cost: the guard runs it on every op of a trace."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensor_arguments(value)


def _written_tensors(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes to, by its schema's alias annotations."""
    if not isinstance(func, OpOverload):
        return []
    written: list[torch.Tensor] = []
    for position, name in written_slots(func):
        if name in kwargs:
            written += _tensor_arguments([kwargs[name]])
        elif position < len(args):  # else left to its default
            written += _tensor_arguments([args[position]])
    return written
