"""Process settings a compiled function changes inside its body, which AOTAutograd's graphs lose.

Note [Modes set inside a compiled function]
-------------------------------------------
Dynamo keeps a setting the function changes as a node of its graph where it can
(``torch.set_default_dtype``, ``torch.use_deterministic_algorithms``,
``torch.set_float32_matmul_precision``), as it keeps grad-mode and autocast regions.
AOTAutograd keeps the last two (their effects are in its graphs), but runs the others while it
traces and records the ops between them as they ran: a factory in a float64 region is recorded
without its dtype and makes the caller's default dtype when the graph runs (``aot_eager`` and
Inductor alike, torch 2.13). So while AOTAutograd lowers Dynamo's graph, :class:`ModeRegions`
(a torch function mode) reads the settings at each call the graph makes, against those of the
call being compiled, as ``transform`` does at each op (Note [Modes inside fn]). Where one runs
under a changed setting it depends on, the backend compiles the graph only up to the first
node that may change a setting (:func:`first_setting_change`) and runs the rest as Python,
which gives eager's results: every op before that node runs in the settings the call was
made in, which Dynamo's guards hold. The part before is lowered again, and checked again, on
its own. Where no such node is found, or the lowering's trace left a setting changed, the
whole graph runs as Python (``strict=True`` raises).

A frame that leaves a setting changed has done so already while Dynamo traced it: its graph
would be lowered in that setting rather than the caller's, and AOTAutograd would drop the
setter the call must run. Dynamo's guard on the frame's entry settings says when; such a graph
runs as Python from the start.

Cost: ~1.5 us per call AOTAutograd's trace makes, while it compiles, and a second lowering of
the part before a setter.

Example::

    >>> with ModeRegions() as regions:
    ...     lowered = aot_lowering(gm, example_inputs)
    >>> regions.change   # None, or what ran under which setting
"""

from __future__ import annotations

import torch.fx
from torch.overrides import TorchFunctionMode

from fxviews.tracing.modes import ModeChange, ModeWatch

__all__ = ["ModeRegions", "first_setting_change"]

#: Setters Dynamo keeps as nodes that AOTAutograd keeps too (grad mode is in its graphs).
_KEPT_BY_AOTAUTOGRAD = frozenset({"_set_grad_enabled"})


class ModeRegions(TorchFunctionMode):
    """The first call made under a setting other than the one it was entered in (see the Note),
    as :attr:`change`."""

    def __init__(self) -> None:
        super().__init__()
        self.watch = ModeWatch()
        self.change: ModeChange | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.change is None:
            self.change = self.watch.before_op(func)
        out = func(*args, **kwargs)
        if self.change is None:
            self.change = self.watch.after_op(func, args, kwargs, out)
        return out

    def restored(self) -> bool:
        """Whether the settings are those it was entered in again (the lowering's trace ran
        the graph's setters: one that is not undone leaves its setting changed)."""
        return self.watch.at_return() is None

    def hazard(self) -> str | None:
        """What :attr:`change` means for the graph, in words (None where nothing changed)."""
        if self.change is None:
            return None
        return (
            f"it changes a setting inside ({self.change.construct}): {self.change.why}, and "
            f"AOTAutograd's graphs keep no such region (Note [Modes set inside a compiled "
            f"function])"
        )


def first_setting_change(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The first node of Dynamo's graph ``gm`` that may change a process setting
    (``torch.set_default_dtype``, ``torch._C._set_deterministic_algorithms``,
    ``torch.set_float32_matmul_precision``: a function named ``set_...`` or ``_set_...``), other
    than the ones AOTAutograd keeps; None where there is none. Naming a node that changes
    nothing only makes more of the graph run eagerly: each part compiled is checked again."""
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if name.startswith(("set_", "_set_")) and name not in _KEPT_BY_AOTAUTOGRAD:
            return node
    return None
