"""TODO"""

import functools
from typing import Any

import torch

from fxviews.passes.compat.torch_internals import storage_identity
from fxviews.passes.op_tables import AS_STRIDED_OPS
from fxviews.passes.schema import LAYOUT_READ, OFFSET_READ

__all__ = ["layout_bound_constants", "offset_bound_inputs"]


def offset_bound_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of ``gm``'s inputs whose storage offset the graph depends on: inputs an
    ``as_strided``-family node reads through a view, or whose offset Python read (see the Note).

    Example::

        >>> offset_bound_inputs(fxviews.trace(lambda x: x.as_strided((2,), (1,), 0), x))
        [0]
    """
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    storages = {_storage(node): i for i, node in enumerate(placeholders)}
    storages.pop(None, None)
    bound: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in AS_STRIDED_OPS:
            read = node.args[0]
        elif node.meta.get(OFFSET_READ):
            read = node
        else:
            continue
        position = storages.get(_storage(read)) if isinstance(read, torch.fx.Node) else None
        if position is not None:
            bound.add(position)
    return sorted(bound)


def layout_bound_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm`` holds (its ``get_attr`` constants: a module's parameters, a closed-over
    tensor) whose layout the graph depends on: an ``as_strided``-family node reads their memory
    through a view, or Python read their strides, contiguity or offset while it was traced.

    ``model.to(memory_format=torch.channels_last)`` swaps such a parameter's ``.data`` for
    another layout, under the same object: eager then reads other memory, or takes the other
    branch, so ``transform``'s guard holds these tensors' strides and offsets.

    Example::

        >>> w = torch.randn(4, 4)
        >>> layout_bound_constants(fxviews.trace(lambda x: x + w.as_strided((4,), (5,)), x))
        [tensor(...)]  # w
    """
    constants = [node for node in gm.graph.nodes if node.op == "get_attr"]
    storages = {_storage(node): node for node in constants}
    storages.pop(None, None)
    bound = {node for node in constants if node.meta.get(LAYOUT_READ)}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in AS_STRIDED_OPS:
            read = node.args[0]
            held = storages.get(_storage(read)) if isinstance(read, torch.fx.Node) else None
            if held is not None:
                bound.add(held)
    tensors: list[Any] = [
        functools.reduce(getattr, str(node.target).split("."), gm)
        for node in constants
        if node in bound
    ]
    return [t for t in tensors if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def _storage(node: torch.fx.Node) -> int | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    return storage_identity(value)
