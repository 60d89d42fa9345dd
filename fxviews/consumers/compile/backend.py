"""The torch.compile backend: ``fxviews.backend(...)`` and ``backend="fxviews"``.

The module is ``fxviews.consumers.compile.backend``; the package attribute ``fxviews.backend`` is
its function :func:`backend`.

Dynamo captures the function; the first stage (:mod:`.dynamo_stage`) rewrites
the user's ``as_strided`` in Dynamo's graph, per sample under vmap, and decides what AOTAutograd
would get wrong; AOTAutograd lowers it to aten forward/backward graphs, the engine
(:class:`fxviews.passes.AsStridedToViews`) rewrites every provably safe ``as_strided`` of each
graph into view ops, dead metadata checks are removed, and the inner compiler gets the result.
Nodes the engine keeps stay in the graph, proven against eager's layouts where the traced ones
are not eager's (docs/compile.md says what each stage guarantees).

Three ways to select it::

    torch.compile(fn, backend="fxviews")                                   # inner eager
    torch.compile(fn, backend="fxviews", options={"inner": "inductor"})
    torch.compile(fn, backend=fxviews.backend(inner="inductor"))

``"fxviews"`` works without ``import fxviews`` through the ``torch_dynamo_backends`` entry point.
``FXVIEWS_DEBUG=1`` prints the graph-diff printout of every graph the backend rewrites.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from torch import Tensor
from torch.fx import GraphModule, Node
from torch.nn import Parameter

from fxviews.arguments import check_flags
from fxviews.consumers.compile.dynamo_stage import (
    prepare_dynamo_graph,
    unfold_backward_traced_per_sample,
)
from fxviews.consumers.compile.graph_splits import split_around, transform_regions
from fxviews.consumers.compile.layout_reads import check_layout_reads, mark_layout_reads
from fxviews.consumers.compile.mode_regions import ModeRegions, first_setting_change
from fxviews.consumers.compile.output_layouts import pin_output_layouts
from fxviews.consumers.compile.storage_bounds import with_storage_checks
from fxviews.passes.compat.torch_internals import (
    CompileContext,
    dynamo_signals,
    frame_entry_settings_hold,
    is_boxed_call,
)
from fxviews.passes.device_faults import devices_of, raise_if_device_failed
from fxviews.passes.errors import FxViewsError
from fxviews.passes.geometry.symbolic import guards_allowed
from fxviews.passes.source_lines import describe_node
from fxviews.rewriting.printouts import logger, report_rewrite
from fxviews.rewriting.steps import rewrite_in_place
from fxviews.tracing.failures import first_line
from fxviews.tracing.lock import tracing_lock
from fxviews.tracing.torch_state import preserved_torch_state

#: What an inner compiler returns: a function of the graph's inputs (boxed or not).
CompiledFn = Callable[..., Any]
#: ``inner(gm, example_inputs)`` receives each rewritten aten graph, as an AOT compiler does.
InnerCompiler = Callable[[GraphModule, Sequence[Any]], CompiledFn]
#: A torch.compile backend: called by Dynamo with the captured graph and its example inputs.
Backend = Callable[[GraphModule, Sequence[Any]], CompiledFn]

_INNER_NAMES = ("eager", "inductor")

# Dynamo must mark the layouts Python reads while it traces, before this backend sees the graph
# (Note [Layouts read in Python]); torch.compile imports this module when it looks the backend
# up (by name or as fxviews.backend), before its first trace.
mark_layout_reads()


def backend(
    inner: str | InnerCompiler = "eager",
    *,
    strict: bool = False,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    **inductor_options: Any,
) -> Backend:
    """Return a torch.compile backend that runs the fxviews engine on every AOT graph.

    ``inner`` compiles the rewritten graphs: ``"eager"`` runs them as Python (like
    ``aot_eager``), ``"inductor"`` hands them to TorchInductor, and a callable
    ``inner(gm, example_inputs)`` receives each rewritten aten graph (forward, backward or
    inference) with fake example inputs and returns a function of the graph's inputs; a
    function that does not take a boxed argument list is boxed for AOTAutograd.

    ``strict=True`` makes an ``as_strided`` the engine must keep an error
    (:class:`fxviews.UnsafeAsStridedError`, surfaced by Dynamo as a backend failure) instead of
    leaving it to the inner compiler, and a graph PyTorch's AOT lowering fails on an error instead
    of running it as eager PyTorch. ``decompositions`` replaces the decomposition table of the
    lowering (default: none for eager and callables, as ``aot_eager``; Inductor's own table for
    Inductor). Any other keyword is an Inductor config patch (what ``torch.compile(...,
    options=...)`` takes for ``backend="inductor"``), so it requires ``inner="inductor"``.

    Example::

        >>> compiled = torch.compile(fn, backend=fxviews.backend(inner="inductor"))
        >>> seen = []
        >>> record = lambda gm, example_inputs: seen.append(gm) or gm.forward
        >>> torch.compile(fn, backend=fxviews.backend(inner=record))(*args)
    """
    check_flags("fxviews.backend", strict=strict)
    if inner == "inductor":
        return _inductor_backend(strict, decompositions, inductor_options)
    if inductor_options:
        raise TypeError(
            f"fxviews.backend got unexpected options {sorted(inductor_options)}; only "
            "inner='inductor' takes Inductor config patches"
        )
    if inner == "eager":
        return _aot_backend(_run_as_python, "eager", strict, decompositions)
    if callable(inner):
        return _aot_backend(inner, _describe(inner), strict, decompositions)
    raise ValueError(
        f"fxviews.backend: inner must be one of {_INNER_NAMES} or a callable "
        f"inner(gm, example_inputs), got {inner!r}"
    )


def fxviews_backend(
    gm: GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> CompiledFn:
    """The backend registered as ``"fxviews"``; ``torch.compile``'s ``options`` configure it.

    ``torch.compile`` passes ``options`` (and ``mode``) to a backend it finds by name as keyword
    arguments; this reads ``options`` as the keywords of :func:`backend`, so ``{"inner":
    "inductor"}`` selects Inductor and the other keys are ``strict``, ``decompositions`` or
    Inductor config patches. ``mode`` is refused: ``torch.compile`` does not allow it together
    with ``options``, which is what selects the inner compiler.

    Example::

        >>> torch.compile(fn, backend="fxviews", options={"inner": "inductor"})(*args)
    """
    if mode is not None:
        raise ValueError(
            f"backend='fxviews' takes no mode (got {mode!r}): pass "
            "options={'inner': 'inductor', **torch._inductor.list_mode_options(mode)} instead"
        )
    return backend(**(options or {}))(gm, example_inputs)


def _aot_backend(
    inner: InnerCompiler,
    inner_name: str,
    strict: bool,
    decompositions: dict[Any, Callable[..., Any]] | None,
) -> Backend:
    """Lower with AOTAutograd as ``aot_eager`` does, rewriting each graph before ``inner``."""
    # Imported on use: Dynamo and AOTAutograd take over a second to import, and users of
    # transform/rewrite alone never need them.
    from fxviews.passes.compat.torch_internals import (
        aot_autograd,
        make_boxed_func,
        min_cut_rematerialization_partition,
    )

    def compiler_for(kind: str) -> Callable[[GraphModule, Sequence[Any]], CompiledFn]:
        def compile_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
            _rewrite_in_place(gm, strict, kind)
            compiled = inner(gm, example_inputs)
            # AOTAutograd passes one list of arguments to compiled graphs marked _boxed_call.
            if is_boxed_call(compiled):
                return compiled
            return make_boxed_func(compiled)

        return compile_graph

    lower = aot_autograd(
        fw_compiler=compiler_for("forward"),
        bw_compiler=compiler_for("backward"),
        inference_compiler=compiler_for("inference"),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
        decompositions=decompositions,
    )
    # Eager kernels give their outputs eager's layouts; another compiler may follow the fake ones.
    pin_outputs = inner is not _run_as_python
    return _serialized(lower, f"fxviews_{inner_name}", strict, pin_outputs)


def _inductor_backend(
    strict: bool,
    decompositions: dict[Any, Callable[..., Any]] | None,
    config_patches: dict[str, Any],
) -> Backend:
    """Let Inductor lower (its decompositions, partitioner, joint passes) and rewrite its graphs.

    ``compile_fx``'s ``inner_compile`` hook receives exactly the aten graphs Inductor is about
    to compile, forward and backward, so the engine runs between AOTAutograd and Inductor.
    """
    # Imported on use: Inductor takes seconds to import and eager users never need it.
    from fxviews.passes.compat.torch_internals import (
        compile_fx,
        compile_fx_inner,
        functorch_config,
        inductor_decompositions,
    )

    def rewrite_then_compile(gm: GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        kind = (
            "backward"
            if kwargs.get("is_backward")
            else ("inference" if kwargs.get("is_inference") else "forward")
        )
        _rewrite_in_place(gm, strict, kind)
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def fxviews_inductor(gm: GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        # The AOTAutograd cache keys on the Dynamo graph and Inductor config, not on
        # inner_compile: a hit would return graphs that never went through the engine, and a
        # save would hand rewritten graphs to plain Inductor. Inductor's own FX graph cache keys
        # on the rewritten graph and stays on.
        with functorch_config.patch(enable_autograd_cache=False):
            return compile_fx(
                gm,
                example_inputs,
                inner_compile=rewrite_then_compile,
                config_patches=config_patches or None,
                # Inductor's own table where none is given, laid out as eager's on releases
                # before 2.13 (torch_internals.inductor_decompositions).
                decompositions=inductor_decompositions()
                if decompositions is None
                else decompositions,
            )

    return _serialized(fxviews_inductor, "fxviews_inductor", strict, pin_outputs=True)


@dataclass
class _Lowering:
    """One lowering of a Dynamo graph; ``reached_engine`` once an AOT graph reaches fxviews."""

    reached_engine: bool = False


_CURRENT_LOWERING: ContextVar[_Lowering | None] = ContextVar("fxviews_lowering", default=None)


def _serialized(compile_fn: Backend, name: str, strict: bool, pin_outputs: bool) -> Backend:
    """The first stage on Dynamo's graph (:func:`~.dynamo_stage.prepare_dynamo_graph`), then
    ``compile_fn``, under the process-wide tracing lock, falling back to eager PyTorch where
    PyTorch's own lowering fails.

    AOTAutograd traces torch.func code much as fxviews' tracer does, and the two must not run
    in two threads at once (forward-AD levels and dispatch modes are process-wide).

    AOTAutograd cannot lower every program Dynamo captures (measured on torch 2.13: in-place
    writes into a buffer whose earlier slices autograd saved, which trips its version counter
    check; a vjp under vmap whose functionalized ``as_strided_scatter`` goes out of bounds at a
    batch dim that is not first). ``aot_eager`` and Inductor fail there too, but the ``eager``
    backend runs them. So when the lowering raises before any AOT graph reached the engine,
    the Dynamo graph runs as eager PyTorch (its Python code, as the ``eager`` backend runs it),
    with a warning through the ``fxviews`` logger; PyTorch's thread state is restored first.
    ``strict=True`` raises instead. Errors from the engine or the inner compiler are never
    swallowed, and neither are the exceptions Dynamo uses for its own control flow
    (:func:`~fxviews.passes.compat.torch_internals.dynamo_signals`:
    ``TensorifyScalarRestartAnalysis``, raised by AOTAutograd under ``dynamic=True`` to have
    Dynamo trace again with the scalar as a tensor, and the like), which reach Dynamo as they
    would from ``aot_eager``.

    ``pin_outputs`` gives outputs eager's layouts where their fake ones differ (Note [Outputs in
    eager's layout]), for an inner compiler that lays memory out by the fake values.
    """

    def serialized(gm: GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        # Dynamo checks the ShapeEnv's guards before each call, so proofs over symbolic sizes
        # may add guards where nothing else holds (Note [Proofs over symbolic shapes], 4):
        # other sizes compile again.
        with tracing_lock, preserved_torch_state(), guards_allowed():
            check_layout_reads(gm)
            prepared = prepare_dynamo_graph(gm, strict, _graph_name("Dynamo"))
            whole = _plain_subclass_inputs(example_inputs) or _setting_left_changed(gm)
            if whole is not None:
                return _run_dynamo_graph(gm, name, strict, whole)
            if prepared.runs_eagerly is not None and (strict or not prepared.splits):
                return _run_dynamo_graph(gm, name, strict, prepared.runs_eagerly)
            if pin_outputs:
                for pinned in pin_output_layouts(gm):
                    logger.debug("backend, %s: eager's layout pinned on %s", name, pinned)
            if prepared.runs_eagerly is None:
                lowered = _lowered(compile_fn, gm, example_inputs, name, strict)
                return with_storage_checks(lowered, prepared.storage_needs)
            regions = transform_regions(gm)
            eager = [*prepared.run_alone, *(n for n in prepared.split_before if n in regions)]
            logger.info(
                "backend=%r splits this graph around the nodes AOTAutograd would get wrong, as "
                "a graph break would, and compiles %s: %s",
                name,
                f"every part but those of {', '.join(describe_node(n) for n in eager)} (with "
                "any torch.func transform around them), run as eager PyTorch"
                if eager
                else "each part",
                prepared.runs_eagerly,
            )
            split = split_around(
                gm,
                prepared.split_before,
                prepared.run_alone,
                lambda part, inputs: _lowered(compile_fn, part, inputs, name, strict),
            )
            return with_storage_checks(split.forward, prepared.storage_needs)

    # torch.compile names the backend after __name__ in its logs and errors.
    serialized.__name__ = name
    return serialized


def _lowered(
    compile_fn: Backend,
    gm: GraphModule,
    example_inputs: Sequence[Any],
    name: str,
    strict: bool,
) -> CompiledFn:
    """``compile_fn(gm, example_inputs)``, or ``gm`` run as eager PyTorch where PyTorch's own
    lowering fails before any AOT graph reached the engine (see :func:`_serialized`)."""
    lowering = _Lowering()
    token = _CURRENT_LOWERING.set(lowering)
    try:
        with unfold_backward_traced_per_sample(), ModeRegions() as regions:
            compiled = compile_fn(gm, example_inputs)
        hazard = regions.hazard()  # Note [Modes set inside a compiled function]
        if hazard is None:
            return compiled
        setter = first_setting_change(gm)
        if strict or setter is None or not regions.restored() or _no_work_before(setter):
            return _run_dynamo_graph(gm, name, strict, hazard)
        logger.info(
            "backend=%r compiles this graph up to %s, which changes a setting, and runs the "
            "rest as eager PyTorch: %s",
            name,
            describe_node(setter),
            hazard,
        )
        lower = functools.partial(_lowered, compile_fn, name=name, strict=strict)
        return split_around(gm, (), (), lower, eager_from=setter).forward
    except RuntimeError as err:
        if strict or lowering.reached_engine or isinstance(err, (FxViewsError, *dynamo_signals())):
            raise  # a restart or graph break Dynamo asks for is Dynamo's to handle
        raise_if_device_failed(err, devices_of(list(example_inputs)), "PyTorch's AOT lowering")
        logger.warning(
            "backend=%r runs this graph as eager PyTorch: PyTorch's AOT lowering failed "
            "before fxviews saw it (%s: %s)",
            name,
            type(err).__name__,
            first_line(err),
        )
        return gm.forward
    finally:
        _CURRENT_LOWERING.reset(token)


def _setting_left_changed(gm: GraphModule) -> str | None:
    """Why AOTAutograd cannot lower ``gm`` in the settings the call is made in, or None: the
    frame changes a process setting and does not undo it, so Dynamo's trace left it changed
    while the backend lowers, and AOTAutograd drops the setter, which the call must run
    (Note [Modes set inside a compiled function])."""
    if frame_entry_settings_hold():
        return None
    setter = first_setting_change(gm)
    where = describe_node(setter) if setter is not None else "the function"
    return (
        f"{where} changes a process setting and leaves it changed, which AOTAutograd's graphs "
        "would neither do nor be traced in (Note [Modes set inside a compiled function])"
    )


def _no_work_before(node: Node) -> bool:
    """Whether only the graph's inputs come before ``node``."""
    for before in node.graph.nodes:
        if before is node:
            return True
        if before.op != "placeholder":
            return False
    return True


