"""``Function.apply`` while a trace runs: a custom autograd.Function kept as one node (step 2
of Note [What autograd sees is part of the trace] in ``fxviews/autograd_structure.py``).

Example::

    >>> with keeping_functions(watch):
    ...     fn(x)   # each Function.apply on this thread goes to watch.keep_function
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import torch

__all__ = ["FunctionKeeper", "keeping_functions", "original_apply"]


class FunctionKeeper(Protocol):
    """What keeps a Function's call as one node: an
    :class:`~fxviews.autograd_structure.AutogradWatch`."""

    unrecorded: int  # depth of kept calls running: a Function applied inside one runs as it is

    def keep_function(
        self, cls: type[torch.autograd.Function], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...


# The class attribute, put back as it was: a Python classmethod before torch 2.15; from 2.15
# _FunctionBase's C++ classmethod (a classmethod_descriptor, with no __func__), where apply's
# Python logic moved. Both bind to a class through __get__.
_ORIGINAL_APPLY: Any = torch.autograd.Function.__dict__["apply"]


def original_apply(cls: type[torch.autograd.Function], *args: Any, **kwargs: Any) -> Any:
    """``cls.apply(*args, **kwargs)`` as PyTorch defines it, whatever the class holds now."""
    return _ORIGINAL_APPLY.__get__(None, cls)(*args, **kwargs)


_tracing = threading.local()  # .watch: the watch of the trace running on this thread
_patch_lock = threading.Lock()
_patches = [0]  # traces running with the replacement installed, on any thread


def _apply_while_tracing(cls: type[torch.autograd.Function], *args: Any, **kwargs: Any) -> Any:
    watch = getattr(_tracing, "watch", None)
    if watch is None or watch.unrecorded:  # another thread, or nested in a kept call
        return original_apply(cls, *args, **kwargs)
    return watch.keep_function(cls, args, kwargs)


@contextlib.contextmanager
def keeping_functions(watch: FunctionKeeper) -> Iterator[None]:
    """``Function.apply`` kept as one node for ``watch``'s trace, on this thread."""
    previous = getattr(_tracing, "watch", None)
    _tracing.watch = watch
    with _patch_lock:
        if not _patches[0]:
            torch.autograd.Function.apply = classmethod(_apply_while_tracing)  # type: ignore[assignment, method-assign]
        _patches[0] += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patches[0] -= 1
            if not _patches[0]:
                torch.autograd.Function.apply = _ORIGINAL_APPLY  # type: ignore[method-assign]
        _tracing.watch = previous
