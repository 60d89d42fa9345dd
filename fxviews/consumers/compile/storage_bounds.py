"""Reads past a storage: a kept as_strided raises where eager's does, whatever compiles it.

Note [Reads past the storage]
-----------------------------
Eager ``as_strided`` refuses a view whose furthest element lies past its storage ("setStorage:
... out of bounds for storage of size ..."). Inductor lowers an ``as_strided`` as a
reinterpretation of its input's buffer without that check, so a compiled function returns
whatever memory lies there (pytorch #195665), different on every run. The engine keeps such a
node (it reads memory its input does not expose), so the backend must keep eager's check:

- **memory the graph makes** (``torch.full(...)`` then ``as_strided``): its size is a fact of
  the graph, so a request past it fails on every call in eager. The backend runs Dynamo's graph
  as eager PyTorch, which raises eager's error on every call.
- **memory of a graph input** (or a view of one): its storage may be larger than the input
  (a slice of a bigger tensor), and Dynamo's guards do not check storage sizes, so the check
  is made on each call, before the compiled graph runs: a Python comparison of the argument's
  storage size with the furthest element the request reads, raising eager's error.

Only static requests over inputs of static sizes are checked; a symbolic one is left to the
aten graphs' stage, which rewrites it asserting its bounds where it can (documented).

Example::

    >>> needs, reason = storage_needs(gm)    # gm: x.as_strided((4,), (2,)) of an input x
    >>> needs[0].position, needs[0].request.storage_extent()
    (0, 7)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from fxviews.passes.analysis.as_strided_calls import as_strided_op, static_request
from fxviews.passes.compat.torch_internals import FakeTensor, storage_identity
from fxviews.passes.geometry.concrete import Geometry
from fxviews.passes.source_lines import describe_node


@dataclass(frozen=True)
class StorageNeed:
    """A kept as_strided over graph input ``position``'s storage: what it asks for."""

    position: int
    node: str
    request: Geometry
    itemsize: int

    def check(self, argument: torch.Tensor) -> None:
        """Raise eager's error where ``argument``'s storage is too small for the request."""
        available, needed = argument.untyped_storage().nbytes(), self.request.storage_extent()
        if available < needed * self.itemsize:
            r = self.request
            raise RuntimeError(
                f"setStorage: sizes {list(r.sizes)}, strides {list(r.strides)}, storage offset "
                f"{r.offset}, and itemsize {self.itemsize} requiring a storage size of "
                f"{needed * self.itemsize} are out of bounds for storage of size {available} "
                f"(the as_strided node {self.node}, as eager PyTorch raises)"
            )


def storage_needs(gm: torch.fx.GraphModule) -> tuple[list[StorageNeed], str | None]:
    """The storage each kept as_strided of Dynamo's graph ``gm`` needs of a graph input, and
    why the graph reads past memory it makes itself (None if it does not); see the Note."""
    inputs = {
        storage_identity(value): position
        for position, node in enumerate(gm.graph.find_nodes(op="placeholder"))
        if isinstance(value := node.meta.get("example_value"), torch.Tensor) and _strided(value)
    }
    needs = []
    for node in gm.graph.nodes:
        source = node.args[0] if as_strided_op(node) is not None and node.args else None
        if not isinstance(source, torch.fx.Node):
            continue
        value = source.meta.get("example_value")
        if type(value) is not FakeTensor or not _strided(value) or _static(value) is None:
            continue  # under a torch.func transform, not strided, or symbolic: left as it is
        request = static_request(node, value.storage_offset())  # omitted: the input's
        if request is None:
            continue
        storage = storage_identity(value)
        if storage in inputs:
            itemsize = value.element_size()
            needs.append(StorageNeed(inputs[storage], describe_node(node), request, itemsize))
            continue
        held = _allocated(source, storage)
        if held is not None and request.storage_extent() > held:
            return needs, (
                f"{describe_node(node)} reads past the storage the graph made for its input "
                f"({request.storage_extent()} elements of {held}): eager PyTorch raises on "
                "every call, and a compiled as_strided would read other memory "
                "(pytorch #195665)"
            )
    return needs, None


def with_storage_checks(
    compiled: Callable[..., Any], needs: list[StorageNeed]
) -> Callable[..., Any]:
    """``compiled``, checking each of ``needs`` on its arguments first (none: ``compiled``)."""
    if not needs:
        return compiled

    @functools.wraps(compiled)
    def checked(*args: Any) -> Any:
        for need in needs:
            need.check(args[need.position])
        return compiled(*args)

    return checked


def _allocated(node: torch.fx.Node, storage: int) -> int | None:
    """Elements of the storage the graph made for ``node``: the extent of the node that made
    it (a fresh tensor is as large as it reaches), found up the views of its first argument.
    The fake storage itself cannot tell: a fake ``as_strided`` grows it to what it reads."""
    while node.args and isinstance(parent := node.args[0], torch.fx.Node):
        value = parent.meta.get("example_value")
        if not isinstance(value, torch.Tensor) or storage_identity(value) != storage:
            break
        node = parent
    made = node.meta.get("example_value")
    if not isinstance(made, torch.Tensor) or node.op == "placeholder":
        return None
    g = _static(made)
    return None if g is None else g.storage_extent()


def _static(value: torch.Tensor) -> Geometry | None:
    g = Geometry.of(value)
    return g if all(type(v) is int for v in (*g.sizes, *g.strides, g.offset)) else None


def _strided(value: torch.Tensor) -> bool:
    return value.layout == torch.strided
