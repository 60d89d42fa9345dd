"""The values the backend proves rewrites of Dynamo's graph against, per sample under vmap.

Note [Per-sample values of Dynamo's graph]
------------------------------------------
Dynamo's graph (torch IR) records each node's example value in ``meta["example_value"]``. The
engine proves a rewrite against ``meta["val"]`` of the as_strided's input, so this module puts
there the layout the rewrite means (Note [The backend's first stage] in ``dynamo_stage.py``):

1. **Outside every torch.func transform** a node's value is its example value: the layout of
   the call, Dynamo's guards hold the inputs to it, and layout truth checks the layouts fake
   kernels computed (Note [Layouts are facts to check]).
2. **Inside a vmap region** (``_add_batch_dim(x, bdim, level)`` ... ``_remove_batch_dim``)
   the example values are batched tensors: the per-sample sizes with the *physical* strides
   vmap gives each sample, which depend on where the caller's batch dim lies in memory. The
   rewrite means the per-sample loop instead, as ``vmap(fxviews.transform(f))`` does: each
   sample is a fresh contiguous tensor. So ``_add_batch_dim`` gets a fresh contiguous value of
   the per-sample shape, stated a fact (``LayoutFact(trusted=True)``: the semantics define it);
   a nested ``_remove_batch_dim``, which the loop makes with ``torch.stack``, a fresh
   contiguous value of the stacked shape, also a fact; and every other node whose example
   value is batched the result of its own call on its arguments' per-sample values, computed
   in the graph's fake mode (no guard is added). Layout truth then checks those fake layouts
   against the eager kernels run on the per-sample layouts, as for any other graph.
3. **Values a transform passes through** (``_wrap_for_grad``, ``_unwrap_for_grad``,
   ``_set_tensor_requires_grad``, ``_make_dual``) have their argument's value and layout
   (``LayoutFact(same_as=...)``). Inside grad or jvp regions without vmap the example values
   are wrappers with the layout of the tensor they wrap: that tensor's fake value stands in.
4. **What no kernel run can check**: a gradient ``autograd.grad`` returns (its value is
   computed by fake autograd from the per-sample values, ``_set_tensor_requires_grad`` giving
   them ``requires_grad``), a dual's parts, and a top-level ``_remove_batch_dim`` (vmap's
   layout of the batched result) are stated unknown to layout truth
   (``LayoutFact(unknown=...)``): an as_strided reading them is kept, and the stage decides
   what vmap's own reading of it means. Where even the value cannot be computed (a call on
   such a value, or one that fails on the per-sample values), the node gets a value with the
   layout vmap gives each sample and is in :attr:`DynamoValues.unknown`.

Every node whose value is per sample is in :attr:`DynamoValues.batched`, with the geometry vmap
gives each of its samples in :attr:`DynamoValues.physical`. :func:`clear_values` removes what
:func:`assign_values` added, so the graph goes on to AOTAutograd as Dynamo left it.

Example::

    >>> values = assign_values(gm)   # gm: torch.compile(vmap(windows, in_dims=1)) 's graph
    >>> [n.name for n in values.batched]
    ['_add_batch_dim', 'batched_outputs']
    >>> values.physical[add_batch_dim_node].stride(), add_batch_dim_node.meta["val"].stride()
    ((4,), (1,))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from fxviews.passes.analysis.as_strided_calls import as_strided_op
from fxviews.passes.compat.fake_modes import no_new_guards
from fxviews.passes.compat.torch_internals import (
    FakeTensor,
    dynamo_functorch_calls,
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    pytree,
)
from fxviews.passes.schema import LAYOUT_FACT, LayoutFact

#: Node.meta keys this module sets; :func:`clear_values` removes them again.
_ADDED = ("val", LAYOUT_FACT)


@dataclass
class DynamoValues:
    """What :func:`assign_values` found: the nodes whose values are per sample of a vmap level,
    each with a fake value of the layout vmap gives its samples."""

    batched: set[torch.fx.Node] = field(default_factory=set)
    physical: dict[torch.fx.Node, torch.Tensor] = field(default_factory=dict)
    #: Batched nodes whose per-sample layout is not known (see Note, 4), and every node whose
    #: value passes theirs through or is computed from them.
    unknown: set[torch.fx.Node] = field(default_factory=set)
    #: Nodes that already had a ``meta["val"]`` (left as they were by clear_values).
    had_values: set[torch.fx.Node] = field(default_factory=set)


def assign_values(gm: torch.fx.GraphModule) -> DynamoValues:
    """Put in each node's ``meta["val"]`` the value a rewrite of Dynamo's graph is proven
    against (see Note [Per-sample values of Dynamo's graph]); in place."""
    roles = {id(fn): role for role, fn in dynamo_functorch_calls().items()}
    needed = _read_by_as_strided(gm.graph)
    values = DynamoValues()
    for node in gm.graph.nodes:
        if "val" in node.meta:
            values.had_values.add(node)
            continue
        example = node.meta.get("example_value")
        role = roles.get(id(node.target)) if node.op == "call_function" else None
        batched = _holds_batched(example)
        if batched:
            values.batched.add(node)
        if not batched and role is None:
            node.meta["val"] = _unwrapped(example)
        elif node in needed:  # computing a per-sample value costs a fake call: only these
            if batched and isinstance(example, torch.Tensor):
                values.physical[node] = _plain_like(example)
            node.meta["val"], fact, known = _per_sample(node, role, example, values.unknown)
            if fact is not None:
                node.meta[LAYOUT_FACT] = fact
            if not known:
                values.unknown.add(node)
    return values


def _read_by_as_strided(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The as_strided-family nodes and every node they read, directly or through others."""
    needed: set[torch.fx.Node] = set()
    todo = [n for n in graph.nodes if as_strided_op(n) is not None]
    while todo:
        node = todo.pop()
        if node not in needed:
            needed.add(node)
            todo.extend(node.all_input_nodes)
    return needed


def clear_values(gm: torch.fx.GraphModule, values: DynamoValues) -> None:
    """Remove what :func:`assign_values` added (and the values of nodes emitted since)."""
    for node in gm.graph.nodes:
        if node not in values.had_values:
            for key in _ADDED:
                node.meta.pop(key, None)


def _per_sample(
    node: torch.fx.Node, role: str | None, example: Any, unknown: set[torch.fx.Node]
) -> tuple[Any, LayoutFact | None, bool]:
    """A node's value, what is known of its layout, and whether the value has the layout the
    per-sample loop gives it (as far as fake kernels tell; False: vmap's layout stands in)."""
    args = node.args
    batched = _holds_batched(example)
    # The example value of a batch dim put on or taken off has the shape the loop's sample or
    # stack has (the batch dim itself may be a symbolic argument).
    if role == "add_batch_dim" or (role == "remove_batch_dim" and batched):
        return _fresh(example), LayoutFact(trusted=True), True
    if role == "remove_batch_dim":  # leaving the outermost vmap: vmap's own layout
        return _unwrapped(example), LayoutFact(unknown=_VMAP_LAYOUT), True
    if role in _PASSED_THROUGH and isinstance(args[0], torch.fx.Node):
        value = _val(args[0])
        if role == "set_tensor_requires_grad" and isinstance(value, FakeTensor):
            with value.fake_mode:  # the gradient's value is computed from it (see Note, 4)
                value = value.detach().requires_grad_()
        return value, LayoutFact(same_as=args[0]), args[0] not in unknown
    if role in _UNCHECKABLE:
        computed = _unwrapped(example) if not batched else _run(node, unknown)
        fact = LayoutFact(unknown=_UNCHECKABLE[role])
        if computed is None:
            return pytree.tree_map(_plain_like, example), fact, False
        return computed, fact, True
    if not batched:  # a wrapper of grad or jvp alone: the tensor it wraps
        return _unwrapped(example), None, True
    computed = _run(node, unknown)
    if computed is None:
        return pytree.tree_map(_plain_like, example), LayoutFact(unknown=_NOT_COMPUTED), False
    return computed, None, True


_PASSED_THROUGH = ("wrap_for_grad", "unwrap_for_grad", "set_tensor_requires_grad", "make_dual")
#: Calls whose results' layouts no eager kernel run can check: gradients (the backward
#: kernels' layouts) and a dual's parts (forward AD's).
_UNCHECKABLE = {
    "autograd_grad": "a gradient, whose layout the backward kernels give; no eager run checks it",
    "unpack_dual": "a dual's primal and tangent, whose layouts forward AD gives",
}
_VMAP_LAYOUT = "vmap's own layout of a batched result, which no kernel run can check"
_NOT_COMPUTED = (
    "its per-sample value under vmap could not be computed: a call on a value of unknown layout, "
    "or one that fails on the per-sample values"
)


def _run(node: torch.fx.Node, unknown: set[torch.fx.Node]) -> Any:
    """``node``'s call on its arguments' per-sample values, or None where that fails or an
    argument's layout is unknown (a call on it may give any)."""
    if any(a in unknown for a in node.all_input_nodes):
        return None
    if any(_val(a) is None for a in node.all_input_nodes):
        return None  # an argument not needed before (no per-sample value computed)
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _val)
    target = _callable(node)
    if target is None:
        return None
    tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, FakeTensor)]
    if not tensors:
        return None
    mode = tensors[0].fake_mode
    try:
        with mode, no_new_guards(tensors[0]):
            result = target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure leaves the value unknown (see Note, 4)
        return None
    leaves = pytree.tree_leaves(result)
    if any(isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor) for v in leaves):
        return None
    return result