def _plain_subclass_inputs(example_inputs: Sequence[Any]) -> str | None:
    """Why AOTAutograd cannot run a graph given these inputs, or None: a tensor subclass of the
    user's with no ``__torch_dispatch__`` of its own (``x.as_subclass(Marked)``), which its
    compiled graph refuses when it runs (every handler "returned NotImplemented"; ``aot_eager``
    fails the same way on torch 2.13). Dynamo's graph, run as Python, keeps the class as eager
    does."""
    for value in example_inputs:
        kind = type(value)
        if issubclass(kind, Tensor) and kind not in (Tensor, Parameter):
            if kind.__torch_dispatch__ is Tensor.__torch_dispatch__:
                return (
                    f"an input is a {kind.__qualname__}, a tensor subclass without a "
                    f"__torch_dispatch__ of its own, which AOTAutograd's compiled graphs refuse"
                )
    return None


def _run_dynamo_graph(gm: GraphModule, name: str, strict: bool, hazard: str) -> CompiledFn:
    """Dynamo's graph run as Python, for a graph AOTAutograd would give other numbers than
    eager (Notes [In-place writes AOTAutograd gets wrong] and [Modes set inside a compiled
    function]); ``strict=True`` raises instead."""
    if strict:
        raise FxViewsError(f"backend={name!r} cannot lower this graph to eager's numbers: {hazard}")
    logger.warning(
        "backend=%r runs this graph as eager PyTorch (Dynamo's graph as Python): %s", name, hazard
    )
    return gm.forward


