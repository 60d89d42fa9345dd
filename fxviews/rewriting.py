"""``fxviews.rewrite``: run the engine on a copy of a GraphModule and report what it did."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from fxviews.passes import AsStridedToViews, Record, eliminate_dead_metadata_checks


@dataclass
class RewriteResult:
    """The outcome of :func:`rewrite`.

    ``graph_module`` is a new GraphModule (the input is never mutated); ``records`` holds one
    :class:`~fxviews.passes.Record` per as_strided node seen; ``modified`` says whether the
    graph changed. ``print(result)`` shows the graph-diff printout.
    """

    graph_module: torch.fx.GraphModule
    records: list[Record]
    modified: bool
    code_before: str
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def code_after(self) -> str:
        return self.graph_module.code

    def __str__(self) -> str:
        from fxviews.printouts import format_result

        return format_result(self)


def rewrite(
    gm: torch.fx.GraphModule,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
) -> RewriteResult:
    """Rewrite every provably safe ``as_strided`` of ``gm`` into view ops, on a copy.

    ``strict=True`` raises :class:`fxviews.UnsafeAsStridedError` for the first node that has to
    be kept. A graph without tensor metadata (e.g. from ``torch.fx.symbolic_trace``) needs
    ``example_inputs`` to compute it; without them an :class:`fxviews.FxViewsError` says so.

    Example::

        >>> res = fxviews.rewrite(fxviews.trace(push_jvp, x, y, yt))
        >>> [r.method for r in res.records]
        ['provenance']
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"fxviews.rewrite expects a torch.fx.GraphModule, got {type(gm).__name__}")
    start = time.perf_counter()
    # A new module over a copy of the graph: the caller's graph stays as it was, while
    # parameters, buffers and tensor constants stay shared (gradients still reach them).
    own = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    result = rewrite_in_place(own, strict=strict, example_inputs=example_inputs)
    result.seconds = time.perf_counter() - start
    return result


def rewrite_in_place(
    gm: torch.fx.GraphModule,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
) -> RewriteResult:
    """:func:`rewrite` for a caller that owns ``gm`` (transform, backend): no copy is made.

    ``gm`` itself is rewritten and becomes ``result.graph_module``.
    """
    start = time.perf_counter()
    code_before = gm.code
    engine = AsStridedToViews(strict=strict, example_inputs=example_inputs)
    modified = engine(gm).modified
    modified = eliminate_dead_metadata_checks(gm) or modified
    return RewriteResult(
        graph_module=gm,
        records=list(engine.records),
        modified=modified,
        code_before=code_before,
        seconds=time.perf_counter() - start,
    )
