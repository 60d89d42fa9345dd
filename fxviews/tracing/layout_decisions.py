"""The user's layout-deciding calls kept as themselves: ``reshape``, ``flatten``, ``contiguous``
decide view or copy when the graph runs, as eager does.

Note [Layout decisions at run time]
-----------------------------------
Some of PyTorch's composite ops decide from their input's strides whether their result shares
its memory: ``reshape`` (and ``flatten``, ``reshape_as``) is a ``view`` where the layout allows
one and a copy otherwise; ``ravel`` and ``contiguous`` return their input (or a view of it)
where it is contiguous and a copy otherwise; ``to(memory_format=...)`` returns its input where
that is already the input's format. Their kernels are CompositeImplicitAutograd: they run
above the dispatcher's Python key, so a trace (make_fx, or a recording) only sees the ops that
decision produced on the traced example: a ``view``, which raises on a layout it cannot view,
or nothing at all where the example was already contiguous. Run on another layout, or under
``vmap`` with the batch dim between two merged dims, such a graph raises where eager runs, or
writes into the caller's tensor where eager's copy would have kept it apart.

That happens wherever a graph runs on another layout than its trace's: under ``vmap``, where
``transform`` traces each sample as a contiguous tensor (Note [The layout of a call]), and in
the graphs ``trace`` and ``explain`` give. So while fxviews traces, a torch function mode
(:class:`LayoutDecisions`, entered around the traced function by :func:`deciding_at_run_time`)
watches the Python calls of those functions, the user's own and those of library code written
in Python (``nn.Flatten``, ``nn.functional``), and records each as its aten op:

1. The call runs as it would; the tracer records its decomposition, which gives the result's
   traced layout and value.
2. Where the call returned its very input (a no-op ``contiguous``), the result becomes a fresh
   ``alias`` of it: a tracer tells tensors apart by identity, and later ops on the result must
   reach the new node, not the input's.
3. A node of the composite op is added with the input's node as its argument (``reshape`` to
   the result's sizes for the reshape family, ``ravel``, ``contiguous``, ``to``), and the
   result is bound to it, so every later op reads the result through it. The decomposition's
   nodes, left without users, are erased once the trace ends (:func:`drop_decompositions`).
4. When the graph runs, the composite op decides view or copy on the layout it is given, and
   under ``vmap``, ``grad`` and ``jvp`` their own rules decide, per sample, as they decide for
   eager code. The node's ``meta[LAYOUT_DECISION]`` says what the traced layout gave;
   :func:`decision_records` makes the records ``explain`` and ``transform`` report.
5. Where the choice is observable (the result or its input is written afterwards, or it is
   returned aliasing an input) and the memory is a buffer the graph made, vmap's rules would
   lay that buffer out otherwise than eager lays out one sample's: layout pinning gives the
   buffer its traced layout (Note [Layout pinning]), so the call decides as on one sample.
   Over the caller's memory the caller's per-sample layout decides, as in eager.
6. A Python read of ``storage_offset()`` is noted on the node of the tensor read
   (``meta[OFFSET_READ]``): the graph then depends on that offset (Note [The layout of a call]
   in ``fxviews/tracing/samples.py``). Reads of ``stride()`` and ``is_contiguous()`` are noted
   too (``meta[LAYOUT_READ]``): an argument's strides are in ``transform``'s key, and a tensor
   the graph holds (a parameter) is guarded on its layout.

``contiguous`` and ``to`` are recorded for the contiguous format only: vmap cannot ask a sample
about another format (torch 2.13 raises "NYI: querying is_contiguous inside of vmap", as eager
``vmap`` does), and called directly a graph is traced on its arguments' own layout anyway.

Left as traced: calls on a tensor batched by a ``vmap`` inside the traced function (its
physical tensor holds the batch dim, and the decomposition is the batching rule's), calls
under ``functionalize`` (no aliasing is observable there, and the reshape step makes every
view a ``reshape``), and the composite ops PyTorch calls from C++ (``matmul``'s folding of
batch dims, ``linear``) or from autograd formulas: their results are fresh tensors, so their
decision is not observable, and the reshape step makes their merging views portable (Note
[ViewToReshape]).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch.overrides import TorchFunctionMode

from fxviews.passes.compat.torch_internals import (
    disable_proxy_modes_tracing,
    dispatch_modes,
    get_proxy_mode,
    get_proxy_slot,
    get_unwrapped,
    is_batchedtensor,
    is_functionaltensor,
    is_functorch_wrapped_tensor,
    last_node,
    no_torch_function,
    storage_identity,
    temporarily_clear_interpreter_stack,
    track_tensor_tree,
)
from fxviews.passes.graph_edits import describe_call
from fxviews.passes.schema import DECOMPOSITION_OF, LAYOUT_DECISION, LAYOUT_READ, OFFSET_READ
from fxviews.passes.source_lines import note_user_frames
from fxviews.tracing.recording import OpRecorder

__all__ = ["deciding_at_run_time", "drop_decompositions", "LayoutDecisions"]

aten = torch.ops.aten


class _Call(NamedTuple):
    """The aten call a layout-deciding Python call stands for, on its input (one of
    :data:`~fxviews.passes.op_tables.LAYOUT_DECIDING_OPS`)."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _reshape_to_result(
    x: torch.Tensor, out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Call:
    # flatten and reshape_as are reshape to their result's sizes (flatten of one dim returns its
    # input itself, where reshape gives a view: the same memory either way).
    return _Call(aten.reshape.default, (list(out.shape),), {})


