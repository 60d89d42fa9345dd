"""Layouts read in Python under torch.compile: a number Dynamo read from a wrong fake layout
raises, never computes.

Note [Layouts read in Python]
-----------------------------
A function compiled with Dynamo may read a layout in Python: ``y.stride()``, ``y.stride(1)``,
``y.is_contiguous()``, ``y.is_contiguous(memory_format=...)``. Dynamo answers from ``y``'s fake
value at trace time and puts the answer into the bytecode as a constant (the value goes on into
Python arithmetic, a branch, or a ``view``'s sizes): no node of the graph says it was read.
Where ``y``'s fake kernel computes another layout than its eager one (``roll`` of a
channels_last tensor: fake contiguous, eager channels_last), the compiled function computes
with numbers eager never sees (``y * y.stride(1)`` is ``20 * y`` compiled, ``1 * y`` eager) —
with any backend, Dynamo's ``eager`` one included. So:

1. **Marking.** While a compile with ``backend="fxviews"`` is possible (from the backend's
   first lookup on), Dynamo's answers to those methods of a traced tensor also mark the
   tensor's graph node (``node.meta[DYNAMO_LAYOUT_READS]``: which method, the user's file and line).
   Only the mark is added; Dynamo's answer is unchanged. A compile with another backend
   carries the mark and nothing reads it.
2. **Checking.** The backend's first stage takes each marked node outside vmap regions that is
   not a graph input (an input's layout is the caller's, and Dynamo guards it) and asks layout
   truth (Note [Layouts are facts to check]) whether its traced layout is eager's.
3. **Verdict.** Where it is not, the compile raises :class:`~fxviews.FxViewsError` naming the
   read, the user's line and both layouts (Dynamo reports it as a backend failure; nothing
   runs). Where layout truth cannot check the layout (an op with no eager kernel to run for
   it), the backend says so through the ``fxviews`` logger and compiles: a layout nobody can
   compute is not known to be wrong. A read inside a ``torch.func.vmap`` region is of vmap's
   batched value, whose layout is vmap's (Note [The backend's first stage]): not checked.

Cost: nothing for a graph without a marked node; otherwise layout truth's eager runs over the
marked nodes' ancestors (cached per op and layouts).

Example::

    >>> def f(x):                       # x channels_last
    ...     y = torch.roll(x, 1, 0)
    ...     return y * y.stride(1)
    >>> torch.compile(f, backend="fxviews")(x)
    BackendCompilerFailed: ... y.stride() at f.py:3 read the layout of roll ('roll') ...
"""

from __future__ import annotations

import functools
import linecache
import threading
from collections.abc import Callable
from typing import Any

import torch.fx

from fxviews.consumers.compile.dynamo_values import assign_values, clear_values
from fxviews.passes.analysis.layout_truth import LayoutTruth
from fxviews.passes.compat.torch_internals import wrap_dynamo_tensor_method
from fxviews.passes.errors import FxViewsError
from fxviews.passes.schema import DYNAMO_LAYOUT_READS
from fxviews.passes.source_lines import describe_node
from fxviews.rewriting.printouts import logger

#: Dynamo's methods of a traced tensor that answer a layout question from the fake value.
_LAYOUT_METHODS = ("stride", "is_contiguous")
_INSTALL_LOCK = threading.Lock()
#: The handlers this module made: installing twice wraps nothing twice.
_MARKING_HANDLERS: set[Callable[..., Any]] = set()


def mark_layout_reads() -> None:
    """Make Dynamo's answers to ``stride()`` and ``is_contiguous()`` mark the node they read
    (see Note, 1); once per process, idempotent.

    Example::

        >>> mark_layout_reads()   # then torch.compile(f, backend="fxviews") traces f
    """
    with _INSTALL_LOCK:
        for name in _LAYOUT_METHODS:
            wrap_dynamo_tensor_method(name, functools.partial(_marking, name=name))


def _marking(handler: Callable[..., Any], name: str) -> Callable[..., Any]:
    if handler in _MARKING_HANDLERS:
        return handler

    @functools.wraps(handler)
    def marked(variable: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        node = getattr(getattr(variable, "proxy", None), "node", None)
        if isinstance(node, torch.fx.Node) and node.op != "placeholder":
            node.meta.setdefault(DYNAMO_LAYOUT_READS, []).append(
                f"{node.name}.{name}() at {_line(tx)}"
            )
        return handler(variable, tx, *args, **kwargs)

    _MARKING_HANDLERS.add(marked)
    return marked


def _line(tx: Any) -> str:
    """The user's file, line and code where Dynamo's translator ``tx`` is."""
    code, line = getattr(tx, "f_code", None), getattr(tx, "lineno", None)
    if code is None or line is None:
        return "an unknown line"
    text = linecache.getline(code.co_filename, line).strip()
    return f"{code.co_filename}:{line}" + (f": {text}" if text else "")


def check_layout_reads(gm: torch.fx.GraphModule) -> None:
    """Raise where Python read the layout of a node of Dynamo's graph ``gm`` whose traced
    layout is not eager's (see Note, 2-3).

    Example::

        >>> check_layout_reads(gm)   # gm: Dynamo's graph of f in the Note's example
        FxViewsError: roll.stride() at f.py:3 read the layout of 'roll' ...
    """
    marked = [n for n in gm.graph.nodes if n.meta.get(DYNAMO_LAYOUT_READS)]
    if not marked:
        return
    values = assign_values(gm)
    try:
        truth = LayoutTruth(gm)
        for node in marked:
            if node in values.batched or not isinstance(node.meta.get("val"), torch.Tensor):
                continue
            disagreement, doubt = truth.layout_doubt(node)
            reads = "; ".join(node.meta[DYNAMO_LAYOUT_READS])
            if disagreement:
                raise FxViewsError(
                    f"{reads}: Python read the layout of {describe_node(node)} as Dynamo traced "
                    f"it, and {doubt}. Dynamo put what it read into the compiled code, which "
                    "would compute with other numbers than eager PyTorch. Read the layout of a "
                    "graph input, or of a tensor made contiguous first (.contiguous()), or run "
                    "this function without torch.compile"
                )
            if doubt is not None:
                logger.warning(
                    "backend='fxviews': %s read the layout of %s, which fxviews cannot check "
                    "against eager PyTorch's (%s): the compiled code uses the traced one",
                    reads,
                    describe_node(node),
                    doubt,
                )
    finally:
        clear_values(gm, values)
