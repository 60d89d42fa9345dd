"""The ops whose aten form depends on their input's strides, found in PyTorch, and the layouts
the sweep of tests/test_layout_decisions.py runs them on.

Found, not listed: :func:`layout_deciding_ops` runs every OpInfo op whose aten kernel is
CompositeImplicitAutograd (it decomposes above the dispatcher, so a trace sees only what it
decided) on its samples in each layout of :data:`LAYOUTS`, under a dispatch mode that notes the
aten ops it decomposed into and whether its result shares the input's memory. An op whose ops
or aliasing differ between layouts decides by layout; where the aliasing differs the decision
is observable (a write through the result reaches the input on one layout and not on another).
:func:`memory_format_ops` adds the ops whose result's layout follows their input's
(``preserve_format``): the OpInfo ops whose aten schema takes a ``memory_format``.

Example::

    >>> {op.name for op, _ in layout_deciding_ops()} >= {"reshape", "flatten", "contiguous"}
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.passes.compat import torch_internals
from fxviews.passes.compat.torch_internals import TorchDispatchMode, pytree, storage_identity
from tests.reference import TEST_DEVICE, transposed_copy

#: How far into its samples each op is read: the first few cover every branch we measured.
SAMPLES_PER_OP = 4


def _sliced(t: torch.Tensor) -> torch.Tensor:
    """Same values in every other element of the last dim of a bigger buffer (offset 0)."""
    if t.dim() == 0:
        return t.clone()
    buffer = torch.full(
        (*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device
    )
    result = buffer[..., ::2]
    result.copy_(t)
    return result


def _offset(t: torch.Tensor) -> torch.Tensor:
    """Same values, contiguous, at storage offset 3 of a buffer of NaNs."""
    buffer = torch.full((t.numel() + 3,), float("nan"), dtype=t.dtype, device=t.device)
    result = buffer[3:].view(t.shape)
    result.copy_(t)
    return result


def _channels_last(t: torch.Tensor) -> torch.Tensor | None:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else None


#: Layouts with the same values as the contiguous tensor, or None where one does not apply.
LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "contiguous": lambda t: t.clone(),
    "transposed": transposed_copy,
    "sliced": _sliced,
    "offset": _offset,
    "channels_last": _channels_last,
}


@dataclass(frozen=True)
class LayoutOp:
    """One op the sweep runs: its OpInfo name, callable, and one sample's extra arguments."""

    name: str
    op: Callable[..., Any]
    shape: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dtype: torch.dtype
    observable: bool  # its result's aliasing of its input depends on the layout

    @property
    def id(self) -> str:
        fmt = self.kwargs.get("memory_format")
        suffix = "" if fmt is None else f"-{str(fmt).split('.')[-1]}"
        return f"{self.name}-{'x'.join(map(str, self.shape)) or 'scalar'}{suffix}"

    def __call__(self, x: torch.Tensor) -> Any:
        return self.op(x, *self.args, **self.kwargs)


class _Decomposition(TorchDispatchMode):
    """Notes the aten ops a call dispatches below the Python key."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _signature(op: Any, x: torch.Tensor, args: Any, kwargs: Any) -> tuple[Any, ...]:
    """The aten ops ``op(x, ...)`` decomposes into and which results share ``x``'s memory."""
    mode = _Decomposition()
    try:
        with mode:
            out = op(x, *args, **kwargs)
    except Exception as err:  # noqa: BLE001 - an op refusing a layout is a signature too
        return ("raises", type(err).__name__)
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    shares = tuple(
        o.layout == torch.strided and storage_identity(o) == storage_identity(x) for o in outs
    )
    return tuple(mode.ops), shares


def _usable_samples(info: Any, dtype: torch.dtype) -> Iterator[Any]:
    try:
        samples = list(info.sample_inputs(TEST_DEVICE, dtype, requires_grad=False))
    except Exception:  # noqa: BLE001 - an OpInfo without samples for this dtype: none
        return
    kept = 0
    for sample in samples:
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.dim() == 0:
            continue
        if not x.dtype.is_floating_point:
            continue
        yield sample  # other tensor arguments stay as they are: the input's layout varies
        kept += 1
        if kept == SAMPLES_PER_OP:
            return


def _aten_name(info: Any) -> str:
    return info.aten_name or info.name.split(".")[-1]


@functools.cache
def layout_deciding_ops() -> list[tuple[LayoutOp, str]]:
    """Every OpInfo sample of a CompositeImplicitAutograd op that decomposes or aliases
    otherwise on some layout of :data:`LAYOUTS` than on contiguous, with how (a sentence)."""
    found = []
    for info in torch_internals.op_db:
        if not any(map(torch_internals.has_composite_implicit_kernel, _overloads(info))):
            continue
        for sample in _usable_samples(info, torch.float32):
            signatures = {}
            for layout, make in LAYOUTS.items():
                x = make(sample.input)
                if x is not None:
                    signatures[layout] = _signature(info.op, x, sample.args, sample.kwargs)
            if len(set(signatures.values())) == 1:
                continue
            aliasing = {s[1] for s in signatures.values() if s[0] != "raises"}
            op = LayoutOp(
                info.name,
                info.op,
                tuple(sample.input.shape),
                tuple(sample.args),
                dict(sample.kwargs),
                torch.float32,
                observable=len(aliasing) > 1,
            )
            found.append((op, _difference(signatures)))
    return found


def _difference(signatures: dict[str, tuple[Any, ...]]) -> str:
    contiguous = signatures["contiguous"]
    other = next(name for name, s in signatures.items() if s != contiguous)
    return f"contiguous: {contiguous}; {other}: {signatures[other]}"


def _overloads(info: Any) -> list[Any]:
    """The aten overloads of an OpInfo's op (none where aten has no op of its name)."""
    packet = getattr(torch.ops.aten, _aten_name(info), None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return []
    return [getattr(packet, overload) for overload in packet.overloads()]


def _takes_memory_format(info: Any) -> bool:
    return any(
        argument.name == "memory_format"
        for overload in _overloads(info)
        for argument in torch_internals.op_schema(overload).arguments
    )


@functools.cache
def memory_format_ops() -> list[LayoutOp]:
    """The first sample of every OpInfo op whose aten schema takes a ``memory_format`` (its
    result follows the input's layout by default), but random and uninitialized ones, whose
    values no two runs share."""
    found = []
    for info in torch_internals.op_db:
        name = _aten_name(info)
        if not _takes_memory_format(info) or name.endswith("_"):  # in place: resize_
            continue
        if name.startswith(("empty", "new_empty", "rand", "normal", "bernoulli")):
            continue  # values no two calls share
        for sample in list(_usable_samples(info, torch.float32))[:1]:
            for memory_format in _memory_formats(sample.input.dim(), sample.kwargs):
                kwargs = dict(sample.kwargs)
                if memory_format is not None:
                    kwargs["memory_format"] = memory_format
                found.append(
                    LayoutOp(
                        info.name,
                        info.op,
                        tuple(sample.input.shape),
                        tuple(sample.args),
                        kwargs,
                        torch.float32,
                        observable=False,
                    )
                )
    return found


def _memory_formats(dim: int, kwargs: dict[str, Any]) -> list[torch.memory_format | None]:
    """The memory formats to ask of a sample: its own (None), and each other one a tensor of
    its rank takes."""
    formats = [torch.preserve_format, torch.contiguous_format]
    formats += [torch.channels_last] if dim == 4 else []
    return [None, *(f for f in formats if f != kwargs.get("memory_format"))]
