"""Recognize as_strided-family calls in a graph, however spelled, and bind their arguments.

Example::

    >>> bind_as_strided(node)   # as_strided(clone_1, [6], [1], 0)
    {'storage_offset': 0, 'self': clone_1, 'size': [6], 'stride': [1]}
"""

from __future__ import annotations

from typing import Any

import torch.fx

from .graph_edits import arguments_by_name
from .op_tables import AS_STRIDED_OPS, TORCH_LEVEL_AS_STRIDED
from .torch_internals import OpOverload


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
