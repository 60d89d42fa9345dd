"""``fxviews.rewrite``: the engine on a copy of a GraphModule or of an exported program.

The front door only dispatches: a GraphModule goes to :func:`fxviews.graph_rewriting.rewrite_graph`,
an ``ExportedProgram`` to :func:`fxviews.consumers.export.rewrite_exported`, which rewrites the
program's graph the same way and builds a new, validated program around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fxviews.arguments import check_flags
from fxviews.consumers.export import rewrite_exported
from fxviews.graph_rewriting import RewriteResult, RewriteSteps, rewrite_graph
from fxviews.passes import Opset

__all__ = ["rewrite"]


def rewrite(
    gm: torch.fx.GraphModule | torch.export.ExportedProgram,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
    reshape_views: bool | None = None,
    pin_layouts: bool | None = None,
    opset: Opset | str = Opset.ATEN,
    copy_unfolds: bool = False,
) -> RewriteResult:
    """Rewrite every provably safe ``as_strided`` of ``gm`` into view ops, on a copy.

    ``strict=True`` raises :class:`fxviews.UnsafeAsStridedError` for the first as_strided node
    that has to be kept. With ``reshape_views`` (the default), a second recorded step turns
    ``view`` into ``reshape`` wherever no aliasing through it is observable
    (:class:`fxviews.passes.ViewToReshape`), so merged dims do not fail on batched layouts.
    With ``pin_layouts`` (the default), a third gives every node that still depends on its
    input's traced layout that layout at run time (:class:`fxviews.passes.LayoutPinning`).
    ``opset`` is what the graph's consumer accepts: ``"aten"`` (the default: eager, vmap,
    Inductor, ONNX) or ``"core_aten"`` (edge compilers such as ExecuTorch's ``to_edge``): every
    op emitted is then core ATen, preferring the views edge backends lower, overlapping windows
    are copies (only in graphs that write no tensor in place), and the reshape and pinning
    steps, which serve vmap and emit ops outside core ATen, are off (``None``, the default of
    both, means on for ``"aten"`` and off for ``"core_aten"``). ``copy_unfolds=True``, for an
    opset without ``unfold`` (``"core_aten"``), also writes the model's own ``unfold`` nodes as
    copies the same way, each verified by what it reads (:class:`fxviews.passes.UnfoldCopies`;
    records in ``result.unfold_records``), so ``to_edge`` or TVM take a patch embedding.
    Then a clone that a ``copy_`` overwrites before anything reads it becomes a clone of the
    ``copy_``'s source, and the ``copy_`` goes (:class:`fxviews.passes.OverwrittenClones`).
    A graph without tensor metadata (e.g. from ``torch.fx.symbolic_trace``) needs
    ``example_inputs`` to compute it; without them an :class:`fxviews.FxViewsError` says so.
    An ``ExportedProgram`` gives a new, validated one in ``result.exported_program``
    (:mod:`fxviews.consumers.export`).

    Example::

        >>> res = fxviews.rewrite(fxviews.trace(push_jvp, x, y, yt))
        >>> [r.method for r in res.records]
        ['provenance']
    """
    check_flags("fxviews.rewrite", strict=strict, copy_unfolds=copy_unfolds)
    check_flags(
        "fxviews.rewrite", optional=True, reshape_views=reshape_views, pin_layouts=pin_layouts
    )
    steps = RewriteSteps.of(opset, reshape_views, pin_layouts, copy_unfolds)
    if isinstance(gm, torch.export.ExportedProgram):
        return rewrite_exported(gm, strict, example_inputs, steps)
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            "fxviews.rewrite expects a torch.fx.GraphModule or torch.export.ExportedProgram, "
            f"got {type(gm).__name__}"
        )
    return rewrite_graph(gm, strict, example_inputs, steps)
