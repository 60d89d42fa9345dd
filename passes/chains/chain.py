"""Chains of view ops: the one representation provenance, synthesis, verification and emission
share.

A chain is applied through an *evaluator* ``ev(op, *args)``: on meta tensors to verify it, and
as graph nodes to emit it, so what was verified is exactly what gets emitted.

Example::

    >>> chain = (ViewStep(aten.select.int, (0, 0)), ViewStep(aten.unsqueeze.default, (1,)))
    >>> describe_chain(chain, "x"), apply_chain(chain, torch.empty(2, 6)).shape
    ('unsqueeze(select(x, 0, 0), 1)', torch.Size([6, 1]))
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from ..graph_edits import argument_nodes, describe_call, op_name
from ..op_tables import LAYOUT_VIEWS, is_view_op

Evaluator = Callable[..., Any]


@dataclass(frozen=True)
class ViewStep:
    """One view op: ``op(x, *args)``; ``op`` is an aten OpOverload or ``operator.getitem``."""

    op: Callable[..., Any]
    args: tuple[Any, ...]

    def name(self) -> str:
        return op_name(self.op)  # aten.select.int -> select

    def apply(self, x: Any, ev: Evaluator) -> Any:
        """``op(x, *args)`` through ``ev``: one node when emitted."""
        return ev(self.op, x, *self.args)

    def describe(self, input_text: str) -> str:
        """The step applied to ``input_text``, as a reader writes it: ``select(x, 0, 0)``."""
        return describe_call(self.op, (input_text, *self.args))


ViewChain = tuple[ViewStep, ...]


def eager(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The evaluator that simply calls the op (on meta, fake or real tensors)."""
    return op(*args, **kwargs)


def apply_chain(chain: Sequence[ViewStep], x: Any, ev: Evaluator = eager) -> Any:
    """Apply ``chain`` to ``x`` through ``ev``."""
    for step in chain:
        x = step.apply(x, ev)
    return x


def describe_chain(chain: Sequence[ViewStep], input_name: str) -> str:
    """Readable nested call form, e.g. ``unsqueeze(select(x, 0, 0), 1)``."""
    text = input_name
    for step in chain:
        text = step.describe(text)
    return text


def replayable_step(node: torch.fx.Node) -> ViewStep | None:
    """The step ``node`` performs on its first argument, if it is a replayable view."""
    if node.op != "call_function" or not node.args or node.kwargs:
        return None
    target = node.target
    if not callable(target) or target not in LAYOUT_VIEWS:
        return None
    rest = node.args[1:]
    if argument_nodes(rest):
        return None
    if target is operator.getitem and not _picks_from_views(node.args[0]):
        return None
    return ViewStep(target, tuple(rest))


def _picks_from_views(parent: Any) -> bool:
    """``getitem`` is a view step only on the list a split-like view op returns.

    On a tensor (torch-level graphs) it is Python indexing, which copies for list indices.
    """
    return (
        isinstance(parent, torch.fx.Node)
        and isinstance(parent.meta.get("val"), (list, tuple))
        and parent.op == "call_function"
        and callable(parent.target)
        and is_view_op(parent.target)
    )
