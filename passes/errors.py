"""Errors raised by the engine and re-exported by :mod:`fxviews`.

They live here, not in ``fxviews/``, because the engine imports nothing from the front door.
"""
from __future__ import annotations


class FxViewsError(RuntimeError):
    """Base class of every error fxviews raises on purpose.

    Example::

        try:
            fxviews.rewrite(gm, strict=True)
        except fxviews.FxViewsError as err:
            print(err)
    """


class UnsafeAsStridedError(FxViewsError):
    """An ``as_strided`` node could not be proven expressible with view ops (``strict=True``).

    ``node`` is the node's name, ``geometry`` the target ``(sizes, strides, offset)`` and
    ``reason`` why the node was kept.
    """

    def __init__(self, node: str, geometry: object, reason: str) -> None:
        self.node = node
        self.geometry = geometry
        self.reason = reason
        super().__init__(f"as_strided node {node!r} with geometry {geometry} was kept: {reason}")
