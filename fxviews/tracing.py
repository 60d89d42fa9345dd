"""``fxviews.trace``: capture a function as an aten-level GraphModule with make_fx.

Both :func:`trace` and ``transform`` trace in make_fx's fake mode. Real-mode make_fx snapshots
every value on its own, which loses storage offsets (``x[1:]`` is recorded at offset 0); the
engine reads each as_strided relative to its input's recorded layout, offset included, so it
needs the fake-mode record. Fake tracing also turns Python branches on tensor values into an
error instead of one branch silently baked into the graph.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from fxviews.passes import FxViewsError
from fxviews.passes.torch_internals import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
    force_original_view_tracking,
    make_fx,
)


def trace(
    fn: Callable[..., Any],
    *args: Any,
    view_replay: bool = False,
    functionalize: bool = False,
) -> torch.fx.GraphModule:
    """Trace ``fn(*args)`` into an aten-level ``torch.fx.GraphModule`` with make_fx.

    ``args`` are example tensors (real or fake); every node records ``meta["val"]`` with the
    exact layout it had, so :func:`fxviews.rewrite` can read each as_strided relative to its
    input. ``view_replay=True`` traces under PyTorch's own view replay
    (``torch.autograd._force_original_view_tracking(True)``), which makes autograd replay the
    original view ops instead of emitting ``as_strided``. ``functionalize=True`` traces
    ``torch.func.functionalize(fn)``: no intermediate is mutated, so no view's aliasing is
    observable and the reshape step can make every ``view`` layout-portable; mutations of the
    inputs still happen, copied back at the end. Python control flow that depends on tensor
    values cannot be traced and raises :class:`fxviews.FxViewsError`.

    Example::

        >>> gm = fxviews.trace(lambda x: x.t().contiguous(), torch.randn(2, 3))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
        [aten.t.default, aten.clone.default]
    """
    if not callable(fn):
        raise TypeError(f"fxviews.trace expects a callable, got {type(fn).__name__}")
    replay = (
        force_original_view_tracking(True)
        if view_replay
        else contextlib.nullcontext()
    )
    traced = torch.func.functionalize(fn) if functionalize else fn
    with replay:
        return make_graph(traced, args, caller="fxviews.trace", name=function_name(fn))


def make_graph(
    fn: Callable[..., Any], args: Sequence[Any], *, caller: str, name: str
) -> torch.fx.GraphModule:
    """make_fx ``fn`` in fake mode, turning tracing limits into :class:`FxViewsError`.

    ``caller`` and ``name`` say who traced what, for the error message.
    """
    try:
        return make_fx(fn, tracing_mode="fake")(*args)
    except (GuardOnDataDependentSymNode, DataDependentOutputException) as err:
        raise FxViewsError(
            f"{caller} could not trace {name}: its Python control flow depends on tensor "
            f"values (e.g. `if x.sum() > 0:`), which one graph cannot capture. Use torch.where "
            f"or torch.cond instead. ({_first_line(err)})"
        ) from err
    except DynamicOutputShapeException as err:
        raise FxViewsError(
            f"{caller} could not trace {name}: an operator's output shape depends on tensor "
            f"values ({_first_line(err)})"
        ) from err
    except RuntimeError as err:
        if "escaped from inside a function being" in str(err):
            raise FxViewsError(
                f"{caller} could not trace {name}: it uses a tensor wrapped by an enclosing "
                f"torch.func transform that is not one of its arguments (captured by a "
                f"closure?). Pass that tensor as an argument."
            ) from err
        raise


def function_name(fn: Callable[..., Any]) -> str:
    """A readable name for ``fn`` (functools.partial included) in messages."""
    func = getattr(fn, "func", None)
    if func is not None and hasattr(fn, "args"):
        return f"partial({function_name(func)})"
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
