"""``fxviews.trace``: capture a function as an aten-level GraphModule, wherever eager runs it.

Note [One tracing path]
-----------------------
``trace``, ``explain`` and ``transform`` all get their graph from :func:`capture`:

0. **A recording, for fresh traces on real values** (``transform``): ``fn`` runs for real on one
   sample under a mode that records each op (Note [Recording a real trace]), several times
   cheaper than make_fx in fake mode. What a recording cannot vouch for (values leaving the
   graph) goes on to step 1, which decides it precisely.
1. **Fake mode.** make_fx runs ``fn`` on fake tensors (no memory, no compute) in a
   ``FakeTensorMode`` with a ``ShapeEnv``. Every node then records its exact layout, storage
   offset included, which the engine needs to read each ``as_strided``. Real tensors ``fn``
   closes over (parameters, buffers, anchor grids) are allowed: the graph holds them by
   reference, so gradients and in-place updates reach them when it runs.
2. **What fake mode proves impossible stays impossible.** Python control flow on tensor values,
   and shapes or Python numbers computed from tensor values, are errors of their own kind
   (:class:`TracingError` with ``cause``): a graph cannot capture them, and a real-mode trace
   would silently bake the example's branch or sizes in.
3. **Real mode where fake mode falls short.** Forward AD's zero tangents used to be such a
   case (a meta/cpu device mismatch through ``layer_norm``/``batch_norm``/``group_norm``); fake
   mode now runs them (Note [Zero tangents in fake mode]). What is left is an allowlist of
   fake-mode failures a real trace is known to get past (:func:`_is_fake_mode_limitation`),
   kept as a safety net: no program fxviews knows of reaches it any more. For those,
   make_fx runs again in real mode on fresh real tensors of the same layouts, under a guard
   that refuses every data-dependent op (so step 2 still holds), restores whatever the trace
   wrote outside its own tensors (closed-over buffers) and leaves the random number generator
   as it was. Real mode records every view at storage offset 0, so the exact layouts are then
   recomputed by fake-propagating the graph from fake inputs with the examples' layouts.
4. **What autograd sees is part of the trace.** Every path runs ``fn`` under an
   :class:`~fxviews.tracing.autograd.AutogradWatch` (Note [What autograd sees is part of the
   trace]): grad-mode regions and custom autograd.Functions are kept in the graph, and what a
   graph cannot keep is a :class:`TracingError` of cause ``"autograd"``, on every path alike.
5. **Nothing leaks.** Every attempt runs inside :func:`preserved_torch_state`: a failed trace
   leaves PyTorch's thread-local dispatch state, mode stacks and transform levels as they were.
6. **The user's own errors are theirs.** An exception ``fn``'s own code raises (a ``raise`` or
   ``assert`` statement in it: :func:`raised_by_user_code`) while it is recorded or traced
   propagates unchanged, as it would from an eager call, whatever the mode. Only failures inside
   PyTorch's ops and tracers are classified (steps 2 and 3).

``gm.meta["fxviews_traced_with"]`` says which mode produced the graph, and why real mode was
needed; ``fxviews.rewrite`` carries it into its result and printout.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fxviews.arguments import check_flags
from fxviews.passes.compat import torch_internals as internals
from fxviews.passes.compat.torch_internals import (
    DataDependentOutputException,
    FakeTensor,
    FakeTensorMode,
    GuardOnDataDependentSymNode,
    ShapeEnv,
    force_original_view_tracking,
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    make_fx_keeping_detach,
    maybe_get_bdim,
    pytree,
)
from fxviews.passes.device_faults import devices_of, raise_if_device_failed
from fxviews.passes.random_state import RandomStateFromPython, forked_rng, generators_among
from fxviews.passes.schema import FAKE_MODE, REAL_LAYOUTS, RECORDED, TRACED_WITH
from fxviews.state.reachable import reachable_generators, reachable_objects
from fxviews.tracing.autograd import (
    AutogradWatch,
    NotKept,
    requiring_grad_like,
)
from fxviews.tracing.classification import (
    TensorBranch,
    autograd_not_kept,
    raise_if_untraceable_by_nature,
    raised_by_user_code,
    random_state_from_python,
)
from fxviews.tracing.failures import (
    Failure,
    TracingError,
    describe,
    first_line,
    function_name,
    user_line,
)
from fxviews.tracing.layout_decisions import deciding_at_run_time, drop_decompositions
from fxviews.tracing.lock import capturing, tracing_lock
from fxviews.tracing.recording import ReadsMemory, record
from fxviews.tracing.samples import fake_sample, innermost, real_sample, sample_bytes
from fxviews.tracing.torch_state import preserved_torch_state
from fxviews.tracing.trace_guard import (
    DataDependentOp,
    TraceGuard,
    traced_under_guard,
)

__all__ = ["RECORDING_LIMIT_BYTES", "capture", "exact_fake_mode", "trace"]

logger = logging.getLogger("fxviews")


def trace(
    fn: Callable[..., Any],
    *args: Any,
    view_replay: bool = False,
    functionalize: bool = False,
) -> torch.fx.GraphModule:
    """Trace ``fn(*args)`` into an aten-level ``torch.fx.GraphModule`` with make_fx.

    ``args`` are example tensors (real or fake), read with their exact layouts: every node
    records ``meta["val"]`` as it was, storage offset included, so :func:`fxviews.rewrite` can
    read each as_strided relative to its input. ``fn`` may be an ``nn.Module`` or close over
    real tensors (parameters, buffers): the graph holds them by reference. Tracing is in fake
    mode, forward AD through normalization layers included; after a known fake-mode failure
    ``fn`` is traced in real mode on copies of ``args`` (``gm.meta["fxviews_traced_with"]``
    says which).

    ``view_replay=True`` traces under PyTorch's own view replay
    (``torch.autograd._force_original_view_tracking(True)``), which makes autograd replay the
    original view ops instead of emitting ``as_strided``. ``functionalize=True`` traces
    ``torch.func.functionalize(fn)``: no intermediate is mutated, so no view's aliasing is
    observable and the reshape step can make every ``view`` layout-portable; mutations of the
    inputs still happen, copied back at the end.

    Raises:
        TypeError: ``fn`` is not callable.
        TracingError: ``fn`` cannot be one graph (``err.cause`` says why: Python control flow
            on tensor values, a data-dependent shape, an untraceable op).

    Example::

        >>> gm = fxviews.trace(lambda x: x.t().contiguous(), torch.randn(2, 3))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
        [aten.t.default, aten.contiguous.default]
    """
    if not callable(fn):
        raise TypeError(f"fxviews.trace expects a callable, got {type(fn).__name__}")
    check_flags("fxviews.trace", view_replay=view_replay, functionalize=functionalize)
    traced = torch.func.functionalize(fn) if functionalize else fn
    generators = reachable_generators(reachable_objects(fn))
    with _view_replay(view_replay):
        return capture(
            traced,
            args,
            fresh=False,
            caller="fxviews.trace",
            name=function_name(fn),
            generators=generators,
        )


def capture(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    fresh: bool,
    caller: str,
    name: str,
    generators: Sequence[torch.Generator] = (),
    held: int = 0,
) -> torch.fx.GraphModule:
    """make_fx ``fn(*args)``: fake mode, else real mode where fake mode falls short (see Note).

    ``fresh=False`` traces on the tensors' own layouts (``args`` are the examples);
    ``fresh=True`` on fresh tensors of their logical shapes, dtypes and devices, contiguous
    where vmap batches them and of their own layout otherwise (Note [The layout of a call];
    ``args`` may then be wrapped by enclosing transforms; only their metadata, and their
    values for a real-mode trace, are used). ``caller`` and ``name`` say who traced what, for
    messages. ``generators`` are those ``fn`` reaches besides its arguments' (Note [Which
    generators to fork]): every generator is left as it was, and random state a graph cannot
    replay is refused (Note [Random state set from Python]). The last ``held`` of ``args`` are
    tensors ``fn`` holds, not its arguments (a module's slots: what autograd sees of them is
    theirs, :class:`~fxviews.tracing.autograd.AutogradWatch`). Holds :data:`tracing_lock`;
    call it outside active transforms and modes.
    """
    call = deciding_at_run_time(_positional(fn, len(args)))
    generators = generators_among([list(args), list(generators)])
    memory_read = None  # the recording's error where it saw fn read tensor memory from Python
    with tracing_lock, capturing(), forked_rng([list(args), generators]):
        if fresh and _has_real_values(args) and _fits_a_recording(args, name):
            try:
                gm = drop_decompositions(_record_on_a_sample(call, args, generators, held))
                gm.meta[TRACED_WITH] = RECORDED
                gm.meta[REAL_LAYOUTS] = True  # real kernels made them: nothing to check
                return gm
            except NotKept as err:  # the same in fake mode: no graph keeps it
                raise autograd_not_kept(err, caller, name) from err
            except RandomStateFromPython as err:  # the same in fake mode
                raise random_state_from_python(err, caller, name) from err
            except Exception as err:  # noqa: BLE001 - fake mode decides, and reports what fails
                raise_if_device_failed(err, devices_of(list(args)), f"recording {name}")
                if raised_by_user_code(err):
                    raise
                memory_read = err if isinstance(err, ReadsMemory) else None
                logger.debug("fxviews: %s is traced in fake mode: %s", name, first_line(err))
        mode = exact_fake_mode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
        fake_args = _fake_examples(args, mode, fresh)
        try:
            with (
                preserved_torch_state(),
                _BranchDetector(),
                _quiet_fake_tensor_log(),
                internals.traceable_jacobian_basis(),
            ):
                # A graph transform caches must not bake in a closed-over tensor's value;
                # trace and explain give the graph of this call, values included, as make_fx.
                guard = TraceGuard(
                    fake_args,
                    dense_zero_tangents=True,
                    refuse_constant_reads=fresh,
                    generators=generators,
                )
                autograd = AutogradWatch(held=held)  # Note [What autograd sees is part of ...]
                gm = traced_under_guard(
                    lambda f: make_fx_keeping_detach(f, "fake")(*fake_args),
                    autograd.wrap(call),
                    guard,
                )
                autograd.finish(gm)
            _check_no_meta_leak(gm)
            gm = drop_decompositions(gm)
            gm.meta[TRACED_WITH] = FAKE_MODE
            return gm
        except Exception as err:  # noqa: BLE001 - classified below; the unknown are re-raised
            # Fake mode runs ops on real constants (closed-over tensors) for real.
            raise_if_device_failed(err, devices_of(list(args)), f"tracing {name} in fake mode")
            fake_error = err
        raise_if_untraceable_by_nature(fake_error, caller, name)
        if memory_read is not None and not _is_fake_mode_limitation(fake_error):
            kind = Failure.READS_STORAGE if memory_read.storage else Failure.READS_MEMORY
            message = describe(kind, caller, name, memory_read)
            raise TracingError(message, "reads tensor values") from fake_error
        if not _is_fake_mode_limitation(fake_error):
            where = user_line(fake_error)
            raise TracingError(
                f"{caller} could not trace {name}{f' ({where})' if where else ''}: "
                f"{type(fake_error).__name__}: {first_line(fake_error)}",
                "untraceable",
            ) from fake_error
        gm = drop_decompositions(
            _capture_real(
                call, args, fake_args, mode, fresh, generators, fake_error, caller, name, held
            )
        )
        gm.meta[TRACED_WITH] = f"real mode (fake mode failed: {first_line(fake_error)})"
        return gm


def _has_real_values(args: Sequence[Any]) -> bool:
    """Whether every tensor in ``args`` is a plain tensor with values a recording can compute
    with (not fake, not meta, not a subclass such as DTensor: fake mode traces those on plain
    fakes of their logical shapes)."""
    return all(
        type(sample) in (torch.Tensor, torch.nn.Parameter) and sample.device.type != "meta"
        for leaf in pytree.tree_leaves(list(args))
        if isinstance(leaf, torch.Tensor)
        for sample in [innermost(leaf)]
    )


#: The most tensor bytes a recording copies (one sample's arguments): past it, fake mode traces
#: with no memory for values. A recording holds fresh copies of the arguments and computes
#: ``fn`` on them once, so its memory grows with theirs (bench row 10: called outside vmap, where
#: the sample is the whole input, a first call took 2.5x eager's peak); fake mode's cost grows
#: with the op count only, and on inputs this large is the cheaper trace anyway.
RECORDING_LIMIT_BYTES = 64 * 2**20


def _fits_a_recording(args: Sequence[Any], name: str) -> bool:
    """Whether one sample of ``args`` (their logical shapes) is small enough to record."""
    size = sum(
        sample_bytes(leaf)
        for leaf in pytree.tree_leaves(list(args))
        if isinstance(leaf, torch.Tensor)
    )
    if size > RECORDING_LIMIT_BYTES:
        logger.debug("fxviews: %s is traced in fake mode: a sample holds %d bytes", name, size)
    return size <= RECORDING_LIMIT_BYTES


def _record_on_a_sample(
    call: Callable[..., Any],
    args: Sequence[Any],
    generators: Sequence[torch.Generator],
    held: int = 0,
) -> torch.fx.GraphModule:
    """Step 0 of the Note: record ``call`` on one sample's real values (Note [Recording a real
    trace]); closed-over tensors are left as they were (the caller forks the random state)."""
    real_args = _real_examples(args, fresh=True)
    guard = TraceGuard(real_args, dense_zero_tangents=True, generators=generators)
    values = exact_fake_mode(allow_non_fake_inputs=True)
    with preserved_torch_state():
        return traced_under_guard(lambda f: record(f, real_args, values, held), call, guard)


def exact_fake_mode(**options: Any) -> FakeTensorMode:
    """A FakeTensorMode whose every result has the exact layout the real op would give.

    FakeTensor's dispatch cache replays a cached result's metadata for a later call with
    equal arguments; for ``select_scatter`` and friends it replays storage offset 0 where the
    real kernel keeps its input's offset, so the second trace of a function would record
    wrong layouts. The engine reads those layouts as facts: no cache.
    """
    mode = FakeTensorMode(**options)
    mode.cache_enabled = False
    return mode


def _positional(fn: Callable[..., Any], count: int) -> Callable[..., Any]:
    """``fn``, or a ``*args`` wrapper of it where make_fx would miscount its inputs.

    make_fx reads the signature of the innermost wrapped function to name and count the
    graph's inputs: a function with defaults, or one wrapped by functools.wraps (``jacfwd``,
    ``grad``), would be asked for arguments it was not given. Functions whose positional
    parameters match ``args`` are traced as they are, so the inputs keep their names.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is not None and code.co_argcount == count and not code.co_kwonlyargcount:
        if not code.co_flags & inspect.CO_VARARGS:
            return fn

    def call(*args: Any) -> Any:
        return fn(*args)

    return call


