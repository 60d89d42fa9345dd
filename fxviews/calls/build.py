"""The build of one cache entry: ``fn`` traced for a call's signature, rewritten, and guarded.

Note [Building a cache entry]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A miss of ``transform``'s cache (Note [The cached call] in :mod:`fxviews.calls.cache`) builds
one :class:`Entry` for the call's signature in the state now in force, in five steps:

1. **The state before.** The process state is snapshot first, before anything can change it
   (:func:`~fxviews.state.guard.process_state`), the objects ``fn`` reaches are found
   (:func:`~fxviews.state.reachable.reachable_objects`), and the slots of the modules among
   them, whose tensors the graph takes as inputs read at each call (Note [Parameters are read
   when the graph runs]).
2. **What is refused before a trace.** Lazy modules whose parameters do not exist yet (the call
   runs eagerly and the next one traces), tensor arguments of a kind no trace runs on
   (quantized, nested, sparse, oneDNN), arguments with the lazy conjugate or negative bit,
   closures over tensors of an enclosing transform, and iterators ``fn`` reaches (Note [Python
   state a trace rebinds]): an item once taken cannot be put back.
3. **The trace**, outside every enclosing transform (:func:`_outside_transforms`), on the
   call's tensors and the slots' (each slot holding its sample while ``fn`` runs), recording
   which modules run; a module call with hooks is refused (Note [The state a graph bakes in],
   item 6), Python state ``fn`` writes is put back and refused
   (:class:`~fxviews.state.python_state.Rebinding`), a result holding an object ``fn`` makes on
   each call is refused (Note [What fn returns]), and slots the graph does not read are
   dropped from it.
4. **The rewrite**, built to be run only by fxviews (:func:`~fxviews.rewriting.steps.
   rewrite_in_place` with ``bind_calls``), and the graph's own code
   (:func:`~fxviews.calls.graph_code.run_only_forward`), run with autocast off where the call
   is made under it (the graph holds autocast's casts: Note [Modes inside fn]).
5. **The guard, finished.** One :class:`~fxviews.state.guard.StateGuard` is made from what the
   steps found: the process state of step 1, the modules reached and those that ran (their
   modes, registrations and hooks), the names and closure cells ``fn``'s code reads, and the
   held tensors whose layout the graph depends on; with it the entry keeps its slots and the
   check of what they hold. No entry is completed after it is built.

Where ``fn``'s result depends on tensor values (a :class:`TracingError` of one of
:data:`~fxviews.tracing.failures.EAGER_CAUSES`), the entry runs ``fn`` eagerly for good,
guarded by the modes and hooks of the modules it reaches only (it reads everything else
afresh). Any other failure raises :class:`TraceLater`: this call runs eagerly, the next traces
again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fxviews.calls.graph_code import run_only_forward
from fxviews.calls.keys import Offsets, hot_check, offsets_of
from fxviews.calls.rebuilding import (
    GRAPH_OUTPUT_TYPES,
    Rebuilder,
    Result,
    flatten_result,
    output_rebuilder,
)
from fxviews.passes.compat.torch_internals import (
    any_autocast_enabled,
    disable_current_modes,
    is_functorch_wrapped_tensor,
    pytree,
    saved_tensors_hooks_deferred,
    temporarily_clear_interpreter_stack,
)
from fxviews.passes.random_state import generators_among
from fxviews.rewriting.printouts import logger, report_rewrite
from fxviews.rewriting.steps import rewrite_in_place
from fxviews.state.guard import ModuleCalls, StateGuard, process_state
from fxviews.state.layouts import layout_bound_constants, offset_bound_inputs
from fxviews.state.module_slots import NO_SLOTS, ModuleSlots
from fxviews.state.python_state import ArgumentContainers, Rebinding, why_refused
from fxviews.state.reachable import (
    held_by,
    of_type,
    reachable_generators,
    reachable_objects,
    submodules,
    uninitialized_lazy_modules,
)
from fxviews.tracing.autograd import restoring_grad_mode
from fxviews.tracing.capture import capture
from fxviews.tracing.failures import EAGER_CAUSES, TracingError, definition_line, function_name
from fxviews.tracing.lock import tracing_lock
from fxviews.tracing.modes import autocast_free, autocast_off
from fxviews.tracing.recording import reads_values_into_shape
from fxviews.tracing.samples import is_batched, untraced_kind
from fxviews.tracing.scalar_values import keep_item_values_as_tensors

__all__ = ["Entry", "EntryBuilder", "TraceLater"]


@dataclass(slots=True)
class Entry:
    """One cached graph and how to map arguments to it and its outputs back to ``fn``'s.

    ``forward`` is None when ``fn`` cannot be traced for this signature (its result depends on
    tensor values) and runs eagerly; ``eager_reason`` then says why. ``guard`` holds the state it
    was traced in.
    """

    # The graph module's generated forward itself: a traced graph has no hooks, so
    # nn.Module.__call__ would only add overhead to every call.
    forward: Callable[..., list[Any]] | None
    guard: StateGuard
    input_positions: tuple[int, ...] = ()
    # fn's output tree from the graph's flat outputs (constants of the signature included).
    rebuild: Rebuilder | None = None
    # Unhashable non-tensor arguments are keyed by id(); holding them keeps the ids unique.
    keepalive: tuple[Any, ...] = ()
    eager_reason: str | None = None
    # The cache clock's tick at the last call that used this entry (Note [The cached call]).
    last_used: int = 0
    # For the hot call: how many positional tensors it takes, and the C++ check that a call's
    # tensors are of the kind it last ran on (keys.hot_check); unset until a call
    # with positional tensors only runs it.
    arity: int = -1
    same_kind: Callable[..., bool] | None = None
    # The storage offsets of graph inputs the graph reads memory of by position (Note [The
    # layout of a call]): a call at other offsets needs another graph.
    offsets: Offsets = ()
    # The module slots whose tensors the graph takes after the call's (Note [Parameters are
    # read when the graph runs]), and the C++ check that what they hold is of the kind traced.
    slots: ModuleSlots = NO_SLOTS
    slot_kind: Callable[..., bool] | None = None

    def slot_values(self) -> tuple[Any, ...] | None:
        """What the entry's slots hold now, if it is what the graph was traced for; else None.

        Example::

            >>> entry.forward(*tensors, *entry.slot_values())
        """
        values = self.slots.read()
        if values and (
            not self.slot_kind(*values)  # type: ignore[misc]
            or (self.slots.alias_of and not self.slots.aliases_hold(values))
        ):
            return None
        return values


class TraceLater(Exception):  # noqa: N818 - a signal, not an error users see
    """``fn`` cannot be traced for this call, and may be for a later one: run it eagerly.

    ``reason`` is what to log once the eager call succeeds (None: nothing worth saying).
    """

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


class _TracedGraph(NamedTuple):
    """What steps 3 and 4 of the Note give: the graph's forward and how to call it (the
    call's tensors, then what the slots it reads hold), and what the guard needs of the trace
    (the held tensors whose layout it read)."""

    forward: Callable[..., list[Any]]
    input_positions: tuple[int, ...]
    rebuild: Rebuilder
    offsets: Offsets
    slots: ModuleSlots
    slot_kind: Callable[..., bool] | None
    layout_bound: list[torch.Tensor]


class EntryBuilder:
    """Builds the cache entries of one transformed function (Note [Building a cache entry]).

    It remembers one thing between builds: whether a trace of ``fn`` was refused for rebinding
    Python state, since the first refusal traces again at the next call and a second is
    ``fn``'s nature.

    Example::

        >>> builder = EntryBuilder(f, strict=False, functionalize=False)
        >>> leaves, spec = pytree.tree_flatten(((x,), {}))
        >>> entry = builder.build(spec, leaves, keepalive=())
        >>> entry.guard.check()
        True
    """

    def __init__(self, fn: Callable[..., Any], *, strict: bool, functionalize: bool) -> None:
        self.fn = fn
        self.strict = strict
        self.functionalize = functionalize
        self.rebinds = False  # whether a trace of fn rebound Python state once already

    def build(self, spec: pytree.TreeSpec, leaves: list[Any], keepalive: tuple[Any, ...]) -> Entry:
        """Trace ``fn`` for this signature in the state now in force; the entry, guard finished.

        Returns an eager entry where ``fn``'s result depends on tensor values (cached: no later
        call can trace it), and raises :class:`TraceLater` where ``fn`` cannot be traced now
        but may be later (run it eagerly this once, trace again next call). An exception
        ``fn``'s own code raises propagates unchanged (:func:`fxviews.tracing.capture.capture`).
        """
        process = process_state()  # the caller's state, before the trace can change anything
        reached = list(reachable_objects(self.fn))
        modules = _modules_among(reached)
        lazy = uninitialized_lazy_modules(modules)
        if lazy:
            if self.strict:
                raise TracingError(
                    f"fxviews.transform cannot trace {function_name(self.fn)} before its lazy "
                    f"modules ({', '.join(type(m).__name__ for m in lazy)}) create their "
                    f"parameters: call it once without strict=True, or call the module once.",
                    "lazy module",
                )
            raise TraceLater(None)  # their first call creates the parameters, quietly
        slots = ModuleSlots.of(modules)
        try:
            with ModuleCalls() as run:
                _check_traced_kinds(self.fn, leaves)
                _check_no_lazy_bits(self.fn, leaves)
                _check_no_captured_wrappers(self.fn, reached)
                generators = generators_among([leaves, reachable_generators(reached)])
                traced = self._trace_keeping_state(spec, leaves, slots, reached, generators)
        except TracingError as err:
            if self.strict:
                raise
            if err.cause in EAGER_CAUSES:  # the function's nature: no later call traces it
                logger.warning(
                    "%s For this input signature fxviews.transform runs %s eagerly (no graph).",
                    err,
                    function_name(self.fn),
                )
                return Entry(
                    forward=None,
                    guard=StateGuard.for_eager_calls(process, [*run.modules, *modules]),
                    keepalive=keepalive,
                    eager_reason=str(err),
                )
            # Not the function's nature: a state not ready yet, or fxviews' limit. Eager decides
            # this call (its exception, if any, is the user's), and the next call traces again.
            raise TraceLater(str(err)) from err
        # The modules that ran and were not reached hold tensors the graph keeps as constants.
        guard = StateGuard(
            process, modules, holders=run.modules, reached=reached, held=traced.layout_bound
        )
        return Entry(
            forward=traced.forward,
            guard=guard,
            input_positions=traced.input_positions,
            rebuild=traced.rebuild,
            keepalive=keepalive,
            offsets=traced.offsets,
            slots=traced.slots,
            slot_kind=traced.slot_kind,
        )

    def _trace_keeping_state(
        self,
        spec: pytree.TreeSpec,
        leaves: list[Any],
        slots: ModuleSlots,
        reached: list[Any],
        generators: list[torch.Generator],
    ) -> _TracedGraph:
        """:meth:`_trace`, refusing a trace that rebinds or changes Python state ``fn`` reaches
        or is passed, which the graph cannot replay (Note [Python state a trace rebinds]);
        whatever the trace changed is put back, so the call runs as eager does. The first
        refusal of a function traces again at the next call (a lazy ``if self.buf is None:
        self.buf = ...`` rebinds once); a second one is its nature: it runs eagerly for this
        signature."""
        rebinding = Rebinding([*reached, *leaves], reached)
        changed = [f"reaches {iterator}" for iterator in rebinding.iterators]
        in_arguments: set[str] = set()
        if not changed:  # an iterator's item, once taken, cannot be put back: no trace
            try:
                traced = self._trace(spec, leaves, slots, reached, generators, in_arguments)
            except TracingError:
                rebinding.undo()
                raise
            except Exception as err:  # fn's own: the Python state it wrote first is eager's
                if rebinding.undo() or in_arguments:
                    raise TraceLater(None) from err  # the call runs eagerly, and raises there
                raise
            changed = rebinding.undo() + sorted(in_arguments)
            if not changed:
                return traced
        message = why_refused(f"{function_name(self.fn)}{definition_line(self.fn)}", changed)
        if self.rebinds:
            raise TracingError(message, "rebinds Python state")
        self.rebinds = True
        raise TraceLater(message)

    def _trace(
        self,
        spec: pytree.TreeSpec,
        leaves: list[Any],
        slots: ModuleSlots,
        reached: list[Any],
        generators: list[torch.Generator],
        changed_arguments: set[str],
    ) -> _TracedGraph:
        """Trace and rewrite ``fn``'s graph for this signature, taking the call's tensors and
        then what ``slots`` hold (Note [Parameters are read when the graph runs]);
        ``reached``: the objects ``fn`` reaches (its result may hand them out: Note [What fn
        returns]); ``generators``: those of the call's ``leaves`` and those ``fn`` reaches
        (Note [Which generators to fork]); what a run of ``fn`` changes in its arguments goes
        to ``changed_arguments``."""
        positions = tuple(i for i, leaf in enumerate(leaves) if of_type(leaf, torch.Tensor))
        count = len(positions)
        held = [slots]  # the slots the graph reads: all while tracing, then those it reads
        # The signature's other leaves: flat_fn may run again eagerly (_eager_when_batched),
        # and must not keep this call's tensors alive.
        template = [None if i in positions else leaf for i, leaf in enumerate(leaves)]
        out_info: dict[str, Any] = {}
        before = {id(obj) for obj in (*reached, *held_by(reached), *template)}

        def known(obj: Any) -> bool:  # an object fn reached before the call
            return id(obj) in before

        def flat_fn(*tensors: torch.Tensor) -> list[Any]:
            filled = list(template)
            for position, tensor in zip(positions, tensors[:count], strict=True):
                filled[position] = tensor
            args, kwargs = pytree.tree_unflatten(filled, spec)
            containers = ArgumentContainers(self.fn, args, kwargs)
            with held[0].holding(tensors[count:]) as rebound:
                out = self.fn(*args, **kwargs)
            changed_arguments.update(f"rebinds the module attribute {k}" for k in rebound)
            returned = out_info["returned"] = flatten_result(out, known)  # Note [What fn returns]
            changed_arguments.update(containers.changed())
            return [o for o in returned.leaves if isinstance(o, GRAPH_OUTPUT_TYPES)]

        name = function_name(self.fn)
        # The engine verifies rewrites on meta tensors: that work must not be recorded by (or
        # batched under) the transforms or tracers this call happens inside either.
        with _outside_transforms():
            traced = torch.func.functionalize(flat_fn) if self.functionalize else flat_fn
            slot_values = slots.read()
            tensors = [*(leaves[i] for i in positions), *slot_values]
            gm = capture(
                traced,
                tensors,
                fresh=True,
                caller="fxviews.transform",
                name=name,
                generators=generators,
                held=len(slot_values),
            )
            _check_returns_no_object_made(self.fn, out_info["returned"])
            read = _drop_unread_slots(gm, count)
            held[0] = slots.keep(read)
            slot_values = tuple(slot_values[i] for i in read)
            tensors = tensors[:count] + list(slot_values)
            bound = offset_bound_inputs(gm)
            offsets = offsets_of(tensors, [p for p in bound if p < count])
            slot_offsets = offsets_of(slot_values, [p - count for p in bound if p >= count])
            layout_bound = layout_bound_constants(gm)
            if keep_item_values_as_tensors(gm):  # batchable under vmap, as the graph runs
                gm.recompile()
            # The graph holds autocast's casts (Note [Modes inside fn]): what the rewrite
            # computes once, it computes as the graph runs, with autocast off.
            with autocast_off():
                result = rewrite_in_place(gm, strict=self.strict, bind_calls=True, fx_code=False)
        # Made in the caller's dispatch state, which the C++ check compares dispatch keys under.
        slot_kind = hot_check(slot_values, slot_offsets) if slot_values else None
        report_rewrite(result, source=f"transform({name})")
        # A call that raises inside a grad-mode region leaves the caller's mode as fn's `with`
        # would (Note [What autograd sees is part of the trace]).
        graph_module = result.graph_module
        forward = restoring_grad_mode(run_only_forward(graph_module), graph_module.graph)
        if any_autocast_enabled():  # the caller's autocast must not cast the graph's ops again
            forward = autocast_free(forward)
        if _has_dynamic_output_shape(graph_module.graph):
            forward = _eager_when_batched(forward, flat_fn)
        returned: Result = out_info["returned"]
        from_graph = [isinstance(leaf, GRAPH_OUTPUT_TYPES) for leaf in returned.leaves]
        constants = [leaf for leaf in returned.leaves if not isinstance(leaf, GRAPH_OUTPUT_TYPES)]
        rebuild = output_rebuilder(returned.spec, from_graph, constants)
        return _TracedGraph(forward, positions, rebuild, offsets, held[0], slot_kind, layout_bound)


def _modules_among(reached: list[Any]) -> list[torch.nn.Module]:
    """The modules among the objects a function reaches (see
    :func:`fxviews.state.reachable.reachable_objects`), each with its submodules, but those
    whose own attributes do not read (a ``__getattribute__`` of the user's that raises: no
    call of theirs could run, and fxviews reads their mode, hooks and tensors)."""
    return [
        module
        for obj in reached
        if of_type(obj, torch.nn.Module)
        for module in submodules(obj)
        if _attributes_read(module)
    ]


def _attributes_read(module: torch.nn.Module) -> bool:
    try:
        module.__dict__, module.training  # noqa: B018 - the reads are the check
    except Exception:  # noqa: BLE001 - the user's __getattribute__, theirs to fail
        return False
    return True


def _has_dynamic_output_shape(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` calls an op whose output shape depends on tensor values (``nonzero``,
    which ``argwhere`` and boolean-mask indexing trace into). ``index`` is tagged so for its
    boolean masks; with integer indices its shape is theirs, and vmap batches it."""
    return any(
        torch.Tag.dynamic_output_shape in getattr(node.target, "tags", ())
        and reads_values_into_shape(
            node.target, pytree.tree_map_only(torch.fx.Node, _value, node.args)
        )
        for node in graph.nodes
        if node.op == "call_function"
    )


