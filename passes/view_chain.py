"""Chains of view ops: one representation for provenance, synthesis, verification and emission.

A chain is applied through an *evaluator* ``ev(op, *args)``: on meta tensors to verify it, and
as graph nodes to emit it, so what was verified is exactly what gets emitted.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .geometry import Geometry, equivalent
from .graph_edits import argument_nodes, arguments_by_name, describe_call, op_name
from .torch_internals import FakeTensor, OpOverload, no_dispatch, op_schema, storage_identity

aten = torch.ops.aten

Evaluator = Callable[..., Any]

#: The as_strided family the pass rewrites.
AS_STRIDED_OPS = (
    aten.as_strided.default,
    aten.as_strided_.default,
    aten.as_strided_copy.default,
    aten.as_strided_scatter.default,
)


#: In-place ops that change a tensor's sizes/strides (its metadata) rather than its values.
METADATA_MUTATIONS = {
    aten.as_strided_.default,
    aten.t_.default,
    aten.transpose_.default,
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.unsqueeze_.default,
    aten.swapdims_.default,
    aten.swapaxes_.default,
    aten.resize_.default,
    aten.resize_as_.default,
    aten.set_.source_Tensor,
}

# Torch-level spellings (symbolic_trace graphs) of the same ops: functions and method names.
_TORCH_LEVEL_AS_STRIDED = {
    torch.as_strided: aten.as_strided.default,
    torch.as_strided_copy: aten.as_strided_copy.default,
    torch.as_strided_scatter: aten.as_strided_scatter.default,
    "as_strided": aten.as_strided.default,
    "as_strided_": aten.as_strided_.default,
    "as_strided_scatter": aten.as_strided_scatter.default,
}


def as_strided_op(node: torch.fx.Node) -> OpOverload | None:
    """The aten as_strided-family op ``node`` calls, however it is spelled, or None."""
    if node.op == "call_function" and node.target in AS_STRIDED_OPS:
        return node.target
    if node.op in ("call_function", "call_method"):
        try:
            return _TORCH_LEVEL_AS_STRIDED.get(node.target)
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


#: The view ops a chain may hold: each re-indexes its input's memory and nothing else. Views
#: that also change what the memory means (``_conj``, ``_neg_view``, ``real``, ``view.dtype``,
#: ...) or bake in a layout (``as_strided``, ``_reshape_alias``) are not replayed; ``getitem``
#: picks from the list a split-like view returns.
LAYOUT_VIEWS = frozenset(
    {
        operator.getitem,
        aten.alias.default,
        aten.detach.default,
        aten.select.int,
        aten.slice.Tensor,
        aten.narrow.default,
        aten.diagonal.default,
        aten.unfold.default,
        aten.expand.default,
        aten.permute.default,
        aten.t.default,
        aten.transpose.int,
        aten.swapdims.default,
        aten.swapaxes.default,
        aten.movedim.int,
        aten.movedim.intlist,
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.unsqueeze.default,
        aten.view.default,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.tensor_split.sections,
        aten.tensor_split.indices,
        aten.chunk.default,
        aten.unbind.int,
    }
)


@dataclass(frozen=True)
class ViewStep:
    """One view op: ``op(x, *args)``; ``op`` is an aten OpOverload or ``operator.getitem``."""

    op: Callable[..., Any]
    args: tuple[Any, ...]

    def name(self) -> str:
        return op_name(self.op)  # aten.select.int -> select


ViewChain = tuple[ViewStep, ...]


def eager(op: Callable[..., Any], *args: Any) -> Any:
    """The evaluator that simply calls the op (on meta, fake or real tensors)."""
    return op(*args)


def apply_chain(chain: Sequence[ViewStep], x: Any, ev: Evaluator = eager) -> Any:
    """Apply ``chain`` to ``x`` through ``ev``."""
    for step in chain:
        x = ev(step.op, x, *step.args)
    return x


def describe_chain(chain: Sequence[ViewStep], input_name: str) -> str:
    """Readable nested call form, e.g. ``unsqueeze(select(x, 0, 0), 1)``."""
    text = input_name
    for step in chain:
        text = describe_call(step.op, (text, *step.args))
    return text


def verify_chain(chain: Sequence[ViewStep], source: Geometry, target: Geometry) -> bool:
    """Whether ``chain`` turns a tensor of geometry ``source`` into one equivalent to ``target``.

    Runs the chain on a meta tensor with the source's exact sizes, strides and offset. Every
    step must be one of :data:`LAYOUT_VIEWS` and the result must share the source's storage: a
    copy with the right geometry would read the right values but miss later writes through the
    view.
    """
    if not all(step.op in LAYOUT_VIEWS for step in chain):
        return False
    start = source.meta_tensor()
    try:
        out = apply_chain(chain, start)
    except (RuntimeError, IndexError):  # what a view op raises on a tensor it does not fit
        return False
    return (
        isinstance(out, torch.Tensor)
        and storage_identity(out) == storage_identity(start)
        and equivalent(Geometry.of(out), target)
    )


def is_view_op(op: Callable[..., Any]) -> bool:
    """Whether ``op`` returns an alias of its first argument without writing to it."""
    if op is operator.getitem:
        return True
    return isinstance(op, OpOverload) and _schema_is_view(op)


@functools.cache
def _schema_is_view(op: OpOverload) -> bool:
    # Cached: asked for every node of every graph, and an op's schema never changes.
    schema = op_schema(op)
    if not schema.arguments or not schema.returns:
        return False
    source_alias = schema.arguments[0].alias_info
    result_alias = schema.returns[0].alias_info
    return (
        source_alias is not None
        and not source_alias.is_write
        and result_alias is not None
        and not result_alias.is_write
    )


def replayable_step(node: torch.fx.Node) -> ViewStep | None:
    """The step ``node`` performs on its first argument, if it is a replayable view."""
    if node.op != "call_function" or not node.args or node.kwargs:
        return None
    if node.target not in LAYOUT_VIEWS:
        return None
    rest = node.args[1:]
    if argument_nodes(rest):
        return None
    if node.target is operator.getitem and not _picks_from_views(node.args[0]):
        return None
    return ViewStep(node.target, tuple(rest))


def _picks_from_views(parent: Any) -> bool:
    """``getitem`` is a view step only on the list a split-like view op returns.

    On a tensor (torch-level graphs) it is Python indexing, which copies for list indices.
    """
    return (
        isinstance(parent, torch.fx.Node)
        and isinstance(parent.meta.get("val"), (list, tuple))
        and parent.op == "call_function"
        and is_view_op(parent.target)
    )


def _in_one_fake_mode(vals: Sequence[Any]) -> list[Any]:
    """Bring fake tensors into the first one's mode: real-mode make_fx gives each node its own.

    Only the first argument's layout matters to a view or scatter op's output metadata, so the
    others are recreated with the same shape, strides, dtype and device.
    """
    mode = getattr(vals[0], "fake_mode", None) if vals else None
    if mode is None:
        return list(vals)
    out = [vals[0]]
    for val in vals[1:]:
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", mode) is not mode:
            with mode:
                val = torch.empty_strided(
                    val.shape, val.stride(), dtype=val.dtype, device=val.device
                )
        out.append(val)
    return out


def fake_view_value(op: Callable[..., Any], val: Any, *args: Any) -> Any:
    """``op(val, *args)`` for a layout view of a fake tensor, without a FakeTensorMode dispatch.

    None where that cannot be exactly what the dispatch would give; the caller dispatches then.

    Note [Fake values of emitted views]
    -----------------------------------
    A FakeTensorMode dispatch costs a fraction of a millisecond per op: on a graph with
    thousands of emitted views, most of the pass. A fake tensor is a wrapper whose data is a meta
    tensor, so with dispatch modes off the view op runs its own kernel on that meta tensor: the
    result has the op's exact sizes, strides and offset, and shares the input's storage (the
    storage identity alias checks compare). Wrapping it as a fake tensor of the input's mode and
    device gives what the dispatch returns: same geometry, dtype, device, storage and mode.
    Left to the dispatch: inputs that require grad (the dispatch returns a non-leaf with a
    grad_fn), fake constants (the dispatch computes the op on the constant too), symbolic
    geometry (the meta kernel would guard on it), and ops outside :data:`LAYOUT_VIEWS`.
    tests/test_pass.py compares both values on the differential corpora.

    Example::

        >>> fake_view_value(aten.select.int, fake_8x8, 0, 1).stride()
        (1,)
    """
    if not isinstance(op, OpOverload) or op not in LAYOUT_VIEWS:
        return None
    if type(val) is not FakeTensor or val.requires_grad or val.constant is not None:
        return None
    geometry = (*val.shape, *val.stride(), val.storage_offset())
    if not all(type(v) is int for v in geometry) or not _is_static(args):
        return None
    with no_dispatch():
        out = op(val, *args)
    if isinstance(out, torch.Tensor):
        return FakeTensor(val.fake_mode, out, val.device)
    return [FakeTensor(val.fake_mode, t, val.device) for t in out]  # split-like views: a list


def _is_static(args: Sequence[Any]) -> bool:
    """Whether a view op's arguments (ints, int lists, None) hold no symbolic value or tensor."""
    for arg in args:
        if isinstance(arg, (list, tuple)):
            if not _is_static(arg):
                return False
        elif isinstance(arg, (torch.SymInt, torch.SymBool, torch.Tensor)):
            return False
    return True


class GraphEmitter:
    """An evaluator that inserts ``op(*args)`` as graph nodes, with ``meta['val']`` filled in.

    Values for the new nodes are computed by running the op on the arguments' ``meta['val']``
    (fake or real tensors), so downstream passes see correct metadata; layout views of fake
    tensors take the cheaper, equal path of :func:`fake_view_value`.
    """

    def __init__(self, graph: torch.fx.Graph, like: torch.fx.Node) -> None:
        self.graph = graph
        self.like = like
        self.created: list[torch.fx.Node] = []

    def __call__(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(op, args, kwargs)
        vals, kwvals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta.get("val"))
        val = None if kwargs or not vals else fake_view_value(op, *vals)
        node.meta["val"] = op(*_in_one_fake_mode(vals), **kwvals) if val is None else val
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in self.like.meta:
                node.meta[key] = self.like.meta[key]
        self.created.append(node)
        return node
