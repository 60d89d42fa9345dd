"""Argument types shared by the command lines (``fxviews`` and its ``bench``)."""

from __future__ import annotations

import argparse

__all__ = ["positive_int"]


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