@contextlib.contextmanager
def _view_replay(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    with force_original_view_tracking(True):
        yield


# --- fake mode -------------------------------------------------------------------------------

# Note [Zero tangents in fake mode]
# ---------------------------------
# Forward AD gives an input without a tangent (a closed-over LayerNorm weight, a BatchNorm
# bias) a zero tangent made by ``aten._efficientzerotensor``: a memoryless tensor with the
# ZeroTensor dispatch key. ZeroTensor registers a C++ kernel of its own for ``view`` (which
# ``reshape`` uses), run *before* the Python key, so on a fake zero tensor it builds a
# plain tensor on the meta device (not a FakeTensor) that fake mode never sees. Every op the
# tangent formula then runs on it (``_affine_jvp``'s ``input_p * weight_t`` in layer_norm_jvp,
# batch_norm_jvp, group_norm_jvp) fails with "Expected all tensors to be on the same device
# ... meta and cpu", or records ``_to_copy(device=meta)`` nodes the graph would return.
#
# While tracing in fake mode, ``TraceGuard`` answers ``_efficientzerotensor`` with
# ``aten.zeros`` of the same size, dtype and device: the same values, as an ordinary tensor
# whose views go through fake mode. The formulas test ``_is_zerotensor()`` only to skip work,
# and take their out-of-place path on fakes anyway (they are tensor-subclass-like), so the
# graph computes the same tangents eager does; it records the zeros and the products with
# them, where eager's ZeroTensor kernels skip them (elementwise work on the parameters'
# shapes, broadcast over the activations).


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    # Fake mode logs every op it cannot run at ERROR level, traceback included. Here such a
    # failure is expected and handled (real mode takes over, and the graph says so).
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    previous = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        fake_log.setLevel(previous)


def _fake_examples(args: Sequence[Any], mode: FakeTensorMode, fresh: bool) -> list[Any]:
    """Fake tensors for ``args``: fresh ones (Note [The layout of a call]), or copies of their
    exact layouts."""

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if fresh:
            sample = fake_sample(value, mode)
            with mode:
                return requiring_grad_like(sample, value)
        if isinstance(value, FakeTensor) and value.fake_mode is mode:
            return value
        # from_tensor keeps sizes, strides, storage offset, and aliasing between arguments.
        return mode.from_tensor(value, static_shapes=True)

    return [pytree.tree_map(convert, arg) for arg in args]


class _BranchDetector(TorchFunctionMode):
    """Tell a Python branch on a tensor (``if x.sum() > 0``) from other data dependence.

    Both fail in fake mode with the same ``GuardOnDataDependentSymNode``; only a branch goes
    through ``Tensor.__bool__``.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not torch.Tensor.__bool__:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except (GuardOnDataDependentSymNode, DataDependentOutputException) as err:
            raise TensorBranch(first_line(err)) from err


class _MetaDeviceLeak(RuntimeError):
    """A fake-mode graph computes a live value on the meta device its inputs are not on."""


def _check_no_meta_leak(gm: torch.fx.GraphModule) -> None:
    """Refuse a fake-mode graph whose result depends on a value recorded on the meta device.

    Fake tensors live on the meta device inside C++. Kernels that pick an output device from
    their inputs' (the efficient zero tensors of forward AD: ``_efficientzerotensor``,
    ``_to_copy``) then record ``device=meta`` in the graph, which would return meta tensors.
    Dead meta computations (shape checks) are harmless and left to the dead-code step.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_on_meta(n) for n in placeholders):
        return
    live, pending = set(), [gm.graph.output_node()]
    while pending:
        node = pending.pop()
        if node in live:
            continue
        live.add(node)
        if _on_meta(node):
            raise _MetaDeviceLeak(
                f"fake mode recorded {node.format_node()} on the meta device, and the graph's "
                "result depends on it"
            )
        pending += node.all_input_nodes


