"""Overlapping windows (``unfold``) written in core ATen ops, which have no view that makes them.

Note [Windows in core ATen]
---------------------------
``unfold(x, dim, size, step)`` is the one view a synthesized chain needs that core ATen lacks:
it gives ``count = (n - size) // step + 1`` windows of ``size`` elements, ``step`` apart, along
``dim`` (of size ``n``), as a new last dim. Without it no view makes overlapping windows, so
:class:`WindowsByCopies` copies them, with ops edge compilers delegate:

1. blocks: with ``block = gcd(size, step)``, every window is ``size // block`` whole blocks and
   starts at a block boundary. ``slice`` the dim to the ``span = (count - 1) * step + size``
   elements the windows cover and ``view`` it as ``(span // block, block)``: both views.
2. the ``k``-th block of every window: ``slice`` the blocks dim from ``k``, ``step // block``
   apart, ``count`` of them; ``cat`` those pieces along the block dim: ``(count, size)``.
3. ``permute`` the window dim last, where ``unfold`` puts it.

Longformer's chunks (windows of ``2w`` with step ``w``) are two pieces. When there would be
more than :data:`MAX_PIECES` (``gcd`` 1 and long windows), one ``index_select`` reads all
windows at indices ``start + offset`` built in the graph with ``arange``, then ``view`` and
``permute`` shape them. Both forms are verified like every copied chain: run on a tensor that
holds each element's address, they must return the as_strided's addresses
(``chain_verification.verify_chain_reads``).

Example::

    >>> step = WindowsByCopies(aten.unfold.default, (0, 4, 2), input_sizes=(8,))
    >>> step.apply(torch.arange(8), eager).tolist()
    [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..graph_edits import describe_call
from .chain import Evaluator, ViewStep

aten = torch.ops.aten

#: Above this many pieces (slices joined by one ``cat``), windows are gathered instead.
MAX_PIECES = 16


@dataclass(frozen=True)
class WindowsByCopies(ViewStep):
    """``unfold(x, *args)`` (``op``, ``args``) computed by copies in core ATen ops.

    ``input_sizes`` are the static sizes of the tensor it applies to; ``args`` hold a
    non-negative dim; ``then`` is a ``permute`` order applied to the windows (a chain's next
    step, folded into the one the windows need). Not a view: only chains verified by their
    reads may hold it.
    """

    input_sizes: tuple[int, ...] = ()
    then: tuple[int, ...] | None = None

    @property
    def count(self) -> int:
        dim, size, step = self.args
        return (self.input_sizes[dim] - size) // step + 1

    def apply(self, x: Any, ev: Evaluator) -> Any:
        dim, size, step = self.args
        block = math.gcd(size, step)
        if size // block > MAX_PIECES:
            windows = self._gathered(x, ev)
        else:
            windows = self._by_blocks(x, ev, block)
        ndim = len(self.input_sizes) + 1
        order = [d for d in range(ndim) if d != dim + 1] + [dim + 1]  # the window dim last
        if self.then is not None:
            order = [order[d] for d in self.then]
        if order == list(range(ndim)):
            return windows
        return ev(aten.permute.default, windows, order)

    def describe(self, input_text: str) -> str:
        return self.apply(input_text, _describe)

    def _by_blocks(self, x: Any, ev: Evaluator, block: int) -> Any:
        """``(..., count, size, ...)``: the windows' blocks sliced out and joined."""
        dim, size, step = self.args
        sizes = list(self.input_sizes)
        span = (self.count - 1) * step + size
        if span != sizes[dim]:
            x = ev(aten.slice.Tensor, x, dim, 0, span)
        blocks = ev(aten.view.default, x, [*sizes[:dim], span // block, block, *sizes[dim + 1 :]])
        hop = step // block
        pieces = [
            ev(aten.slice.Tensor, blocks, dim, k, k + (self.count - 1) * hop + 1, hop)
            for k in range(size // block)
        ]
        return pieces[0] if len(pieces) == 1 else ev(aten.cat.default, pieces, dim + 1)

    def _gathered(self, x: Any, ev: Evaluator) -> Any:
        """``(..., count, size, ...)``: one ``index_select`` at every window's indices."""
        dim, size, step = self.args
        sizes = list(self.input_sizes)
        where = {"dtype": torch.int64, "device": _device(x)}
        starts = ev(aten.arange.start_step, 0, self.count * step, step, **where)
        offsets = ev(aten.arange.start_step, 0, size, 1, **where)
        indices = ev(aten.add.Tensor, ev(aten.unsqueeze.default, starts, 1), offsets)
        flat = ev(aten.view.default, indices, [self.count * size])
        picked = ev(aten.index_select.default, x, dim, flat)
        return ev(aten.view.default, picked, [*sizes[:dim], self.count, size, *sizes[dim + 1 :]])


def _device(x: Any) -> Any:
    """The device of a tensor, of a graph node's value, or None for a description."""
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    return x.device if isinstance(x, torch.Tensor) else None


def _describe(op: Any, *args: Any, **kwargs: Any) -> str:
    """An evaluator that writes each call out; long lists of pieces show their ends only."""
    words = [_pieces_word(a) if _all_text(a) else a for a in args]
    return describe_call(op, words, {k: v for k, v in kwargs.items() if v is not None})


def _all_text(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _pieces_word(pieces: list[Any]) -> str:
    shown = pieces if len(pieces) <= 3 else [pieces[0], "...", pieces[-1]]
    return f"[{', '.join(str(p) for p in shown)}]"