def _value(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def _eager_when_batched(
    forward: Callable[..., list[Any]], flat_fn: Callable[..., list[Any]]
) -> Callable[..., list[Any]]:
    """``forward``, except that a call with a tensor batched by ``vmap`` runs ``fn`` eagerly.

    vmap refuses to batch an op with a data-dependent output shape (``nonzero`` raises "We do
    not support batching operators that can output dynamic shape"), while eager ``vmap(fn)``
    may still run: an op without a batching rule that calls it (``argwhere``) runs once per
    sample, and an empty sample has a static result. So such a graph runs only where nothing
    is batched, and ``fn`` itself, under the caller's transforms, everywhere else: whatever
    eager vmap does, values or error. ``flat_fn`` gives ``fn``'s outputs as the graph does.

    Example::

        >>> torch.func.vmap(fxviews.transform(torch.argwhere))(torch.zeros(3, 0, 4)).shape
        torch.Size([3, 0, 2])
    """

    def run(*tensors: Any) -> list[Any]:
        if not any(is_batched(t) for t in tensors):
            return forward(*tensors)
        # Eager torch.func is not thread-safe: eager calls hold the tracing lock (_GraphCache.call).
        with tracing_lock:
            return flat_fn(*tensors)

    return run


@contextlib.contextmanager
def _outside_transforms() -> Iterator[None]:
    """Step out of every active torch.func transform and dispatch mode, in the caller's grad mode,
    with the caller's saved-tensor hooks not called.

    The graph is cached and reused from any transform context, so it must not depend on where
    the first call happened: enclosing transforms are re-applied when the graph runs on the real
    arguments. Grad mode is part of the entry's guard, and stays the caller's (inference mode,
    which would make the trace's tensors inference tensors, is left with grad mode as it was).
    The caller's saved-tensor hooks (a ``torch.utils.checkpoint`` around the call counts what
    they pack) must see what the graph saves when it runs, as eager's ops, and never the trace's
    tensors: they stay pushed, so the trace still refuses hooks ``fn`` pushes itself (Note [What
    autograd sees is part of the trace]), and a ``torch.func`` transform inside ``fn`` refuses
    them as eager's does.
    """
    grad_enabled = torch.is_grad_enabled()
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporarily_clear_interpreter_stack())
        stack.enter_context(disable_current_modes())
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.set_grad_enabled(grad_enabled))
        stack.enter_context(saved_tensors_hooks_deferred())
        yield