def _rewrite_in_place(gm: GraphModule, strict: bool, kind: str) -> None:
    """Run the engine and graph hygiene on ``gm`` itself: AOTAutograd made it for us alone."""
    lowering = _CURRENT_LOWERING.get()
    if lowering is not None:
        lowering.reached_engine = True
    # No run-time guards: the graph goes on to the inner compiler, and Dynamo traces vmap
    # itself, so it never runs on batched tensors.
    result = rewrite_in_place(gm, strict=strict, guard_kept=False, against_eager_layouts=True)
    report_rewrite(result, source=f"backend, {_graph_name(kind)}")


def _graph_name(kind: str) -> str:
    compile_id = CompileContext.current_compile_id()
    return f"{kind} graph" + (f" of compile {compile_id}" if compile_id is not None else "")


def _run_as_python(gm: GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
    """The eager inner compiler: the graph's generated Python code, as ``aot_eager`` runs it."""
    return gm.forward


def _describe(inner: object) -> str:
    return getattr(inner, "__name__", None) or type(inner).__name__


def register_backend_name() -> None:
    """Register ``backend="fxviews"`` with Dynamo (which this imports).

    An installed distribution needs no call: Dynamo finds ``"fxviews"`` through its
    ``torch_dynamo_backends`` entry point and registers what it loads, and registering here too
    would make it fail with "duplicate name". ``import fxviews`` calls it only for a source tree
    on ``sys.path`` without installed metadata.
    """
    from fxviews.passes.compat.torch_internals import register_backend

    register_backend(fxviews_backend, name="fxviews")
