"""``fxviews.trace``: capture a function as an aten-level GraphModule with make_fx."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxviews.passes import FxViewsError


def trace(
    fn: Callable[..., Any],
    *args: Any,
    view_replay: bool = False,
) -> torch.fx.GraphModule:
    """Trace ``fn(*args)`` into an aten-level ``torch.fx.GraphModule`` (``make_fx``, real tensors).

    Every node carries ``meta["val"]``, so :func:`fxviews.rewrite` can read the layout each
    tensor had while tracing. ``view_replay=True`` traces under
    ``torch.autograd._force_original_view_tracking(True)``, PyTorch's own view replay, which
    makes autograd replay the original view ops instead of emitting ``as_strided``.

    Example::

        >>> gm = fxviews.trace(lambda x: x.t().contiguous(), torch.randn(2, 3))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
        [aten.t.default, aten.clone.default]
    """
    if not callable(fn):
        raise TypeError(f"fxviews.trace expects a callable, got {type(fn).__name__}")
    replay = (
        torch.autograd._force_original_view_tracking(True)
        if view_replay
        else contextlib.nullcontext()
    )
    try:
        with replay:
            return make_fx(fn, tracing_mode="real")(*args)
    except (torch.fx.proxy.TraceError, torch._dynamo.exc.UserError) as err:  # pragma: no cover
        raise FxViewsError(f"could not trace {_name(fn)}: {err}") from err
    except RuntimeError as err:
        if "data-dependent" in str(err) or "Data dependent" in str(err):
            raise FxViewsError(
                f"could not trace {_name(fn)}: its Python control flow depends on tensor "
                f"values, which a graph cannot capture ({err})"
            ) from err
        raise


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
