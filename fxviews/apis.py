"""``fxviews.rewrite``: the engine on a copy of a GraphModule or of an exported program.

The front door only dispatches: a GraphModule goes to
:func:`fxviews.rewriting.steps.rewrite_graph`, an ``ExportedProgram`` to
:func:`fxviews.consumers.export.program.rewrite_exported`, which rewrites the program's graph the
same way and builds a new, validated program around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from fxviews.arguments import check_flags
from fxviews.calls.cache import DEFAULT_CACHE_SIZE, cached_function
from fxviews.consumers.export.program import rewrite_exported
from fxviews.passes import Opset
from fxviews.rewriting.steps import RewriteResult, RewriteSteps, rewrite_graph
from fxviews.tracing.capture import trace

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["explain", "rewrite", "transform"]


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


def transform(
    fn: _F,
    *,
    strict: bool = False,
    cache_size: int = DEFAULT_CACHE_SIZE,
    functionalize: bool = False,
) -> _F:
    """Return a function that computes ``fn`` with a traced graph free of layout-baked as_strided.

    On every call the arguments' signature (pytree structure; each tensor's logical shape,
    dtype, device, ``requires_grad`` and traced strides; every other value) and the state
    eager PyTorch would read afresh (grad mode, autocast, the default dtype and the rest of the
    process state ``torch.compile`` guards on; the ``training`` flag of every module ``fn``
    reaches: see *Guards* in the README) select a cached graph. On a miss, ``fn`` is traced on
    fresh tensors of those shapes in that state (each sample of a batched argument contiguous,
    any other argument in its own layout: Note [The layout of a call]; requiring grad where
    the call's do: see docs/autograd.md), outside any enclosing ``torch.func`` transform; its
    ``as_strided`` nodes are rewritten into view ops by :func:`fxviews.rewrite`, dead nodes
    are dropped, and the graph is cached (``cache_size`` entries, least recently used first
    out). The graph then runs on the actual arguments, so ``vmap``, ``jvp``, ``grad``,
    ``vjp``, ``jacfwd``, ``jacrev``, ``hessian`` and their compositions applied around the
    result see plain aten ops and are right for any memory layout, for example a batch dim
    that is not first in memory. ``fn`` may itself use ``torch.func`` transforms.

    Each ``as_strided`` in ``fn`` (written by you or emitted by forward AD/autograd) is read
    relative to the layout its input had when traced: the argument's own where it is called
    directly (eager's numbers), a contiguous sample's under ``vmap``. ``reshape``, ``flatten``,
    ``contiguous()`` and their kin decide view or copy when the graph runs (Note [Layout
    decisions at run time]).

    Tracing records ``fn``'s ops on one sample's real values (one per-sample eager call of
    compute), and goes on to fake mode wherever values could leave the graph (``.item()``,
    boolean masks, ``tolist``), as :func:`fxviews.trace` traces; see *Tracing real programs*
    in docs/transform.md. Where
    ``fn`` cannot be one graph at all (Python control flow on tensor values, shapes computed
    from tensor values), the transformed function runs ``fn`` eagerly for that signature, as
    ``torch.compile`` does at a graph break: it warns once through the ``fxviews`` logger and
    counts the signature in ``cache_info().eager``. Any other failure of a first call is not
    cached: an exception ``fn`` raises propagates unchanged, and where fxviews cannot trace
    ``fn`` (an uninitialized lazy module, a limitation of the tracer) this call runs eagerly
    and the next one traces again. ``strict=True`` raises :class:`fxviews.TracingError`
    instead of running ``fn`` eagerly. A transformed function called while another is traced
    (or under :func:`fxviews.trace`) is traced through, as part of the outer graph.

    Calls leave the state eager calls leave: buffers (BatchNorm's running statistics),
    parameters, closed-over tensors and the random stream are updated once per call, by the
    graph; the trace puts back whatever it wrote outside its own tensors.

    Tracing, cache updates and eager calls hold one process-wide lock (``torch.func`` code,
    traced or eager, is not reentrant across threads); calls that find their graph in the cache
    take no lock, so a transformed function may be called from many threads at once.

    Args:
        fn: the function to transform. Non-tensor arguments are part of the signature and
            baked into the graph. ``fn`` may close over real tensors (parameters, buffers):
            the graph uses them by reference.
        strict: raise :class:`fxviews.UnsafeAsStridedError` instead of keeping an as_strided
            node that cannot be proven expressible with view ops, and
            :class:`fxviews.TracingError` instead of running ``fn`` eagerly when it cannot be
            traced.
        cache_size: how many signatures to keep graphs for (at least 1).
        functionalize: trace ``torch.func.functionalize(fn)``: mutations of intermediates
            become out-of-place ops, so no aliasing inside the graph is observable and every
            ``view`` can become a layout-portable ``reshape``. Mutations of ``fn``'s inputs
            still happen (copied back at the end). Off by default: outputs then no longer
            alias inputs, and forward AD (``jvp``, ``jacfwd``, ``hessian``) applied around
            the result cannot differentiate the functional ``copy`` it introduces.

    Returns:
        A function with ``fn``'s signature (``functools.wraps``), plus ``cache_info()`` and
        ``cache_clear()``.

    Raises:
        TypeError: ``fn`` is not callable.
        TracingError: at call time with ``strict=True``, when ``fn`` cannot be traced.

    Example::

        >>> def f(x, y):
        ...     x = x.clone()
        ...     view = x[0]
        ...     x.copy_(y)
        ...     return view, x
        >>> def push_jvp(x, y, yt):
        ...     return torch.func.jvp(functools.partial(f, x), (y,), (yt,))
        >>> batched = torch.func.vmap(fxviews.transform(push_jvp), in_dims=(1, 2, 2))
        >>> primals, tangents = batched(x, y, yt)   # right for every batch position
    """
    if not callable(fn):
        raise TypeError(f"fxviews.transform expects a callable, got {type(fn).__name__}")
    check_flags("fxviews.transform", strict=strict, functionalize=functionalize)
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
    return cached_function(fn, strict=strict, cache_size=cache_size, functionalize=functionalize)


def explain(fn: Callable[..., Any], *args: Any, strict: bool = False) -> RewriteResult:
    """Trace ``fn(*args)`` and rewrite it: ``fxviews.rewrite(fxviews.trace(fn, *args))``.

    For debugging: print the result to see every as_strided node, what it became and why, and
    the diff of the graph code. The trace reads ``args`` as they are, layout included (unlike
    :func:`transform`, which traces each batched sample as a fresh contiguous tensor); call it
    outside ``torch.func``
    transforms.

    Example::

        >>> print(fxviews.explain(push_jvp, x, y, yt))
    """
    check_flags("fxviews.explain", strict=strict)
    return rewrite(trace(fn, *args), strict=strict)