def _check_returns_no_object_made(fn: Callable[..., Any], returned: Result) -> None:
    """Refuse a trace whose result holds an object ``fn`` makes on each call (Note [What fn
    returns], item 3), or a tensor of a kind no trace runs on (a nested tensor ``fn`` makes
    came back holding the trace's fake offsets): the signature runs eagerly, so each call gets
    its own."""
    _check_traced_kinds(fn, returned.leaves, returned=True)
    if returned.made is not None:
        raise TracingError(
            f"fxviews.transform does not trace {function_name(fn)}{definition_line(fn)}: it "
            f"returns {returned.made} it makes on each call, which a cached graph would hand out "
            f"once for every call. It runs eagerly; return tensors, numbers, or containers or "
            f"dataclasses of them to have it traced (Note [What fn returns]).",
            "returns an object",
        )


def _check_traced_kinds(fn: Callable[..., Any], leaves: list[Any], returned: bool = False) -> None:
    """Refuse a call passing (or, ``returned``, a result holding) a tensor of a kind no trace
    runs on (quantized, nested, sparse, oneDNN: :func:`~fxviews.tracing.samples.untraced_kind`):
    that signature runs eagerly."""
    for leaf in leaves:
        kind = untraced_kind(leaf) if of_type(leaf, torch.Tensor) else None
        if kind is not None:
            what = f", which returns {kind}" if returned else f" for {kind} argument"
            raise TracingError(
                f"fxviews.transform does not trace {function_name(fn)}{definition_line(fn)}"
                f"{what}: a trace runs on dense strided tensors, whose views and layouts it "
                f"would decide for this one. It runs eagerly for this signature.",
                "tensor kind",
            )


