"""Keep ``.item()`` values that only feed tensor ops as 0-dim tensors, so ``vmap`` can batch them.

Note [Scalars used as tensor values]
------------------------------------
``s = x.abs().max().item(); y = x / s`` traces (fake mode) into
``_local_scalar_dense(max)`` feeding ``div.Tensor(x, s)``: one graph for every value, since
``s`` reaches no shape and no branch. But ``vmap`` cannot batch ``_local_scalar_dense`` (a
Python number has no batch dim), so the graph, like eager ``vmap``, would fail under ``vmap``
although each sample's program is fine. Where the number only ever feeds tensor arguments,
the 0-dim tensor it was read from can feed them instead:

1. Take each ``_local_scalar_dense(t)`` none of whose users is the graph's output.
2. For each user, the argument positions holding the number must be ``Tensor`` in the
   user's schema (``mul.Tensor``, ``div.Tensor``, ``add.Tensor``, ...: make_fx records those
   overloads for ``tensor * number``), and every other argument must be a tensor, a constant
   or a node with a tensor value.
3. ``.item()`` cuts autograd and forward AD, so the stand-in is ``detach(t)``. The user is
   run on fake values with the stand-in in place of the number; its result must have the
   dtype, shape and strides it had with the number (type promotion treats a Python number
   and a 0-dim tensor of a higher category differently: ``int_tensor * float_item``), or the
   node is left as it was.
4. Only when every user passes are they all rewired to ``detach(t)`` and the
   ``_local_scalar_dense`` node removed: a number also used elsewhere (a Python ``float``
   operation, a size) stays a number, and the graph keeps what eager does.

The values are the same: the kernels convert a Python number to the computation's dtype,
and a 0-dim operand of the same or a lower category the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from fxviews.passes.compat.torch_internals import OpOverload, local_scalar_dense, op_schema, pytree
from fxviews.passes.device_faults import devices_of, raise_if_device_failed

__all__ = ["keep_item_values_as_tensors"]

_aten = torch.ops.aten


def keep_item_values_as_tensors(gm: torch.fx.GraphModule) -> int:
    """Rewire ``.item()`` numbers that only feed tensor arguments to their 0-dim tensors.

    Returns how many ``_local_scalar_dense`` nodes were replaced; the caller recompiles.

    Example::

        >>> gm = fxviews.trace(lambda x: x / x.abs().max().item(), torch.randn(4))
        >>> keep_item_values_as_tensors(gm)
        1
        >>> gm.recompile(); torch.func.vmap(gm)(torch.randn(3, 4)).shape
        torch.Size([3, 4])
    """
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.target is not local_scalar_dense or not node.users:
            continue
        source = node.args[0]
        stand_in_value = _detached_value(source)
        if stand_in_value is None:
            continue
        if not all(_same_result_with(user, node, stand_in_value) for user in node.users):
            continue
        with gm.graph.inserting_after(node):
            stand_in = gm.graph.call_function(_aten.detach.default, (source,))
        stand_in.meta["val"] = stand_in_value
        node.replace_all_uses_with(stand_in)
        gm.graph.erase_node(node)
        replaced += 1
    return replaced


def _detached_value(source: Any) -> torch.Tensor | None:
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        return None
    return value.detach()


def _same_result_with(
    user: torch.fx.Node, number: torch.fx.Node, stand_in_value: torch.Tensor
) -> bool:
    """Whether ``user`` takes a tensor where it takes ``number`` and gives the same dtype,
    shape and strides with ``stand_in_value`` there (Note, steps 2 and 3)."""
    if user.op != "call_function" or not isinstance(user.target, OpOverload):
        return False
    schema = op_schema(user.target)
    passed = list(zip(schema.arguments, user.args, strict=False))
    passed += [(a, user.kwargs[a.name]) for a in schema.arguments if a.name in user.kwargs]
    as_tensor = [isinstance(a.type, torch.TensorType) for a, value in passed if value is number]
    uses = sum(leaf is number for leaf in pytree.tree_leaves((user.args, user.kwargs)))
    if not all(as_tensor) or len(as_tensor) != uses:  # a number in a list is a size or so
        return False

    def value_of(arg: Any) -> Any:
        if arg is number:
            return stand_in_value
        if isinstance(arg, torch.fx.Node):
            return arg.meta.get("val")
        return arg

    args, kwargs = pytree.tree_map(value_of, (user.args, user.kwargs))
    values = pytree.tree_leaves((args, kwargs))
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in values):
        return False  # another traced number: its value is unknown here
    expected = user.meta.get("val")
    try:
        result = user.target(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure keeps the number (Note, step 3)
        # Fake values run no kernel; a real constant among the arguments does, on its device.
        raise_if_device_failed(err, devices_of(values), f"{user.name}'s kernel")
        return False
    if not isinstance(expected, torch.Tensor) or not isinstance(result, torch.Tensor):
        return False
    return (result.dtype, result.shape, result.stride()) == (
        expected.dtype,
        expected.shape,
        expected.stride(),
    )
