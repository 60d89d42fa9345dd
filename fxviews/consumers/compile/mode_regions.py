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
call being compiled, as ``transform`` does at each op (Note [Modes inside fn]): where one runs
under a changed setting it depends on, the backend runs Dynamo's graph as Python instead, which
gives eager's results (``strict=True`` raises). Cost: ~1.5 us per call AOTAutograd's trace makes,
while it compiles.

Example::

    >>> with ModeRegions() as regions:
    ...     lowered = aot_lowering(gm, example_inputs)
    >>> regions.change   # None, or what ran under which setting
"""

from __future__ import annotations

from torch.overrides import TorchFunctionMode

from fxviews.tracing.modes import ModeChange, ModeWatch

__all__ = ["ModeRegions"]


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

    def hazard(self) -> str | None:
        """What :attr:`change` means for the graph, in words (None where nothing changed)."""
        if self.change is None:
            return None
        return (
            f"it changes a setting inside ({self.change.construct}): {self.change.why}, and "
            f"AOTAutograd's graphs keep no such region (Note [Modes set inside a compiled "
            f"function])"
        )
