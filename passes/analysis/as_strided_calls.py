"""Recognize as_strided-family calls in a graph, however spelled, and bind their arguments.

Example::

    >>> bind_as_strided(node)   # as_strided(clone_1, [6], [1], 0)
    {'storage_offset': 0, 'self': clone_1, 'size': [6], 'stride': [1]}
"""

from __future__ import annotations

from typing import Any

import torch.fx

from ..chains.provenance import node_geometry
from ..compat.torch_internals import OpOverload, disable_current_modes, op_schema
from ..errors import RequestedGeometry
from ..geometry.concrete import Geometry
from ..graph_edits import arguments_by_name
from ..op_tables import AS_STRIDED_OPS, TORCH_LEVEL_AS_STRIDED


def as_strided_op(node: torch.fx.Node) -> OpOverload | None:
    """The aten as_strided-family op ``node`` calls, however it is spelled, or None."""
    if node.op == "call_function" and node.target in AS_STRIDED_OPS:
        return node.target
    if node.op in ("call_function", "call_method"):
        try:
            return TORCH_LEVEL_AS_STRIDED.get(node.target)
        except TypeError:  # an unhashable target
            return None
    return None


def bind_as_strided(node: torch.fx.Node) -> dict[str, Any]:
    """An as_strided-family node's arguments by their aten schema names.

    Keys: ``self``, ``size``, ``stride``, ``storage_offset`` (None when omitted) and, for
    ``as_strided_scatter``, ``src``. Torch-level spellings name ``self`` ``input``.
    """
    op = as_strided_op(node)
    assert op is not None, f"{node.name} is not an as_strided node"
    bound: dict[str, Any] = {"storage_offset": None, **arguments_by_name(node, op)}
    if "input" in bound:
        bound["self"] = bound.pop("input")
    return bound


def requested_geometry(node: torch.fx.Node) -> RequestedGeometry:
    """The ``(sizes, strides, offset)`` an as_strided-family node asks for, as written.

    An omitted offset is the input's trace-time offset (None if that is unknown). Values are
    SymInts when the graph has symbolic shapes.

    Example::

        >>> requested_geometry(node)   # as_strided(clone_1, [6], [1], 0)
        ((6,), (1,), 0)
    """
    kwargs = bind_as_strided(node)
    offset = kwargs["storage_offset"]
    if offset is None:
        source_geometry = node_geometry(kwargs["self"])
        offset = None if source_geometry is None else source_geometry.offset
    return tuple(kwargs["size"]), tuple(kwargs["stride"]), offset


def static_request(node: torch.fx.Node, default_offset: int | torch.SymInt) -> Geometry | None:
    """The geometry an as_strided-family node asks for where it is static (an omitted offset
    being ``default_offset``: its input's), else None.

    Example::

        >>> static_request(node, 0)   # x.as_strided((3,), (2,))
        Geometry(sizes=(3,), strides=(2,), offset=0)
    """
    sizes, strides, offset = requested_geometry(node)
    values = (*sizes, *strides, default_offset if offset is None else offset)
    if not all(type(v) is int for v in values):
        return None
    ints = [int(v) for v in values]  # type: ignore[call-overload]
    return Geometry(tuple(ints[: len(sizes)]), tuple(ints[len(sizes) : -1]), ints[-1])


def feeds_as_strided(node: torch.fx.Node) -> bool:
    """Whether an as_strided-family node reads ``node``'s result, directly or through others.

    Such a node reads the memory with strides meant for ``node``'s traced layout, which a copy
    standing in for ``node`` does not have.

    Example::

        >>> feeds_as_strided(windows)   # windows.as_strided((2, 2), (1, 1)) follows
        True
    """
    seen: set[torch.fx.Node] = set()
    todo = list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if as_strided_op(user) is not None:
            return True
        todo.extend(user.users)
    return False


def refuse_negative_request(op: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise eager PyTorch's own error for an as_strided-family call with a negative size or
    stride; return for any other call.

    Fake and meta tensors compute such a request's element count before checking it, and fail
    with "numel: integer multiplication overflow"; eager PyTorch refuses the request itself,
    in its own words, which this asks for with the same request on an empty tensor. Symbolic
    sizes are left to the ShapeEnv.

    Example::

        >>> refuse_negative_request(aten.as_strided.default, (x, [-1], [1]), {})
        RuntimeError: aten.as_strided.default with sizes [-1] and strides [1] is invalid:
        eager PyTorch raises "Storage size calculation overflowed with sizes=[-1] and strides=[1]"
    """
    if op not in AS_STRIDED_OPS:
        return
    assert isinstance(op, OpOverload)
    names = [argument.name for argument in op_schema(op).arguments]
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    size, stride = list(bound["size"]), list(bound["stride"])
    if not all(isinstance(v, int) for v in size + stride) or min(size + stride, default=0) >= 0:
        return
    try:
        with disable_current_modes():  # a real tensor, not a fake one of the trace's mode
            torch.empty(0).as_strided(size, stride, 0)
    except RuntimeError as eager:
        said = str(eager).strip().splitlines()[0]
        raise RuntimeError(
            f'{op} with sizes {size} and strides {stride} is invalid: eager PyTorch raises "{said}"'
        ) from None
