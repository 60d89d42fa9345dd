"""``fxviews.executorch``: ExecuTorch's ``to_edge`` and ``to_edge_transform_and_lower``, with
every provable ``as_strided`` rewritten first.

Note [as_strided on ExecuTorch]
-------------------------------
ExecuTorch turns every view of an edge program into a ``*_copy`` op, so each tensor it runs is
dense. ``as_strided`` becomes ``as_strided_copy``, which reads its (dense) input at the strides
recorded for the traced layout: on a transposed, sliced or offset input it returns other
elements, silently, or fails at run time on addresses past the input's end. The wrappers here
are drop-in replacements for ExecuTorch's functions of the same names:

1. each ``ExportedProgram`` is rewritten with ``fxviews.rewrite(ep, opset="core_aten")``: only
   the training IR's forward-AD and autograd ops are lowered (an empty decomposition table), so
   ``linear``, ``conv2d``, ... reach the partitioner as they would without fxviews, and a
   program without ``as_strided`` comes out unchanged; each chain is written in core ATen ops,
   which ``to_edge`` verifies, preferring those XNNPACK delegates (``slice``, ``view``,
   ``permute``, ``cat``); overlapping windows are copied slices joined by ``cat``, and with
   ``copy_unfolds=True`` so is the model's own ``unfold``, which ``to_edge`` refuses;
2. every ``as_strided`` fxviews had to keep is checked: its input must be contiguous from
   offset 0 (``fxviews.consumers.export.flat_reads``), else :class:`fxviews.FxViewsError` names it;
3. ExecuTorch's own function gets the rewritten programs and every other argument unchanged.

ExecuTorch is imported when a wrapper is called, never at ``import fxviews``; without it an
ImportError names the extra to install (``fxviews[executorch]``).

Example::

    >>> from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    >>> ep = torch.export.export(model, (x,))
    >>> edge = fxviews.executorch.to_edge_transform_and_lower(
    ...     ep, partitioner=[XnnpackPartitioner()])
    >>> edge.to_executorch().write_to_file(open("model.pte", "wb"))
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch.export import ExportedProgram

from fxviews.consumers.export.flat_reads import check_flat_read
from fxviews.consumers.export.program import rewrite_exported
from fxviews.passes import Opset
from fxviews.rewriting.steps import RewriteSteps

__all__ = ["rewrite_for_edge", "to_edge", "to_edge_transform_and_lower"]

aten = torch.ops.aten

#: The as_strided family as ExecuTorch runs it: a read (or write) of a dense tensor.
_FLAT_READS = (
    aten.as_strided.default,
    aten.as_strided_copy.default,
    aten.as_strided_scatter.default,
)


def edge_steps(copy_unfolds: bool) -> RewriteSteps:
    """The steps an edge program is rewritten with: core-ATen chains, no vmap layout steps,
    and the model's own ``unfold`` copied if asked (``to_edge`` refuses it otherwise)."""
    return RewriteSteps.of(Opset.CORE_ATEN, None, None, copy_unfolds)


def rewrite_for_edge(
    programs: ExportedProgram | dict[str, ExportedProgram],
    strict: bool = False,
    copy_unfolds: bool = False,
) -> ExportedProgram | dict[str, ExportedProgram]:
    """``programs`` (one, or a dict of methods) rewritten for an edge compiler (see the Note).

    ``strict=True`` raises :class:`fxviews.UnsafeAsStridedError` for any as_strided fxviews has
    to keep; without it, a kept one ExecuTorch would run differently from eager raises
    :class:`fxviews.FxViewsError`. ``copy_unfolds=True`` also writes the model's own
    ``unfold`` nodes as verified copies (``fxviews.rewrite``'s option of that name), which
    ``to_edge`` otherwise refuses. The programs passed in are never modified.

    Example::

        >>> edge_ep = rewrite_for_edge(torch.export.export(model, (x,)))
        >>> executorch.exir.to_edge(edge_ep)   # core ATen: to_edge accepts it
    """
    if isinstance(programs, dict):
        return {name: _rewrite_one(ep, strict, copy_unfolds, name) for name, ep in programs.items()}
    return _rewrite_one(programs, strict, copy_unfolds, "forward")


def to_edge(
    programs: ExportedProgram | dict[str, ExportedProgram],
    *args: Any,
    strict: bool = False,
    copy_unfolds: bool = False,
    **kwargs: Any,
) -> Any:
    """``executorch.exir.to_edge`` of :func:`rewrite_for_edge` (``programs``, ``strict``,
    ``copy_unfolds``); an ``EdgeProgramManager``. Other arguments go to ExecuTorch unchanged.

    Example::

        >>> edge = fxviews.executorch.to_edge(torch.export.export(model, (x,)))
        >>> pte = edge.to_executorch()
    """
    return _exir().to_edge(rewrite_for_edge(programs, strict, copy_unfolds), *args, **kwargs)


def to_edge_transform_and_lower(
    programs: ExportedProgram | dict[str, ExportedProgram],
    *args: Any,
    strict: bool = False,
    copy_unfolds: bool = False,
    **kwargs: Any,
) -> Any:
    """``executorch.exir.to_edge_transform_and_lower`` of :func:`rewrite_for_edge`
    (``programs``, ``strict``, ``copy_unfolds``); partitioners, transform passes and the rest
    go to ExecuTorch unchanged.

    Example::

        >>> edge = fxviews.executorch.to_edge_transform_and_lower(
        ...     ep, partitioner=[XnnpackPartitioner()])
        >>> pte = edge.to_executorch()
    """
    lowered = rewrite_for_edge(programs, strict, copy_unfolds)
    return _exir().to_edge_transform_and_lower(lowered, *args, **kwargs)


def _rewrite_one(program: Any, strict: bool, copy_unfolds: bool, name: str) -> ExportedProgram:
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"fxviews.executorch expects torch.export ExportedPrograms; method {name!r} is a "
            f"{type(program).__name__}"
        )
    result = rewrite_exported(program, strict, steps=edge_steps(copy_unfolds), inference=True)
    rewritten = result.exported_program
    for node in rewritten.graph.nodes:
        if node.target in _FLAT_READS:
            check_flat_read(node, "ExecuTorch")
    return rewritten


def _exir() -> Any:
    """ExecuTorch's ``executorch.exir``, or an ImportError naming the extra to install."""
    try:
        return importlib.import_module("executorch.exir")
    except ImportError as err:
        raise ImportError(
            "fxviews.executorch needs ExecuTorch: pip install 'fxviews[executorch]' "
            f"(executorch 1.5.1 is the version tested) ({err})"
        ) from err
