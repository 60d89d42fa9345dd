"""Emission: an evaluator that turns a chain's steps into graph nodes with metadata.

Example::

    >>> emit = GraphEmitter(graph, like=as_strided_node)
    >>> with graph.inserting_before(as_strided_node):
    ...     out = apply_chain(chain, as_strided_node.args[0], emit)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx

from .fake_modes import in_one_fake_mode


class GraphEmitter:
    """An evaluator that inserts ``op(*args)`` as graph nodes, with ``meta['val']`` filled in.

    Values for the new nodes are computed by running the op on the arguments' ``meta['val']``
    (fake or real tensors), so downstream passes see correct metadata.
    """

    def __init__(self, graph: torch.fx.Graph, like: torch.fx.Node) -> None:
        self.graph = graph
        self.like = like
        self.created: list[torch.fx.Node] = []

    def __call__(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(op, args, kwargs)
        vals, kwvals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta.get("val"))
        node.meta["val"] = op(*in_one_fake_mode(vals), **kwvals)
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in self.like.meta:
                node.meta[key] = self.like.meta[key]
        self.created.append(node)
        return node