def _check_no_lazy_bits(fn: Callable[..., Any], leaves: list[Any]) -> None:
    """Refuse a call passing a tensor with the lazy conjugate or negative bit (``z.conj()``,
    ``z.conj().imag``).

    The trace's samples are plain tensors: ``fn`` would be recorded reading ``is_conj()`` as
    False and ``resolve_conj()`` as a no-op, and the graph, run on the caller's tensor, would
    write into its memory where eager writes into a resolved copy. Such a call runs eagerly.
    """
    for leaf in leaves:
        if of_type(leaf, torch.Tensor) and (leaf.is_conj() or leaf.is_neg()):
            bit = "conjugate" if leaf.is_conj() else "negative"
            raise TracingError(
                f"fxviews.transform does not trace {function_name(fn)}{definition_line(fn)} for "
                f"an argument with PyTorch's lazy {bit} bit (a view like z.conj() or "
                f"z.conj().imag): pass x.resolve_conj() / x.resolve_neg() to have it traced.",
                "lazy conjugate",
            )


def _check_no_captured_wrappers(fn: Callable[..., Any], reached: list[Any]) -> None:
    """Refuse an ``fn`` that reaches (``reached``) a tensor wrapped by an enclosing transform.

    Traced outside the transforms, such a tensor becomes a plain constant of the graph: under
    ``grad`` or ``jvp`` its derivative would silently be zero. Everything ``fn`` reaches
    statically is searched (:func:`fxviews.guards.reachable_objects`: closures, defaults,
    partial arguments, globals its code reads); tensors reached another way (attributes) are
    not, and vmap-wrapped ones are caught while tracing.
    """
    for obj in reached:
        if of_type(obj, torch.Tensor) and is_functorch_wrapped_tensor(obj):
            raise TracingError(
                f"fxviews.transform cannot trace {function_name(fn)}{definition_line(fn)}: it "
                f"closes over a tensor wrapped by an enclosing torch.func transform, whose "
                f"derivative or batch dim the cached graph would lose. Pass that tensor as an "
                f"argument.",
                "closure over a transformed tensor",
            )


def _drop_unread_slots(gm: torch.fx.GraphModule, count: int) -> list[int]:
    """Erase the inputs of ``gm`` after its first ``count`` (the slots') that nothing reads; the
    positions, among the slots, of those it keeps."""
    inputs = [node for node in gm.graph.nodes if node.op == "placeholder"][count:]
    read = [i for i, node in enumerate(inputs) if node.users]
    if len(read) < len(inputs):
        for node in inputs:
            if not node.users:
                gm.graph.erase_node(node)
        gm.recompile()
    return read
