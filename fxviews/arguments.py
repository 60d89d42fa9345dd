"""Argument checks: the command lines' types (``fxviews`` and its ``bench``), the API's flags,
a call of the user's function."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["check_call", "check_flags", "positive_int"]


def check_flags(caller: str, *, optional: bool = False, **flags: object) -> None:
    """Raise TypeError naming ``caller`` and the flag for any of ``flags`` that is not a bool.

    A flag is a switch: ``strict="yes"`` or ``strict=1`` is most likely a mistake (a string is
    always true), so it is refused rather than read as true. ``optional=True`` also accepts
    ``None`` (a flag whose default depends on other arguments).

    Example::

        >>> check_flags("fxviews.rewrite", strict=1)
        TypeError: fxviews.rewrite: strict must be True or False, got 1 (int)
    """
    for name, value in flags.items():
        if isinstance(value, bool) or (optional and value is None):
            continue
        allowed = "True, False or None" if optional else "True or False"
        raise TypeError(
            f"{caller}: {name} must be {allowed}, got {value!r} ({type(value).__name__})"
        )


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts: a usage error, not a traceback, for 0 or less.

    Example::

        >>> parser.add_argument("--batch-size", type=positive_int, default=5)
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def check_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], name: str
) -> None:
    """Raise the TypeError of a call ``fn``'s signature does not accept (``name``: ``fn`` in
    the message), before anything traces it.

    Example::

        >>> check_call(lambda x: x, (1, 2), {}, "double")
        TypeError: double(): too many positional arguments
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): the trace will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{name}(): {err}") from None
