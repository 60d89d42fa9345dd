"""Errors raised by the engine and re-exported by :mod:`fxviews`.

They live here, not in ``fxviews/``, because the engine imports nothing from the front door.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .geometry.concrete import Geometry

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


class AsStridedRequestError(FxViewsError, ValueError):
    """An ``as_strided`` request no chain of view ops can give from the tensor it is made on.

    ``source`` is the tensor's geometry, ``target`` the request (offsets in storage elements;
    both 0 under torch.compile when no offset was given), ``reason`` why: it reads memory the
    tensor does not expose, or it has no view form. Raised by ``fxviews.as_strided``
    (:mod:`fxviews.passes.runtime.runtime_views`); it lives here so catching it imports nothing
    more.

    Example::

        >>> fxviews.as_strided(torch.zeros(4), (3,), (2,))
        AsStridedRequestError: as_strided request sizes=[3] strides=[2] offset=0 on a tensor
        of geometry sizes=[4] strides=[1] offset=0: unsafe: it reads the element 4 past the
        tensor's offset, which the tensor does not expose
    """

    def __init__(self, source: Geometry, target: Geometry, reason: str) -> None:
        self.source = source
        self.target = target
        self.reason = reason
        super().__init__(f"as_strided request {target} on a tensor of geometry {source}: {reason}")