def _ravel(
    x: torch.Tensor, out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Call:
    # ravel is contiguous().view(-1): a copy of a strided vector reshape would view.
    return _Call(aten.ravel.default, (), {})


def _contiguous(
    x: torch.Tensor, out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Call | None:
    # Only the contiguous format: vmap cannot ask a sample about another one (torch 2.13: "NYI:
    # querying is_contiguous inside of vmap"), eager vmap raises on it, and a call traced on its
    # argument's own layout (Note [The layout of a call]) decides as eager does directly.
    if kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format:
        return None
    return _Call(aten.contiguous.default, (), {})


def _to(
    x: torch.Tensor, out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Call | None:
    # Only ``to`` that may return its input decides by layout: same dtype and device, no copy
    # asked, and a memory format (not "preserve", which always returns the input): the
    # contiguous one, as for ``contiguous``.
    if kwargs.get("memory_format") != torch.contiguous_format:
        return None
    if out.dtype != x.dtype or out.device != x.device:
        return None
    flags = [arg for arg in args[1:] if isinstance(arg, bool)]  # non_blocking, copy
    if kwargs.get("copy", len(flags) > 1 and flags[1]):
        return None
    return _Call(aten.to.dtype_layout, (), {"memory_format": torch.contiguous_format})


#: The Python functions whose composite decides view or copy by layout, and the aten call
#: each stands for. tests/test_layout_decisions.py finds such ops among PyTorch's
#: CompositeImplicitAutograd kernels and checks every one it finds is here or not observable.
_DECIDERS: dict[Any, Callable[..., _Call | None]] = {
    torch.Tensor.reshape: _reshape_to_result,
    torch.reshape: _reshape_to_result,
    torch.Tensor.reshape_as: _reshape_to_result,
    torch.Tensor.flatten: _reshape_to_result,
    torch.flatten: _reshape_to_result,
    torch.Tensor.ravel: _ravel,
    torch.ravel: _ravel,
    torch.Tensor.contiguous: _contiguous,
    torch.Tensor.to: _to,
}

#: Every Python function :class:`LayoutDecisions` records as its aten op.
DECIDING_FUNCTIONS = frozenset(_DECIDERS)


class _Tracer(Protocol):
    """What :class:`LayoutDecisions` needs of the tracer running: the node of a tensor, and a
    new node bound to a result."""

    graph: torch.fx.Graph

    def node_for(self, tensor: torch.Tensor) -> torch.fx.Node | None: ...

    def add(self, call: _Call, source: torch.fx.Node, result: torch.Tensor) -> torch.fx.Node: ...


class _Recording:
    def __init__(self, recorder: OpRecorder) -> None:
        self.recorder = recorder
        self.graph = recorder.graph

    def node_for(self, tensor: torch.Tensor) -> torch.fx.Node | None:
        return self.recorder.node_for(tensor)

    def add(self, call: _Call, source: torch.fx.Node, result: torch.Tensor) -> torch.fx.Node:
        node = self.graph.call_function(call.op, (source, *call.args), call.kwargs)
        self.recorder.rebind(result, node)
        return node


class _MakeFx:
    def __init__(self, proxy_mode: Any) -> None:
        self.tracer = proxy_mode.tracer
        self.graph = self.tracer.graph

    def node_for(self, tensor: torch.Tensor) -> torch.fx.Node | None:
        slot = get_proxy_slot(tensor, self.tracer, None)
        return None if slot is None else slot.proxy.node

    def add(self, call: _Call, source: torch.fx.Node, result: torch.Tensor) -> torch.fx.Node:
        proxy = self.tracer.create_proxy(
            "call_function", call.op, (self.tracer.proxy(source), *call.args), call.kwargs
        )
        # As make_fx binds results: its mode off, and below fn's own torch.func transforms,
        # as make_fx's dispatch is: binding snapshots the value (a detach), which a level of
        # fn's grad or jvp would wrap, leaving the node a value with no storage to read.
        with disable_proxy_modes_tracing(), temporarily_clear_interpreter_stack():
            track_tensor_tree(result, proxy, constant=None, tracer=self.tracer)
        return proxy.node


def _active_tracer() -> _Tracer | None:
    """The tracer recording the ops now run: a recording, or make_fx (fake or real mode)."""
    for mode in reversed(dispatch_modes()):
        if isinstance(mode, OpRecorder):
            return _Recording(mode)
    proxy_mode = get_proxy_mode()
    return None if proxy_mode is None else _MakeFx(proxy_mode)


def _traced_tensor(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor the tracer sees for ``tensor`` (below grad and jvp wrappers); None where a
    level batches or functionalizes it (see the Note: left as traced)."""
    while is_functorch_wrapped_tensor(tensor):
        if is_batchedtensor(tensor) or is_functionaltensor(tensor):
            return None
        tensor = get_unwrapped(tensor)
    return tensor


class LayoutDecisions(TorchFunctionMode):
    """Records layout-deciding calls as their aten ops while fxviews traces (see the Note)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        decide = _DECIDERS.get(func)
        tracer = _active_tracer() if decide is not None else None
        if tracer is None:
            out = func(*args, **kwargs)
            if func in _LAYOUT_READS:
                _note_layout_read(args[0], offset=func is torch.Tensor.storage_offset)
            return out
        last = last_node(tracer.graph)  # the decomposition's nodes come after it
        out = func(*args, **kwargs)
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
            return out
        call = decide(x, out, args, kwargs) if x.layout == torch.strided else None
        inner_x = _traced_tensor(x)
        with no_torch_function():
            source = tracer.node_for(inner_x) if call and inner_x is not None else None
        if call is None or source is None:  # source None: a constant; its layout is fixed
            return out
        if out is x:  # returned its input: later ops on the result must reach a node of its own
            out = aten.alias.default(x)
        inner_out = _traced_tensor(out)
        if inner_out is None:
            return out
        decomposition = _nodes_after(last)
        with no_torch_function():  # the tracer's bookkeeping reads storages
            node = tracer.add(call, source, inner_out)
            node.meta[LAYOUT_DECISION] = _what_was_decided(
                inner_x, inner_out, decomposition, source
            )
        note_user_frames(node)
        for made in decomposition:
            made.meta[DECOMPOSITION_OF] = node.name
        return out


def _nodes_after(node: torch.fx.Node) -> list[torch.fx.Node]:
    made = []
    while node.next.op != "root":
        node = node.next
        made.append(node)
    return made


def _what_was_decided(
    x: torch.Tensor, out: torch.Tensor, decomposition: list[torch.fx.Node], source: torch.fx.Node
) -> tuple[str, str]:
    """What the traced layout gave: its kind of result, and the op that made it."""
    made = [
        n for n in decomposition if n.op == "call_function" and n.target is not aten.alias.default
    ]
    if not made:
        return "its input itself", source.name
    shared = storage_identity(x) == storage_identity(out)
    kind = "a view of its input" if shared else "a copy"
    return kind, describe_call(made[-1].target, made[-1].args, made[-1].kwargs)


#: The Python reads of a tensor's layout a graph depends on (item 6 of the Note).
_LAYOUT_READS = (torch.Tensor.storage_offset, torch.Tensor.stride, torch.Tensor.is_contiguous)


def _note_layout_read(tensor: Any, offset: bool) -> None:
    inner = _traced_tensor(tensor) if isinstance(tensor, torch.Tensor) else None
    tracer = _active_tracer() if inner is not None else None
    with no_torch_function():
        node = tracer.node_for(inner) if tracer is not None and inner is not None else None
    if node is not None:
        node.meta[LAYOUT_READ] = True
        node.meta[OFFSET_READ] = node.meta.get(OFFSET_READ, False) or offset


def deciding_at_run_time(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under :class:`LayoutDecisions`: give it to a tracer in place of ``fn``.

    Example::

        >>> gm = make_fx(deciding_at_run_time(lambda x: x.reshape(-1)))(torch.randn(2, 3))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
        [aten.view.default, aten.reshape.default]
        >>> drop_decompositions(gm); [n.target for n in gm.graph.nodes if n.op == "call_function"]
        [aten.reshape.default]
    """

    @functools.wraps(fn)  # make_fx names the graph's inputs after fn's parameters
    def deciding(*args: Any) -> Any:
        with LayoutDecisions():
            return fn(*args)

    return deciding


def drop_decompositions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` without the decomposition nodes :class:`LayoutDecisions` replaced and nothing
    reads (recompiled if any were erased)."""
    graph = gm.graph
    erased = False
    for node in reversed(list(graph.nodes)):
        if DECOMPOSITION_OF in node.meta and not node.users and not node.is_impure():
            graph.erase_node(node)
            erased = True
    if erased:
        gm.recompile()
    return gm
