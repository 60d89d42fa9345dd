"""Modes a function enters and leaves inside its body: autocast, the default dtype and the
process settings ops read when they run.

Note [Modes inside fn]
----------------------
``with torch.autocast(...)``, ``torch.set_default_dtype(...)`` or
``torch.use_deterministic_algorithms(True)`` inside ``fn`` changes what the ops after it do,
and eager does so on every call. A trace records aten ops below the dispatcher (the recording,
make_fx), and the graph runs them later in the caller's state; what each mode does to an op is
therefore read *at the op*, against the state the call was made in (:class:`ModeWatch`, run at
every op by :class:`~fxviews.tracing.autograd.AutogradWatch`), not from the statements that set
it:

1. **Autocast is in the graph as its casts.** Autocast's dispatch keys run above the Python key
   a trace records at: the recorded ops are the ``_to_copy`` casts it inserts and the ops on
   the cast tensors, for regions inside ``fn`` (nested, other dtypes, ``enabled=False``) as
   for the caller's autocast, as AOTAutograd's graphs hold them. Such a graph means what it
   says only where autocast does not cast its ops again: built for a call made under autocast,
   it runs with autocast off (:func:`autocast_free`, AOTAutograd's ``_DisableAutocast``), or an
   ``enabled=False`` region inside ``fn`` would be cast by the caller's autocast after all. Two
   kinds of node run above the dispatcher and read autocast themselves when the graph runs: a
   composite call kept whole (``linear``, ``matmul``: Note [Composite calls in a recording]) is
   kept only where autocast is off (its decomposition's casts are recorded otherwise), and a
   custom ``autograd.Function`` kept as one node runs its ``apply`` under the autocast state it
   was called in (:class:`~fxviews.tracing.autograd.KeptFunction`, :func:`under_autocast`), as
   its ``custom_fwd`` reads it.
2. **The default dtype** sets the dtype of a factory called without one (``torch.ones(4)``) and
   of a Python float mixed with integer tensors, when the op runs. An op run under a default
   dtype other than the call's whose floating result takes neither an argument's dtype nor one
   given explicitly is refused; an op it does not decide is kept.
3. **Other process settings ops read as they run** (:data:`SETTINGS`: deterministic algorithms,
   float32 matmul precision, reduced-precision reductions, cuDNN's and oneDNN's switches) decide
   the kernel an op picks, or whether it raises, when the graph runs: any op run under a
   setting other than the call's is refused.

A mode ``fn`` returns with changed (a ``set_default_dtype`` never undone) is refused too: its
graph would not change it. A refusal names the setting as ``fn`` left it, the op and the user's
line (:class:`ModeChange`); the signature then runs eagerly (cause ``"mode"``). Grad mode, forward
AD, inference mode and saved-tensor hooks are autograd's (Note [What autograd sees is part of
the trace]). The state at the call is part of every entry's guard (Note [The state a graph bakes
in], item 1), so a function that sets a mode and leaves it set is traced again, in that state,
at its next call.

Example::

    >>> def f(x):
    ...     with torch.autocast("cpu", dtype=torch.bfloat16):
    ...         return x @ x.t()
    >>> fxviews.transform(f)(torch.randn(3, 4)).dtype
    torch.bfloat16
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from fxviews.passes.compat.torch_internals import (
    PROCESS_SETTINGS,
    any_autocast_enabled,
    disable_autocast,
    pytree,
)

__all__ = [
    "AutocastState",
    "ModeChange",
    "ModeWatch",
    "SETTINGS",
    "autocast_free",
    "autocast_off",
    "autocast_state",
    "under_autocast",
]

#: The device types this build of PyTorch has autocast for.
AUTOCAST_DEVICES = tuple(
    device
    for device in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla")
    if torch.amp.is_autocast_available(device)
)

#: Autocast as a call sees it: (device type, dtype) of each device it is enabled for, and
#: whether it caches casts.
AutocastState = tuple[tuple[tuple[str, torch.dtype], ...], bool]


def autocast_state() -> AutocastState:
    """The autocast state now (item 1 of the Note); ``((), ...)`` where it is off everywhere.

    Example::

        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     autocast_state()
        ((('cpu', torch.bfloat16),), True)
    """
    enabled: tuple[tuple[str, torch.dtype], ...] = ()
    if any_autocast_enabled():
        enabled = tuple(
            (device, torch.get_autocast_dtype(device))
            for device in AUTOCAST_DEVICES
            if torch.is_autocast_enabled(device)
        )
    return enabled, torch.is_autocast_cache_enabled()


@contextlib.contextmanager
def under_autocast(state: AutocastState) -> Iterator[None]:
    """Run the block in autocast ``state`` (as :func:`autocast_state` read it), whatever the
    autocast around it."""
    enabled, cache = state
    with contextlib.ExitStack() as stack:
        stack.enter_context(autocast_off())
        for device, dtype in enabled:
            stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=cache))
        yield


def autocast_off() -> contextlib.AbstractContextManager[Any]:
    """A block with autocast off on every device (and on again after it, where it was)."""
    return disable_autocast()


def autocast_free(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` (a graph that holds autocast's casts, built for a call under autocast) run
    with autocast off, so that it casts nothing twice (item 1 of the Note); ~0.3 us a call.

    Example::

        >>> run = autocast_free(gm.forward)
    """

    @functools.wraps(forward)
    def run(*args: Any) -> Any:
        with disable_autocast():
            return forward(*args)

    return run


