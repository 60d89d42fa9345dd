"""Record a function's aten ops on one real sample: the fast first trace of ``transform``.

Note [Recording a real trace]
-----------------------------
make_fx in fake mode costs about half a millisecond per op (FakeTensor's Python dispatch, then
make_fx's proxy bookkeeping and its snapshot of every result), so a whole model's per-sample
gradient or jvp, a thousand ops, takes a second to trace where eager ``vmap`` runs it in tens
of milliseconds. ``transform`` traces on fresh tensors holding one sample's values, and one
sample's real compute is cheaper than fake dispatch for everything but huge programs, so it
first *records*:

1. **Run for real, record each op.** ``fn`` runs on real tensors under :class:`OpRecorder`, a
   dispatch mode at the bottom of every transform (it sees what make_fx sees: the aten ops
   ``grad``, ``jvp`` and autograd run). Each op becomes a ``call_function`` node whose tensor
   arguments are the nodes that produced them, found by tensor identity; a tensor the trace
   did not produce and whose storage it does not know is a constant (a closed-over parameter)
   held by the graph module by reference, as make_fx holds it. In-place ops return their
   argument, which then stands for the in-place node, as in make_fx. ``torch.tensor(data)``
   reaches a mode as ``lift_fresh`` of a new tensor of ``data``, returned as it is: it runs as
   ``lift_fresh_copy``, as make_fx records it, so the constant keeps ``data`` and each call
   gets a new tensor (not the constant, which ``fn`` would change in place or make require
   grad for every later call). What autograd does above
   the dispatcher is kept or refused by the watch the recording runs under (Note [What autograd
   sees is part of the trace]): a call it keeps as one node runs :meth:`OpRecorder.unrecorded`.
2. **Exact layouts for free.** Real results carry their true sizes, strides and storage
   offsets, so each node's ``meta["val"]`` is a FakeTensor of that exact layout over a meta
   storage shared by exactly the results that share a real storage (the engine reads aliasing
   from it). Real storages are kept alive until the recording ends, so no address is reused.
3. **Refuse whatever a recording could get wrong.** A real trace sees one sample's values, so
   anything that lets values leave the graph is refused: an op whose result *is* a value
   (``.item()``, ``equal``; tagged ``data_dependent_output``) or whose output shape depends on
   values (tagged ``dynamic_output_shape``; ``index`` only with a boolean mask, integer indices
   give a shape their own shapes fix), an op that may read values below the dispatcher (one
   neither aten's nor prims', or one that has no ``Meta`` kernel and does not give the same
   shapes when run on meta tensors: decided once per op), Python reading a tensor's memory
   without dispatch
   (``tolist``, ``numpy``, ``data_ptr``, the storage: :class:`ValueReads`), and a tensor that
   aliases the trace's memory but reached an op without passing through one
   (``nn.Parameter(t)``; ``.data`` is kept as a node by the watch): it would be recorded as a
   constant holding this sample. Sparse, nested and meta tensors
   are refused too, and so are forward AD's zero tangents (``_efficientzerotensor``): their
   own kernels run before any mode sees them. The caller's trace guard makes them dense
   zeros first, as in fake mode (Note [Zero tangents in fake mode]).

A refused or failed recording raises :class:`NotRecordable`; the caller then traces in fake
mode, which decides data dependence precisely (and says why a graph cannot capture it).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fxviews.passes.compat.torch_internals import (
    FakeTensor,
    FakeTensorMode,
    LazyGraphModule,
    TorchDispatchMode,
    disable_current_modes,
    efficient_zero_tensor,
    has_meta_kernel,
    no_torch_function,
    pytree,
    storage_identity,
    temporarily_clear_interpreter_stack,
)
from fxviews.passes.source_lines import note_user_frames
from fxviews.tracing.autograd import AutogradWatch
from fxviews.tracing.composite_calls import CompositeCalls

__all__ = [
    "NotRecordable",
    "OpRecorder",
    "ReadsMemory",
    "ValueReads",
    "below_torch_functions",
    "reads_values_into_shape",
    "record",
    "recorded_node",
    "shaped_by_metadata",
]


class NotRecordable(RuntimeError):
    """The recording cannot vouch for its graph: trace in fake mode instead."""


class ReadsMemory(NotRecordable):
    """The function reads tensor memory from Python (``tolist``, ``numpy``, ``data_ptr``): values
    leave the graph, as through ``.item()``, wherever fake mode fails on it. ``storage`` says
    whether what it read is the storage object itself (``untyped_storage``), which messages
    name apart: it is memory handed on (to ``set_``), not values."""

    def __init__(self, method: str) -> None:
        super().__init__(f"the function reads tensor memory from Python ({method})")
        self.storage = method in _STORAGE_READS


def record(
    call: Callable[..., Any], args: Sequence[torch.Tensor], mode: FakeTensorMode, held: int = 0
) -> torch.fx.GraphModule:
    """The graph of ``call(*args)`` recorded on the real tensors ``args`` (see the Note).

    ``mode`` makes the nodes' FakeTensor values; the last ``held`` of ``args`` are tensors
    ``call`` holds, not arguments (:class:`~fxviews.tracing.autograd.AutogradWatch`). Raises
    :class:`NotRecordable` where only a fake-mode trace can decide. The caller owns the rest of
    a trace's hygiene: random state, writes to closed-over tensors, forward AD's zero tangents.

    Example::

        >>> gm = record(lambda x: [x.t().sin()], [torch.ones(2, 3)], FakeTensorMode())
        >>> [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        ['aten.t.default', 'aten.sin.default']
    """
    recorder = OpRecorder(args, mode)
    autograd = AutogradWatch(recorder, held)  # Note [What autograd sees is part of the trace]
    active = _ACTIVE.set(recorder)
    try:
        # Note [Composite calls in a recording]: linear and matmul recorded whole.
        with ValueReads(), CompositeCalls(recorder), recorder:
            outputs = autograd.run(call, *args)
    finally:
        _ACTIVE.reset(active)
    return autograd.finish(recorder.graph_module(outputs))


#: The recorder running on this thread (for :func:`recorded_node`).
_ACTIVE: contextvars.ContextVar[OpRecorder | None] = contextvars.ContextVar(
    "fxviews_recorder", default=None
)


def recorded_node(tensor: torch.Tensor) -> torch.fx.Node | None:
    """The node the recording running now made for ``tensor`` (None if none records it), so
    code around an op can annotate it (the gathers of :mod:`fxviews.tracing.tensor_indices`)."""
    recorder = _ACTIVE.get()
    return recorder.node_made_for(tensor) if recorder is not None else None


def reads_values_into_shape(func: Any, args: Sequence[Any]) -> bool:
    """Whether ``func(*args)`` returns tensor values, or a shape that depends on them.

    Example::

        >>> mask = torch.tensor([True, False])
        >>> reads_values_into_shape(torch.ops.aten.index.Tensor, (torch.ones(2), [mask]))
        True
        >>> reads_values_into_shape(torch.ops.aten.index.Tensor, (torch.ones(2), [mask.long()]))
        False
    """
    tags = getattr(func, "tags", ())
    if torch.Tag.data_dependent_output in tags:
        return True
    if torch.Tag.dynamic_output_shape not in tags:
        return False
    if func.overloadpacket is torch.ops.aten.index and len(args) > 1:
        # index(self, indices): a boolean mask selects a value-dependent number of elements;
        # integer indices give a result shaped by their own shapes.
        return any(
            isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
            for index in args[1]
        )
    return True


#: Each op's verdict, once per process: whether its results are shaped by metadata alone.
_SHAPED_BY_METADATA: dict[Any, bool] = {}


def shaped_by_metadata(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> bool:
    """Whether ``func``'s results are shaped by its inputs' metadata alone, as in fake mode.

    An untagged op could still read values below the dispatcher, where no mode sees them. So
    an op is trusted only if it is aten's or prims' and has a ``Meta`` kernel (which cannot read
    values), or if, run once on meta tensors of this call's layouts, it gives this call's
    shapes (a kernel that reads values fails on meta, as it would in fake mode).

    Example::

        >>> x = torch.ones(2, 3)
        >>> shaped_by_metadata(torch.ops.aten.t.default, (x,), {}, x.t())
        True
    """
    verdict = _SHAPED_BY_METADATA.get(func)
    if verdict is None:
        verdict = _SHAPED_BY_METADATA[func] = _judge_on_meta(func, args, kwargs, out)
    return verdict


def _judge_on_meta(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> bool:
    if getattr(func, "namespace", None) not in ("aten", "prims"):
        return False  # a library's op: its fake implementation may size results by values
    if has_meta_kernel(func):
        return True

    def on_meta(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")

    try:
        meta_out = func(
            *_map_arguments(on_meta, args),
            **{name: _map_arguments(on_meta, value) for name, value in kwargs.items()},
        )
    except Exception:  # noqa: BLE001 - whatever it is, fake mode would not get past it either
        return False
    return _shapes(meta_out) == _shapes(out)


def _map_arguments(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to each leaf of an op argument (lists and tuples nest in aten schemas):
    pytree's generality, at a fraction of its cost per op."""
    if isinstance(value, (list, tuple)):
        return type(value)(_map_arguments(fn, item) for item in value)
    return fn(value)


def _shapes(value: Any) -> list[Any]:
    return [
        leaf.shape if isinstance(leaf, torch.Tensor) else type(leaf)
        for leaf in pytree.tree_leaves(value)
    ]


#: Tensor methods that read memory without dispatching an op a recording would see.
_MEMORY_READS = frozenset(
    {"tolist", "numpy", "__array__", "data_ptr", "untyped_storage", "storage", "_storage",
     "__dlpack__", "__reduce_ex__"}
)  # fmt: skip

#: Those among them that return the storage object.
_STORAGE_READS = frozenset({"untyped_storage", "storage", "_storage"})


class ValueReads(TorchFunctionMode):
    """Refuses Python reads of tensor memory that bypass the dispatcher while recording."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", None) in _MEMORY_READS:
            raise ReadsMemory(func.__name__)
        return func(*args, **(kwargs or {}))


def below_torch_functions(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A dispatch mode's ``__torch_dispatch__`` run with torch function handling off.

    An op reaches a dispatch mode with the trace's torch function modes popped when the
    function called it from Python. One that autograd's C++ dispatches itself (the ``detach``
    of a custom Function's output it saves for backward) comes with them still on, and the
    handler's own reads (``untyped_storage``, the result's meta twin) would meet them as the
    function's: the recording would refuse its own bookkeeping.
    """

    @functools.wraps(handler)
    def run(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with no_torch_function():
            return handler(self, func, types, args, kwargs)

    return run


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


class OpRecorder(TorchDispatchMode):
    """A dispatch mode that runs every op for real and records it as a graph node."""

    def __init__(self, inputs: Sequence[torch.Tensor], mode: FakeTensorMode) -> None:
        super().__init__()
        self.graph = torch.fx.Graph()
        self._fake_mode = mode
        self._nodes: dict[int, torch.fx.Node] = {}  # by id(tensor); tensors kept in _alive
        self._alive: list[torch.Tensor] = []
        # Real storage address -> (the real storage, kept alive; its meta twin for fakes).
        self._storages: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self._traced_storages: set[int] = set()
        self._constants: dict[str, torch.Tensor] = {}
        self._unrecorded = 0  # depth of unrecorded() blocks
        for position, tensor in enumerate(inputs):
            node = self.graph.placeholder(f"arg{position}_1")
            self._track(tensor, node)

    @below_torch_functions
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is _LIFT_FRESH:  # torch.tensor(data): Note [Recording a real trace], step 1
            func = torch.ops.aten.lift_fresh_copy.default
        if func is efficient_zero_tensor:
            raise NotRecordable("forward AD made a zero tangent")
        if reads_values_into_shape(func, args):
            raise NotRecordable(f"it calls {func}, whose result depends on tensor values")
        if self._unrecorded:  # inside a call kept as one node: checked, its memory known
            out = func(*args, **kwargs)
            self._traced_storages.update(
                storage_identity(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
            )
        else:
            node_args = _map_arguments(self._node_of, args)
            node_kwargs = {name: _map_arguments(self._node_of, v) for name, v in kwargs.items()}
            out = func(*args, **kwargs)
        if not shaped_by_metadata(func, args, kwargs, out):
            raise NotRecordable(f"it calls {func}, which fake mode cannot run on metadata alone")
        if self._unrecorded:
            return out
        node = self.graph.call_function(func, tuple(node_args), node_kwargs)
        note_user_frames(node)  # the user's source line, for messages about kept nodes
        self._bind_result(node, out)
        return out

    @contextlib.contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Run ops without recording them (still refusing what a recording refuses): the work
        of a call that :meth:`record_call` keeps as one node."""
        self._unrecorded += 1
        try:
            yield
        finally:
            self._unrecorded -= 1

    def record_call(
        self, target: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> None:
        """Record ``target(*args, **kwargs)``, which returned ``out``, as one node (a custom
        autograd.Function kept as itself: Note [What autograd sees is part of the trace]; a
        composite call: Note [Composite calls in a recording])."""
        with self._from_fn_side():
            node_args = _map_arguments(self._node_of, tuple(args))
            node_kwargs = {name: _map_arguments(self._node_of, v) for name, v in kwargs.items()}
            self._bind_result(self.graph.call_function(target, node_args, node_kwargs), out)

    def _bind_result(self, node: torch.fx.Node, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self._track(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = type(out)(self._track_item(node, i, o) for i, o in enumerate(out))
        else:
            node.meta["val"] = out

    def record_new_result(
        self, target: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> None:
        """:meth:`record_call` for a call whose schema returns new memory (a composite call kept
        whole); refused where ``out`` is not one tensor of memory none of its arguments holds."""
        arguments = {
            storage_identity(leaf)
            for leaf in pytree.tree_leaves((args, kwargs))
            if isinstance(leaf, torch.Tensor)
        }
        if not isinstance(out, torch.Tensor) or storage_identity(out) in arguments:
            raise NotRecordable(f"{target} returned memory one of its arguments holds")
        self.record_call(target, args, kwargs, out)

    @property
    def recording(self) -> bool:
        """Whether ops run now are recorded (not inside an :meth:`unrecorded` block)."""
        return self._unrecorded == 0

    def node_made_for(self, tensor: torch.Tensor) -> torch.fx.Node | None:
        """The node recorded for ``tensor``, None if the recording has not seen it."""
        return self._nodes.get(id(tensor))

    def graph_module(self, outputs: Any) -> torch.fx.GraphModule:
        """The recorded graph returning ``outputs`` (a flat list), constants held by reference."""
        self.graph.output(_map_arguments(self._node_of, outputs))
        root = torch.nn.Module()
        for name, tensor in self._constants.items():
            setattr(root, name, tensor)
        gm = LazyGraphModule(root, self.graph)  # code is generated once, after the rewrite
        self._alive.clear()
        self._storages.clear()
        return gm

    def node_for(self, tensor: torch.Tensor) -> torch.fx.Node:
        """The node standing for ``tensor`` (a constant's ``get_attr`` the first time)."""
        with self._from_fn_side():
            return self._node_of(tensor)

    def rebind(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        """Make ``node`` (added to :attr:`graph` by the caller) stand for ``tensor``, a result of
        an op recorded already: later ops read it through ``node`` (Note [Layout decisions at
        run time])."""
        with self._from_fn_side():
            self._bind(tensor, node)

    @contextlib.contextmanager
    def _from_fn_side(self) -> Iterator[None]:
        """For the bookkeeping of :meth:`record_call`, :meth:`node_for` and :meth:`rebind`,
        which the tracer calls from ``fn``'s side, not from this mode's handler: below every
        torch function and dispatch mode (or the recording would refuse its own storage reads
        as ``fn``'s, and record the meta tensors it makes as ``fn``'s ops), and outside
        ``fn``'s own ``torch.func`` transforms (a level of ``fn``'s ``grad`` would wrap those
        meta tensors, and a node's value would be a wrapper with no storage)."""
        with no_torch_function(), disable_current_modes(), temporarily_clear_interpreter_stack():
            yield

    def _track_item(self, node: torch.fx.Node, index: int, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        item = self.graph.call_function(operator.getitem, (node, index))
        return self._track(value, item)

    def _track(self, tensor: torch.Tensor, node: torch.fx.Node) -> FakeTensor:
        """Bind a tensor the trace made (or an input) to its node; its memory is the trace's."""
        self._traced_storages.add(storage_identity(tensor))
        return self._bind(tensor, node)

    def _bind(self, tensor: torch.Tensor, node: torch.fx.Node) -> FakeTensor:
        self._nodes[id(tensor)] = node
        self._alive.append(tensor)
        node.meta["val"] = fake = self._fake_of(tensor)
        return fake

    def _node_of(self, value: Any) -> Any:
        """The node standing for ``value`` (a constant's ``get_attr`` the first time)."""
        if not isinstance(value, torch.Tensor):
            return value
        node = self._nodes.get(id(value))
        if node is not None:
            return node
        if storage_identity(value) in self._traced_storages:
            raise NotRecordable(
                "a tensor aliasing the trace's memory reached an op, made by none the recording saw"
            )
        name = f"_tensor_constant{len(self._constants)}"
        self._constants[name] = value
        node = self.graph.get_attr(name)
        self._bind(value, node)
        return node

    def _fake_of(self, tensor: torch.Tensor) -> FakeTensor:
        """A FakeTensor with ``tensor``'s exact layout, over the meta twin of its storage."""
        if tensor.layout != torch.strided or tensor.is_nested or tensor.device.type == "meta":
            raise NotRecordable(f"it makes a {tensor.layout} tensor on {tensor.device}")
        address = storage_identity(tensor)
        if address not in self._storages:
            storage = tensor.untyped_storage()
            twin = torch.UntypedStorage(storage.nbytes(), device="meta")
            self._storages[address] = (storage, twin)
        twin = self._storages[address][1]
        meta = torch.empty(0, dtype=tensor.dtype, device="meta")
        meta.set_(twin, tensor.storage_offset(), tensor.shape, tensor.stride())
        return FakeTensor(self._fake_mode, meta, tensor.device)
