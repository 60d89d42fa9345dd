"""Opsets: the ops a consumer of the rewritten graph accepts, and chains written in them.

Note [Chains for an opset]
--------------------------
A chain is found and verified as views (``synthesis``, ``provenance``). A consumer may accept
fewer ops than ATen: edge compilers (ExecuTorch's ``to_edge``) verify core ATen
(``torch.Tag.core``), which has no ``unfold``, ``transpose``, ``narrow``, ... The chain is then
written step by step in the target's ops:

- a permutation (``t``, ``transpose``, ``swapdims``, ``movedim``) becomes ``permute``, and
  ``detach`` becomes ``alias``: both are views in every opset, for any sizes;
- with static sizes, ``narrow`` becomes ``slice``, and ``unfold`` becomes copied windows
  (:mod:`.copied_windows`), the one step without a view form. Where a view the edge backends
  do not lower has a form they do (XNNPACK lowers ``slice`` with step 1, ``view``, ``permute``
  and ``cat``, not ``select``, ``squeeze``, most ``unsqueeze`` calls or strided ``slice``), that
  form is written: ``select`` is a ``slice`` of one and a ``view``, ``squeeze``/``unsqueeze``
  are each a ``view``, and a strided ``slice`` is a ``slice`` viewed as rows of its step, column 0;
- runs of ``view`` and of ``permute`` become one step each, and a ``permute`` after copied
  windows joins the one they end with;
- any other step the target lacks (a ``split`` and its ``getitem``) leaves the chain unwritten:
  the pass tries its next candidate, synthesis, whose chains use core views only, but for
  ``unfold``.

A rewritten chain is verified again: as views (``verify_chain``) if it holds only views, else
by what it reads (``verify_chain_reads``). Copies are emitted only in graphs that write no
tensor in place (export's functional programs), where no node can tell a copy from a view, and
only where no later as_strided reads the memory (it would read the copy with the view's
strides). A caller who writes to an input after the call would see an output copied from it
stay as it was: edge programs, which copy every view, promise no such aliasing either.

Example::

    >>> chain = chain_in_opset((ViewStep(aten.t.default, ()),), Geometry((2, 3), (3, 1), 0),
    ...                        Opset.CORE_ATEN, static=True)
    >>> describe_chain(chain, "x")
    'permute(x, [1, 0])'
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable
from typing import Any

import torch

from ..compat.torch_internals import OpOverload
from ..geometry.concrete import Geometry
from ..op_tables import DIM_REORDERINGS
from .chain import ViewChain, ViewStep, eager
from .copied_windows import WindowsByCopies
from .verification import verify_chain_reads

aten = torch.ops.aten


class Opset(str, enum.Enum):
    """The ops a rewritten graph may hold: all of ATen, or core ATen (edge compilers)."""

    ATEN = "aten"
    CORE_ATEN = "core_aten"

    def has(self, op: Callable[..., Any]) -> bool:
        """Whether ``op`` is in this opset (``getitem`` picks a result: in every one)."""
        if self is Opset.ATEN or op is operator.getitem:
            return True
        return isinstance(op, OpOverload) and torch.Tag.core in op.tags


def as_opset(value: Opset | str) -> Opset:
    """``value`` as an :class:`Opset`; a ValueError names the choices.

    Example::

        >>> as_opset("core_aten")
        <Opset.CORE_ATEN: 'core_aten'>
    """
    try:
        return Opset(value)
    except ValueError:
        choices = ", ".join(repr(o.value) for o in Opset)
        raise ValueError(f"opset must be one of {choices}, got {value!r}") from None


def chain_for_opset(
    chain: ViewChain,
    source: Geometry,
    target: Geometry,
    opset: Opset,
    static: bool,
    verifies: Callable[[ViewChain], bool],
    copy_refusal: Callable[[], str | None],
) -> tuple[ViewChain | None, str]:
    """A verified view ``chain`` from ``source`` to ``target`` written in ``opset`` and
    verified again; or None and why not.

    ``verifies`` verifies a chain of views (for every size if the call is symbolic);
    ``copy_refusal`` says why copies may not stand in for the node's view (None: they may).

    Example::

        >>> chain_for_opset(chain, source, target, Opset.CORE_ATEN, True, verifies, lambda: None)
        ((WindowsByCopies(...),), '')
    """
    written = chain_in_opset(chain, source, opset, static)
    if written is None:
        if not static and any(step.op is aten.unfold.default for step in chain):
            return None, "its windows are copied for static sizes only"
        return None, "a step has no form in it for every size"
    if written == chain:
        return written, ""
    if not any(isinstance(step, WindowsByCopies) for step in written):
        return (written, "") if verifies(written) else (None, "its form there does not verify")
    refusal = copy_refusal()
    if refusal is not None:
        return None, f"its windows would be copies, and {refusal}"
    if not verify_chain_reads(written, source, target):
        return None, "its copied windows could not be verified (a storage over the limit)"
    return written, ""


def chain_in_opset(
    chain: ViewChain, source: Geometry, opset: Opset, static: bool
) -> ViewChain | None:
    """``chain`` written in ``opset``'s ops (see the Note), or None where it cannot be.

    ``source`` is the input's geometry (at trace-time sizes); ``static`` says the chain serves
    those sizes only, so steps may be rewritten with them.
    """
    if opset is Opset.ATEN:
        return chain
    value = source.meta_tensor()
    written: list[ViewStep] = []
    for step in chain:
        steps = _core_steps(step, value, static)
        if steps is None:
            return None
        written.extend(steps)
        value = step.apply(value, eager)
    return _merged(written)


def _core_steps(step: ViewStep, value: torch.Tensor, static: bool) -> list[ViewStep] | None:
    """Core-ATen steps doing what ``step`` does to ``value``, delegable ones first; or None."""
    op, args = step.op, step.args
    if op in DIM_REORDERINGS:
        return [ViewStep(aten.permute.default, (_permutation(step, value.ndim),))]
    if op is aten.detach.default:
        return [ViewStep(aten.alias.default, ())]
    if not static:
        return [step] if Opset.CORE_ATEN.has(op) else None
    out = step.apply(value, eager)
    if op is aten.select.int:
        dim, index = args[0] % value.ndim, args[1] % value.shape[args[0]]
        return [ViewStep(aten.slice.Tensor, (dim, index, index + 1)), _view_to(out)]
    if op in _DIM_RENAMES:
        return [_view_to(out)]
    if op is aten.narrow.default:
        dim, start, length = args
        start = start + value.shape[dim] if start < 0 else start
        return [ViewStep(aten.slice.Tensor, (dim, start, start + length))]
    if op is aten.slice.Tensor:
        return _unit_step_slice(step, value, out)
    if op is aten.unfold.default:
        dim, size, stride = args
        return [WindowsByCopies(op, (dim % value.ndim, size, stride), tuple(value.shape))]
    return [step] if Opset.CORE_ATEN.has(op) else None


#: Views that only add or drop size-1 dims: a ``view`` to their result's sizes, which edge
#: backends lower (XNNPACK has no ``select``/``squeeze``, and ``unsqueeze`` of the last dim only).
_DIM_RENAMES = frozenset(
    {
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.unsqueeze.default,
    }
)


def _view_to(out: torch.Tensor) -> ViewStep:
    return ViewStep(aten.view.default, (list(out.shape),))


def _unit_step_slice(step: ViewStep, value: torch.Tensor, out: torch.Tensor) -> list[ViewStep]:
    """A slice with step ``k`` > 1 as unit-step slices and views (edge backends lower only
    those): the ``count * k`` elements from its start, viewed as ``(count, k)``, column 0.
    Left as it is when those elements run past the dim's end."""
    dim, *bounds = step.args
    dim %= value.ndim
    hop = bounds[2] if len(bounds) > 2 else 1
    count = out.shape[dim]
    if hop == 1 or count == 0 or value.stride(dim) == 0:
        return [step]
    # The result's offset, in units of the dim's stride, is where it starts.
    start = (out.storage_offset() - value.storage_offset()) // value.stride(dim)
    if start + count * hop > value.shape[dim]:
        return [step]
    rows = [*value.shape[:dim], count, hop, *value.shape[dim + 1 :]]
    return [
        ViewStep(aten.slice.Tensor, (dim, start, start + count * hop)),
        ViewStep(aten.view.default, (rows,)),
        ViewStep(aten.slice.Tensor, (dim + 1, 0, 1)),
        _view_to(out),
    ]


def _merged(steps: list[ViewStep]) -> ViewChain:
    """``steps`` with each run of ``view``s, and of ``permute``s, made one step."""
    merged: list[ViewStep] = []
    for step in steps:
        last = merged[-1] if merged else None
        if isinstance(last, WindowsByCopies) and step.op is aten.permute.default:
            then = (
                tuple(step.args[0])
                if last.then is None
                else tuple(last.then[d] for d in step.args[0])
            )
            merged[-1] = dataclasses.replace(last, then=then)
        elif last is None or type(last) is not ViewStep or last.op is not step.op:
            merged.append(step)
        elif step.op is aten.view.default:
            merged[-1] = step  # view(view(x, a), b) is view(x, b)
        elif step.op is aten.permute.default:
            first, then = last.args[0], step.args[0]
            merged[-1] = ViewStep(step.op, ([first[d] for d in then],))
        else:
            merged.append(step)
    return tuple(merged)


def _permutation(step: ViewStep, ndim: int) -> list[int]:
    """The dim order a permutation step gives, read off a meta tensor with distinct sizes."""
    sizes = list(range(2, 2 + ndim))
    out = step.apply(torch.empty(sizes, device="meta"), eager)
    return [sizes.index(s) for s in out.shape]