#: Item 3 of the Note: the settings whose change inside ``fn`` refuses every op run under it, by
#: the name a user sets them with.
SETTINGS = tuple(PROCESS_SETTINGS)
_READERS = tuple(PROCESS_SETTINGS.values())


def _read_settings() -> list[Any]:
    return [read() for read in _READERS]


class ModeChange(NamedTuple):
    """An op run under a mode other than the call's, which a graph cannot keep: the setting
    as ``fn`` left it (``torch.use_deterministic_algorithms changed to True``) and why."""

    construct: str
    why: str


class ModeWatch:
    """Items 2 and 3 of the Note at each op, against the state when it was made (the call's).

    Example::

        >>> watch = ModeWatch()
        >>> torch.use_deterministic_algorithms(True)
        >>> watch.before_op(torch.ops.aten.add.Tensor)
        ModeChange(construct='torch.use_deterministic_algorithms changed to True', why=...)
    """

    def __init__(self) -> None:
        self.settings = _read_settings()
        self.default_dtype = torch.get_default_dtype()
        self.autocast = autocast_state()

    def before_op(self, func: Any) -> ModeChange | None:
        """Item 3 for ``func``, about to run."""
        changed = self._changed_setting()
        if changed is None:
            return None
        return ModeChange(
            changed,
            f"{func} runs under it, and which kernel an op picks (or whether it raises) is "
            "decided as it runs: a graph would run it under the caller's setting",
        )

    def after_op(
        self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> ModeChange | None:
        """Item 2 for ``func``, which returned ``out``."""
        dtype = torch.get_default_dtype()
        if dtype == self.default_dtype or not _dtype_from_default(args, kwargs, out):
            return None
        return ModeChange(
            _default_dtype_changed(dtype),
            f"{func} takes its result's dtype from it (a factory without dtype=, or a Python "
            f"float with integer tensors), and a graph would take the caller's "
            f"({self.default_dtype}): set it outside fn, or give dtype= explicitly",
        )

    def at_return(self) -> ModeChange | None:
        """Whether ``fn`` returns with a mode changed, which its graph would not change."""
        # Whether autocast caches its casts is make_fx's to switch off while it traces.
        now, dtype = autocast_state()[0], torch.get_default_dtype()
        changed = (
            (now != self.autocast[0] and f"autocast changed to {now or 'off'}")
            or (dtype != self.default_dtype and _default_dtype_changed(dtype))
            or self._changed_setting()
        )
        if not changed:
            return None
        return ModeChange(changed, "fn returns with it changed, which a graph would not do")

    def _changed_setting(self) -> str | None:
        now = _read_settings()
        if now == self.settings:
            return None
        return next(
            f"{setting} changed to {value!r}"
            for setting, value, was in zip(SETTINGS, now, self.settings, strict=True)
            if value != was
        )


def _default_dtype_changed(dtype: torch.dtype) -> str:
    return f"the default dtype changed to {dtype} (torch.set_default_dtype)"


def _dtype_from_default(args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> bool:
    """Whether an op's floating or complex result may have taken its dtype from the default
    dtype: it is neither a tensor argument's dtype nor a dtype the call gives."""
    results = [
        leaf.dtype
        for leaf in pytree.tree_leaves(out)
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex())
    ]
    if not results:
        return False
    given = {
        leaf.dtype if isinstance(leaf, torch.Tensor) else leaf
        for leaf in pytree.tree_leaves((list(args), kwargs))
        if isinstance(leaf, (torch.Tensor, torch.dtype))
    }
    return any(dtype not in given for dtype in results)
