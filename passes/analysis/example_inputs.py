"""What the as_strided pass needs from its caller: example inputs that fit the graph, and the
trace-time tensor value of every as_strided input.

Example::

    >>> check_example_inputs(gm, torch.randn(4))
    TypeError: example_inputs must be a list or tuple of the graph's inputs, got Tensor
    >>> ensure_metadata(gm, as_strided_nodes, [torch.randn(4)])   # fills meta['val']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ..compat import torch_internals as internals
from ..compat.torch_internals import FakeTensorMode, graph_pytree_info
from ..device_faults import devices_of, raise_if_device_failed
from ..errors import FxViewsError


def check_example_inputs(gm: torch.fx.GraphModule, example_inputs: object) -> None:
    """Reject ``example_inputs`` that cannot be the graph's positional inputs, naming why.

    Example::

        >>> check_example_inputs(gm, torch.randn(4))
        TypeError: example_inputs must be a list or tuple of the graph's inputs, got Tensor
    """
    if example_inputs is None:
        return
    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(
            "example_inputs must be a list or tuple of the graph's inputs, got "
            f"{type(example_inputs).__name__}"
        )
    names, required = _graph_inputs(gm)
    if names is None:
        return  # *args or **kwargs take any number
    if not required <= len(example_inputs) <= len(names):
        wanted = str(len(names)) if required == len(names) else f"{required} to {len(names)}"
        raise FxViewsError(
            f"example_inputs has {len(example_inputs)} values but the graph takes {wanted} "
            f"inputs ({', '.join(names)})"
        )


def _graph_inputs(gm: torch.fx.GraphModule) -> tuple[list[str] | None, int]:
    """The names of the inputs a caller passes to ``gm`` and how many are required.

    None when the signature takes any number (``*args``). A graph traced from nested inputs
    (make_fx's pytree code) takes its original arguments, not one per placeholder.
    """
    info = graph_pytree_info(gm.graph)
    if info is not None and info.in_spec is not None:
        return list(info.orig_args), len(info.orig_args)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if any(str(p.target).startswith("*") for p in placeholders):
        return None, 0
    required = [p for p in placeholders if not p.args]  # a placeholder's args: its default
    return [p.name for p in placeholders], len(required)


def ensure_metadata(
    gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], example_inputs: Sequence[Any] | None
) -> None:
    """Make sure every as_strided input carries its trace-time tensor value.

    A value with symbolic sizes is metadata too: such nodes are kept later, with that reason.
    """

    def missing() -> object:
        return next((n.args[0] for n in nodes if not _has_tensor_value(n.args[0])), None)

    node = missing()
    if node is None:
        return
    if example_inputs is not None:
        try:
            # Parameters and constants of the module stay real: the mode must accept them.
            # Its dispatch cache would replay cached layouts (select_scatter at offset 0
            # where the kernel keeps its input's offset): layouts here are facts, so no cache.
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            mode.cache_enabled = False
            internals.FakeTensorProp(gm, mode=mode).propagate(*example_inputs)
        except (RuntimeError, TypeError, ValueError, IndexError) as err:
            # Fake mode runs ops on the module's real constants for real: the device may fail.
            raise_if_device_failed(err, devices_of(list(example_inputs)), "FakeTensorProp")
            # What ops raise on arguments that do not fit them: the inputs do not fit the graph.
            raise FxViewsError(
                f"could not compute tensor metadata for the graph from example_inputs: {err}"
            ) from err
        node = missing()
        if node is None:
            return
    raise FxViewsError(
        f"node {getattr(node, 'name', node)!r} feeds an as_strided but has no tensor metadata "
        "(meta['val']); trace with fxviews.trace or make_fx, or pass example_inputs so "
        "fxviews can compute it"
    )


def _has_tensor_value(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)
