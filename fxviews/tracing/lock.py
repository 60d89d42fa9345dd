"""TODO"""

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["capturing", "tracing_in_progress", "tracing_lock"]

#: Serializes every trace in the process. Tracing torch.func code is not reentrant across
#: threads: forward-AD levels, functorch's transform stack and dispatch modes are shared
#: state, and two traces at once crash the interpreter. Reentrant: a traced function may call
#: a transformed one, which traces in turn.
tracing_lock = threading.RLock()


# How many captures are running on this thread (a traced function may call a transformed one).
_captures = threading.local()


def tracing_in_progress() -> bool:
    """Whether fxviews is capturing a function on this thread right now.

    Example::

        >>> tracing_in_progress()
        False
    """
    return getattr(_captures, "depth", 0) > 0


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    _captures.depth = getattr(_captures, "depth", 0) + 1
    try:
        yield
    finally:
        _captures.depth -= 1
