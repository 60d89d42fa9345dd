"""Programs made of PyTorch's OpInfo database: each op on its own float32 CPU samples, as a
function of the sample's tensors, with several samples of one structure to batch.

An OpInfo sample is an input, positional arguments and keyword arguments, tensors among them
anywhere (``torch.cat``'s input is a list of tensors, ``weight=`` a keyword). :func:`programs`
makes each sample a :class:`Program`: ``fn(*tensors)`` calls the op with the sample's other
values fixed, and ``samples`` holds :data:`BATCH` argument tuples of the same structure (the
same shapes, dtypes and other values), drawn from the op's own sample function, so each keeps
the op's domain (positive inputs of ``log``, valid indices of ``gather``, well-conditioned
matrices of ``linalg.solve``). Where the sample function does not repeat a sample's structure,
its tensors are reused for every sample, each floating one with its elements shuffled (still
its values, so still in the op's domain elementwise).

Ops are named by their OpInfo label (``name.variant``); :func:`op_labels` lists those with a
float32 CPU dtype, and :func:`in_share` (tests.databases) picks a fixed share for ``make test``.

Example::

    >>> [program] = programs(OPS["sin"], limit=1)
    >>> program.fn(*program.samples[0]).shape == program.samples[0][0].shape
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.passes.compat.torch_internals import op_db, pytree
from tests.reference import Sample, assert_tree_close, stable_seed, without_values

__all__ = [
    "BATCH",
    "DTYPE",
    "OPS",
    "UNDEFINED_VALUES",
    "Outcome",
    "Program",
    "op_labels",
    "programs",
]

DTYPE = torch.float32
#: How many samples a program holds: the batch of its vmap checks.
BATCH = 3


def _label(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


#: The ops whose results' values are undefined (the memory's): only their kinds compare.
UNDEFINED_VALUES = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)
#: Every OpInfo entry with a float32 CPU dtype, by label.
OPS: dict[str, Any] = {_label(op): op for op in op_db if op.supports_dtype(DTYPE, "cpu")}


def op_labels() -> list[str]:
    """The labels of :data:`OPS`, sorted."""
    return sorted(OPS)


@dataclass(frozen=True)
class Program:
    """One OpInfo sample as a function of its tensors, and samples of its arguments."""

    label: str
    fn: Callable[..., Any]
    samples: list[Sample]
    #: Whether the samples were drawn by the op's sample function (False: one drawn, its
    #: floating tensors shuffled for the others).
    drawn: bool
    #: Whether its results' values are defined (not an op of :data:`UNDEFINED_VALUES`).
    values_defined: bool = True

    def floating(self) -> tuple[bool, ...]:
        """Which arguments are floating point (those ``jvp`` gives a tangent)."""
        return tuple(t.is_floating_point() for t in self.samples[0])


@dataclass(frozen=True)
class Outcome:
    """What a call gave: its value, or the error it raised (its type and first line). Each
    call starts from the same point of the random stream (random ops compare too)."""

    value: Any = None
    error: str | None = None

    @classmethod
    def of(cls, call: Callable[[], Any]) -> Outcome:
        torch.manual_seed(0)
        try:
            return cls(value=call())
        except Exception as err:  # noqa: BLE001 - any error PyTorch raises is an outcome
            return cls(error=f"{type(err).__name__}: {str(err).strip().splitlines()[0]}")

    def matches(self, other: Outcome, values: bool = True, **tolerance: float) -> bool:
        """Whether both gave values, equal up to ``tolerance`` (``assert_close``'s keywords;
        NaN where NaN); with ``values=False``, of the same structure, shapes and dtypes (an
        ``empty`` tensor's values are whatever its memory held)."""
        if self.error is not None or other.error is not None:
            return False
        mine, theirs = self.value, other.value
        if not values:
            mine, theirs = without_values(mine), without_values(theirs)
        try:
            assert_tree_close(mine, theirs, equal_nan=True, **tolerance)  # type: ignore[arg-type]
        except (AssertionError, TypeError, ValueError, RuntimeError):
            return False
        return True

    def describe(self) -> str:
        return self.error if self.error is not None else "other numbers"


def programs(op: Any, limit: int) -> list[Program]:
    """Up to ``limit`` programs of ``op``: its first float32 CPU samples whose tensors are all
    strided, each with :data:`BATCH` samples (see the Note at the top)."""
    label = _label(op)
    torch.manual_seed(stable_seed(label))  # the sample functions draw from the global stream
    draws = [_strided_samples(op) for _ in range(BATCH)]
    made = []
    for index, first in enumerate(itertools.islice(draws[0], limit)):
        spec, template, tensors = _split(first)
        others = [_split(s) for s in (next(d, None) for d in draws[1:]) if s is not None]
        drawn = len(others) == BATCH - 1 and all(
            _same_structure(o, (spec, template, tensors)) for o in others
        )
        samples = [tensors, *(o[2] for o in others)] if drawn else _shuffled(tensors)
        name = f"{label}-s{index}"
        fn = _call(op.op, spec, template, name)
        made.append(Program(name, fn, samples, drawn, label not in UNDEFINED_VALUES))
    return made


def _strided_samples(op: Any) -> Any:
    """The op's float32 CPU samples whose tensors are all strided (no sparse layouts)."""
    for sample in op.sample_inputs("cpu", DTYPE):
        leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
        if all(t.layout == torch.strided for t in leaves if isinstance(t, torch.Tensor)):
            yield sample


Split = tuple[Any, list[Any], Sample]
#: Where a sample's template holds one of its tensors.
_TENSOR = object()


def _split(sample: Any) -> Split:
    """A sample's structure, its other values (:data:`_TENSOR` where a tensor goes), and its
    tensors."""
    leaves, spec = pytree.tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
    tensors = tuple(leaf.detach() for leaf in leaves if isinstance(leaf, torch.Tensor))
    template = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return spec, template, tensors


def _same_structure(a: Split, b: Split) -> bool:
    """Whether two samples differ in their tensors' values alone."""
    if a[0] != b[0] or len(a[2]) != len(b[2]):
        return False
    if any((x.shape, x.dtype) != (y.shape, y.dtype) for x, y in zip(a[2], b[2], strict=True)):
        return False
    try:
        return bool(a[1] == b[1])
    except Exception:  # noqa: BLE001 - a value whose == raises or is not a bool: not the same
        return False


def _shuffled(tensors: Sample) -> list[Sample]:
    """:data:`BATCH` samples of ``tensors``: itself, then its floating tensors' elements in
    other orders (a fixed generator, so every run draws the same)."""
    generator = torch.Generator().manual_seed(0)

    def shuffle(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.numel() < 2:
            return t.clone()
        order = torch.randperm(t.numel(), generator=generator)
        return t.reshape(-1)[order].reshape(t.shape)

    return [tensors, *(tuple(shuffle(t) for t in tensors) for _ in range(BATCH - 1))]


def _call(op: Callable[..., Any], spec: Any, template: list[Any], label: str) -> Callable[..., Any]:
    """``fn(*tensors)``: ``op`` called with the sample's other values and these tensors,
    named after the sample (messages and tracebacks say which)."""
    positions = [i for i, leaf in enumerate(template) if leaf is _TENSOR]

    def fn(*tensors: torch.Tensor) -> Any:
        leaves = list(template)
        for position, tensor in zip(positions, tensors, strict=True):
            leaves[position] = tensor
        first, args, kwargs = pytree.tree_unflatten(leaves, spec)
        return op(first, *args, **kwargs)

    fn.__name__ = fn.__qualname__ = label
    return fn