def _callable(node: torch.fx.Node) -> Callable[..., Any] | None:
    if node.op == "call_function" and callable(node.target):
        return node.target  # type: ignore[return-value]
    if node.op == "call_method" and isinstance(node.target, str):
        name = node.target
        return lambda owner, *a, **k: getattr(owner, name)(*a, **k)
    return None


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def grad_over_vmap(value: Any) -> bool:
    """Whether ``value`` is a tensor a grad level wraps above a vmap level: its backward runs
    under vmap (``vmap(grad(f))``).

    Example::

        >>> grad_over_vmap(diff_args.meta["example_value"])   # vmap(grad(f))'s input to f
        True
    """
    if not isinstance(value, torch.Tensor) or not is_functorch_wrapped_tensor(value):
        return False
    return not is_batchedtensor(value) and _holds_batched(get_unwrapped(value))


def _holds_batched(value: Any) -> bool:
    """Whether ``value`` holds a tensor batched by a vmap level (under any wrappers)."""
    for leaf in pytree.tree_leaves(value):
        tensor = leaf
        while isinstance(tensor, torch.Tensor) and is_functorch_wrapped_tensor(tensor):
            if is_batchedtensor(tensor):
                return True
            tensor = get_unwrapped(tensor)
    return False


def _unwrapped(value: Any) -> Any:
    """``value`` with every functorch wrapper (grad or jvp levels) replaced by the fake tensor
    it wraps, which has the same layout."""

    def unwrap(leaf: Any) -> Any:
        while isinstance(leaf, torch.Tensor) and is_functorch_wrapped_tensor(leaf):
            leaf = get_unwrapped(leaf)
        return leaf

    return pytree.tree_map(unwrap, value)


def _plain_like(value: Any) -> Any:
    """A fake tensor with ``value``'s sizes, strides and offset (the layout vmap gives each
    sample of a batched one); anything else as is."""
    if not isinstance(value, torch.Tensor):
        return value
    inner = _unwrapped(value)
    mode = inner.fake_mode
    extent = (
        1
        + value.storage_offset()
        + sum((s - 1) * abs(t) for s, t in zip(value.shape, value.stride(), strict=True))
    )
    with mode, no_new_guards(inner):
        storage = torch.empty(extent, dtype=value.dtype, device=value.device)
        return storage.as_strided(value.shape, value.stride(), value.storage_offset())


def _fresh(like: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous fake tensor of ``like``'s shape, dtype and device."""
    inner = _unwrapped(like)
    with inner.fake_mode, no_new_guards(inner):
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