def _on_meta(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.device.type == "meta"


def _is_fake_mode_limitation(err: Exception) -> bool:
    """Whether ``err`` is one of the fake-mode failures a real-mode trace is known to get past.

    An allowlist, not a guess: any other failure (``.numpy()``, say, which a real trace would
    turn into a constant of the example's values) must not reach real mode.
    """
    if isinstance(err, _MetaDeviceLeak) or internals.is_fake_device_mismatch(err):
        return True  # forward AD's zero tangents through layer_norm/batch_norm
    text = str(err)
    # Forward AD's _fw_primal/_make_dual reach their inference-only native stubs on fakes.
    return isinstance(err, RuntimeError) and "InferenceMode::is_enabled()" in text


# --- real mode -------------------------------------------------------------------------------


def _capture_real(
    call: Callable[..., Any],
    args: Sequence[Any],
    fake_args: list[Any],
    mode: FakeTensorMode,
    fresh: bool,
    generators: Sequence[torch.Generator],
    fake_error: Exception,
    caller: str,
    name: str,
    held: int = 0,
) -> torch.fx.GraphModule:
    """make_fx in real mode on real copies of ``args``; exact layouts recomputed afterwards
    (the caller forks the random state)."""
    real_args = _real_examples(args, fresh)
    guard = TraceGuard(real_args, refuse_data_dependent=True, generators=generators)
    try:
        with preserved_torch_state():
            autograd = AutogradWatch(held=held)
            gm = traced_under_guard(
                lambda f: make_fx_keeping_detach(f, "real")(*real_args), autograd.wrap(call), guard
            )
            autograd.finish(gm)
    except NotKept as err:
        raise autograd_not_kept(err, caller, name) from err
    except RandomStateFromPython as err:
        raise random_state_from_python(err, caller, name) from err
    except DataDependentOp as err:
        message = describe(Failure.VALUE_SHAPED_OUTPUT, caller, name, err, op=err.func)
        raise TracingError(message, "data-dependent shape") from err
    except Exception as err:  # noqa: BLE001 - both modes failed: report both causes
        raise_if_device_failed(err, devices_of(real_args), f"tracing {name} in real mode")
        raise TracingError(
            f"{caller} could not trace {name} in fake mode ({type(fake_error).__name__}: "
            f"{first_line(fake_error)}) nor in real mode ({type(err).__name__}: "
            f"{first_line(err)})",
            "untraceable",
        ) from err
    _recompute_layouts(gm, fake_args, mode, caller, name)
    return gm


def _real_examples(args: Sequence[Any], fresh: bool) -> list[Any]:
    """Real tensors to trace on: copies of ``args``' values in the layouts fake mode used.

    Values matter only to ops that check them (an index in range, a factorizable matrix); the
    guard refuses every op whose result could carry them into the graph.
    """
    copies: dict[int, torch.Tensor] = {}  # storage copies by source storage, to keep aliasing

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        sample = _plain_sample(value)
        if fresh:
            return requiring_grad_like(real_sample(value, sample), value)
        if sample is not value:  # fake or meta: no values to copy
            return sample.requires_grad_() if value.requires_grad else sample
        storage = value.untyped_storage()
        key = storage.data_ptr()
        if key not in copies:
            copies[key] = torch.empty(0, dtype=torch.uint8, device=value.device).set_(
                storage.clone()
            )
        copy = torch.empty(0, dtype=value.dtype, device=value.device)
        offset, shape, stride = value.storage_offset(), value.shape, value.stride()
        copy.set_(copies[key].untyped_storage(), offset, shape, stride)
        return copy.requires_grad_() if value.requires_grad else copy

    return [pytree.tree_map(convert, arg) for arg in args]


def _plain_sample(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``value``'s logical shape holding one sample's values if it has any.

    Arguments wrapped by enclosing transforms are unwrapped (one batch entry of a vmapped one);
    fake and meta tensors have no values, and give zeros.
    """
    with torch.no_grad():
        while is_functorch_wrapped_tensor(value):
            batch_dim = maybe_get_bdim(value) if is_batchedtensor(value) else -1
            value = get_unwrapped(value)
            if batch_dim >= 0:
                value = value.select(batch_dim, 0)
    if isinstance(value, FakeTensor) or value.device.type == "meta":
        return torch.zeros(value.shape, dtype=value.dtype, device=_real_device(value))
    return value


def _real_device(value: torch.Tensor) -> torch.device:
    if isinstance(value, FakeTensor):
        return value.fake_device
    return torch.device("cpu") if value.device.type == "meta" else value.device


def _recompute_layouts(
    gm: torch.fx.GraphModule,
    fake_args: list[Any],
    mode: FakeTensorMode,
    caller: str,
    name: str,
) -> None:
    """Replace real mode's per-node snapshots (views at offset 0) by exact fake layouts."""
    flat = [leaf for arg in fake_args for leaf in pytree.tree_leaves(arg)]
    # Fake mode runs ops whose inputs are all real constants for real: guard their writes.
    guard = TraceGuard(flat)
    try:
        with preserved_torch_state():
            try:
                with guard:
                    prop = internals.FakeTensorProp(gm, mode=mode)
                    prop.propagate_dont_convert_inputs(*flat)
            finally:
                guard.restore_foreign_writes()
    except Exception as err:  # noqa: BLE001 - any failure leaves the layouts unknown
        raise_if_device_failed(err, devices_of(flat), f"recomputing the layouts of {name}")
        raise TracingError(
            f"{caller} traced {name} in real mode but could not recompute the exact layouts of "
            f"its graph in fake mode ({type(err).__name__}: {first_line(err)})",
            "untraceable",
        ) from err
