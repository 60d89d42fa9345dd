"""Verification: a chain is used only once it provably reproduces the target geometry.

Example::

    >>> verify_chain((ViewStep(aten.select.int, (0, 0)),), Geometry((2, 6), (6, 1), 0),
    ...              Geometry((6,), (1,), 0))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..compat.torch_internals import pytree, storage_identity
from ..geometry.concrete import Geometry, equivalent
from ..op_tables import LAYOUT_VIEWS
from .chain import ViewStep, apply_chain

aten = torch.ops.aten


def verify_chain(chain: Sequence[ViewStep], source: Geometry, target: Geometry) -> bool:
    """Whether ``chain`` turns a tensor of geometry ``source`` into one equivalent to ``target``.

    Runs the chain on a meta tensor with the source's exact sizes, strides and offset. Every
    step must be one of :data:`LAYOUT_VIEWS` and the result must share the source's storage: a
    copy with the right geometry would read the right values but miss later writes through the
    view.
    """
    if not all(type(step) is ViewStep and step.op in LAYOUT_VIEWS for step in chain):
        return False  # a step that copies, however its result is laid out, is no view
    start = source.meta_tensor()
    try:
        out = apply_chain(chain, start)
    except (RuntimeError, IndexError):  # what a view op raises on a tensor it does not fit
        return False
    return (
        isinstance(out, torch.Tensor)
        and storage_identity(out) == storage_identity(start)
        and equivalent(Geometry.of(out), target)
    )


#: Largest storage (elements) a copied chain is verified on; larger ones are not emitted.
MAX_VERIFIED_ELEMENTS = 1 << 22

#: Ops that move the elements of the input and do nothing else (``index_select`` at an index
#: that does not derive from the input).
_MOVING = LAYOUT_VIEWS | {aten.cat.default, aten.clone.default, aten.index_select.default}
#: Ops that may build an index tensor, from constants only.
_INDEXING = frozenset(
    {aten.arange.start_step, aten.add.Tensor, aten.unsqueeze.default, aten.view.default}
)


def verify_chain_reads(chain: Sequence[ViewStep], source: Geometry, target: Geometry) -> bool:
    """Whether ``chain``, which may copy, reads exactly ``target``'s elements of ``source``.

    Note [Verifying a chain by its reads]
    -------------------------------------
    A chain with copies (:class:`~.copied_windows.WindowsByCopies`) shares no storage with its
    input, so ``verify_chain`` does not apply. It is run instead on a tensor of the source's
    geometry whose storage holds each element's own address, and must return, index for index,
    the addresses ``target`` reads. Every op it applies to the input or to what derives from
    the input must only move elements (:data:`_MOVING`), at indices built from constants
    (:data:`_INDEXING`): then the result's element at each index is the input's element at the
    address it shows, for any contents, so the chain reads what the as_strided reads. Sizes
    are static; storages over :data:`MAX_VERIFIED_ELEMENTS` are not verified (the node keeps
    its as_strided).

    Example::

        >>> windows = WindowsByCopies(aten.unfold.default, (0, 4, 2), input_sizes=(8,))
        >>> verify_chain_reads((windows,), Geometry((8,), (1,), 0), Geometry((3, 4), (2, 1), 0))
        True
    """
    extent = source.storage_extent()
    if extent > MAX_VERIFIED_ELEMENTS or target.storage_extent() > extent:
        return False  # too large to verify, or the target reads memory the source lacks
    storage = torch.arange(extent)
    start = storage.as_strided(source.sizes, source.strides, source.offset)
    moves = _ElementMoves(start)
    try:
        out = apply_chain(chain, start, moves)
    except (RuntimeError, IndexError, _NotAMove):
        return False
    expected = storage.as_strided(target.sizes, target.strides, target.offset)
    return (
        isinstance(out, torch.Tensor)
        and out.shape == expected.shape
        and bool(torch.equal(out, expected))
    )


class _NotAMove(Exception):
    """An op that could change the input's values, not just move them."""


class _ElementMoves:
    """An evaluator that runs ops and refuses any that is not a pure move of the input."""

    def __init__(self, start: torch.Tensor) -> None:
        self.derived: list[torch.Tensor] = [start]  # kept alive: compared by identity

    def _from_input(self, value: Any) -> bool:
        return any(
            isinstance(v, torch.Tensor) and any(v is d for d in self.derived)
            for v in pytree.tree_leaves(value)
        )

    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        from_input = self._from_input((args, kwargs))
        allowed = _MOVING if from_input else _MOVING | _INDEXING
        if op not in allowed or (op is aten.index_select.default and self._from_input(args[2])):
            raise _NotAMove(op)
        out = op(*args, **kwargs)
        if from_input:
            self.derived.extend(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out
