"""Errors raised by the engine and re-exported by :mod:`fxviews`.

They live here, not in ``fxviews/``, because the engine imports nothing from the front door.
"""

from __future__ import annotations

#: ``(sizes, strides, offset)`` as an as_strided call writes them.
RequestedGeometry = tuple[tuple[object, ...], tuple[object, ...], object]


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

    ``node`` is the node's name, ``geometry`` the target ``(sizes, strides, offset)`` as tuples
    and an int (SymInts for symbolic shapes; offset None when omitted and unknown),
    ``reason`` why the node was kept and ``source`` the user's source line that made it
    (``file:line, in function``), where the trace recorded one.

    Example::

        >>> err.geometry
        ((3,), (5,), 2)
    """

    def __init__(
        self, node: str, geometry: RequestedGeometry, reason: str, *, source: str | None = None
    ) -> None:
        self.node = node
        self.geometry = geometry
        self.reason = reason
        self.source = source
        sizes, strides, offset = geometry
        where = "" if source is None else f" ({source})"
        super().__init__(
            f"as_strided node {node!r}{where} with sizes {list(sizes)}, strides "
            f"{list(strides)} and offset {offset} was kept: {reason}"
        )
