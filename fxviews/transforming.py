"""``fxviews.transform`` and ``fxviews.explain``: the function-level front door.

``transform(fn)`` traces ``fn`` once per input signature into an aten graph, rewrites the graph's
``as_strided`` nodes into view ops, and runs that graph instead of ``fn``. Transforms applied
outside it (``vmap``, ``jvp``, ``grad``, ...) then see ordinary view ops, whose batching and
differentiation rules follow the real layout of their input, instead of ``as_strided`` calls
that hard-code the layout of the example they were traced on.

Note [The cached call]
~~~~~~~~~~~~~~~~~~~~~~
Hot loops call a transformed function with the same positional tensors again and again, so a
cache hit for such a call costs as little as the checks it must make. It is written out in the
``transformed`` closure itself, since each Python call layer costs about as much as a check:

1. **The hot call.** The cache remembers the entry the last call of positional tensors ran
   (``_GraphCache.hot``), with a C++ check that tensors are of the kind that call passed
   (:func:`fxviews.call_layouts.hot_check`, Dynamo's ``TensorGuards``: type, dispatch keys,
   dtype, device, ``requires_grad``, sizes, strides of the tensors no vmap batches; ~80 ns a
   tensor). A call whose tensors pass it has that entry's signature, since the check is
   stricter than the key below, and needs no key, hash or lookup: ~1.1 us over the graph's
   own call in all (bench row 5), against ~2.2 us with the key.
2. **The key.** Any other call of positional tensors is keyed by the tuple of each tensor's
2. **The key.** Any other call of positional tensors is keyed by the tuple of each tensor's
   ``(shape, dtype, device, requires_grad, strides)`` (the strides of the sample it is traced
   on: Note [The layout of a call]; requires_grad: the trace's tensors require grad where the
   call's do, Note [What autograd sees is part of the trace]; ~0.5 us a tensor) and looked up;
   the entry it finds becomes the hot one. Where that entry was already hot, the call's
   tensors differ from the checked ones only in what the key leaves out (a subclass, dispatch
   keys, a direct call's strides against a batched one's): the check is remade from them
   (~1.5 us, once per change of kind). Every other call (keywords, non-tensor or nested
   arguments) takes the general key, pytree spec plus leaf keys
   (:meth:`_GraphCache.lookup`), and never becomes hot; the two kinds of key never compare
   equal, since a TreeSpec is not such a tuple. A graph that reads an argument's memory by
   position is also held to its storage offset, checked with the key and in the hot check.
3. **The state.** A key maps to the entries traced for it, most recently used first; each
   entry holds the guard of the state it was traced in (Note [The state a graph bakes in]:
   process state and module modes). A hit is that guard passing (~0.2 us, and ~50 ns per
   module the function reaches); otherwise the call looks through the others, and traces a
   new one for the state now in force if none passes. The entry it runs becomes the hot one.
4. **The LRU order.** Entries are read without a lock, and a hit stamps its entry with the
   next tick of the cache's clock (``itertools.count``, whose ``next`` is atomic). The least
   recently used entry is the one with the oldest stamp, found when a miss overflows the
   cache (an evicted hot entry stops being hot). An ``OrderedDict`` kept in use order would
   need ``move_to_end`` on every hit, which hashes the key again; eviction, which pays
   instead, is rare and runs next to a trace that takes milliseconds.
5. Misses, guard failures, eager signatures (``fn`` could not be traced) and general keys go
   through :meth:`_GraphCache.call`, which builds entries under the tracing lock.
6. **The graph's own code.** An entry's graph is one only fxviews runs, so it is built to run
   (``rewrite_in_place(bind_calls=True)``): its ops are called through PyTorch's Python
   bindings where proven the same call, its constants read from the module's instance dict,
   and what it computes from no input computed once (Notes [Calling ops through their Python
   bindings] and [Results that depend on no input]): about a microsecond less per op, which
   on small programs under ``vmap`` is the difference to eager (bench row 12). Its code is
   written by :mod:`fxviews.graph_code` (Note [The code of a graph only run]), not FX.

Under ``vmap`` the arguments are BatchedTensor wrappers, whose ``shape``/``dtype``/``device``
are the logical per-sample ones, read in C++ like a plain tensor's; the hot call's check,
made from such wrappers, passes only BatchedTensors of those logical sizes.

Note [A transformed function inside torch.compile]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo traces Python it meets into its graph, and would trace ``transformed`` itself: its
cache, locks and guards, none of which it can put in a graph, each refused with a warning
(and under ``fullgraph=True`` an error about ``TensorGuards.check``); after each refusal it
would compile the frames the call runs, the user's function while fxviews records it among
them. Inlining ``fn`` instead would give eager's reading of its ``as_strided`` nodes, not the
transform's, and inlining the cached graph would hide the guards (module modes among them)
from Dynamo's own: a stale graph after ``model.eval()``. So Dynamo is kept out of it as
``torch.compiler.disable`` would (:func:`~fxviews.passes.torch_internals.run_outside_dynamo`,
which costs a call nothing, where that wrapper costs ~0.6 us): the function ``transform``
returns carries the mark Dynamo reads (a graph break at a call of it, with the reason given
here), and its code runs, with every frame it calls, as plain Python: through the cache as
outside ``torch.compile`` (its guards, its graph), the user's function included while it is
recorded. ``torch.compile(outer, backend="fxviews")`` puts the whole of ``outer`` in one
rewritten graph instead.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import torch

from fxviews.arguments import check_call, check_flags
from fxviews.autograd_structure import restoring_grad_mode
from fxviews.call_keys import leaf_key, positional_key
from fxviews.call_layouts import (
    Offsets,
    hot_check,
    is_batched,
    layout_bound_constants,
    offset_bound_inputs,
    offsets_hold,
    offsets_of,
)
from fxviews.failure_messages import definition_line
from fxviews.graph_code import run_only_forward
from fxviews.graph_rewriting import RewriteResult, rewrite_in_place
from fxviews.guards import (
    ModuleCalls,
    StateGuard,
    reachable_generators,
    reachable_objects,
    read_training,
    uninitialized_lazy_modules,
)
from fxviews.passes.random_state import generators_among
from fxviews.passes.torch_internals import (
    disable_current_modes,
    is_functorch_wrapped_tensor,
    pytree,
    run_outside_dynamo,
    saved_tensors_hooks_deferred,
    temporarily_clear_interpreter_stack,
)
from fxviews.printouts import logger, report_rewrite
from fxviews.python_state import ArgumentContainers, Rebinding, why_refused
from fxviews.rebuilding import Rebuilder, output_rebuilder
from fxviews.recording import reads_values_into_shape
from fxviews.rewriting import rewrite
from fxviews.scalar_values import keep_item_values_as_tensors
from fxviews.tracing import (
    EAGER_CAUSES,
    TracingError,
    capture,
    function_name,
    trace,
    tracing_in_progress,
    tracing_lock,
)

__all__ = ["CacheInfo", "explain", "transform"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: How many input signatures a transformed function remembers by default.
DEFAULT_CACHE_SIZE = 32

#: Why Dynamo graph-breaks at a transformed function (Note [A transformed function inside
#: torch.compile]); Dynamo shows it in graph-break logs and fullgraph errors.
_OUTSIDE_DYNAMO = (
    "fxviews.transform runs its own cached, rewritten graph with its own guards; to compile "
    "the caller as one rewritten graph, use torch.compile(caller, backend='fxviews')"
)


# What the traced graph itself returns: tensors, and the symbolic scalars that `.item()` and
# friends produce while tracing (they are computed again on every run).
_GRAPH_OUTPUT_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


class CacheInfo(NamedTuple):
    """Statistics of a transformed function's graph cache, like ``functools.lru_cache``'s.

    ``eager`` counts the cached entries that run ``fn`` eagerly because its result depends on
    tensor values in a way one graph cannot capture (see :func:`transform`). ``currsize``
    counts entries: one per input signature and state traced in.
    """

    hits: int
    misses: int
    maxsize: int
    currsize: int
    eager: int = 0


def transform(
    fn: _F,
    *,
    strict: bool = False,
    cache_size: int = DEFAULT_CACHE_SIZE,
    functionalize: bool = False,
) -> _F:
    """Return a function that computes ``fn`` with a traced graph free of layout-baked as_strided.

    On every call the arguments' signature (pytree structure; each tensor's logical shape,
    dtype, device, ``requires_grad`` and traced strides; every other value) and the state
    eager PyTorch would read afresh (grad mode, autocast, the default dtype and the rest of the
    process state ``torch.compile`` guards on; the ``training`` flag of every module ``fn``
    reaches: see *Guards* in the README) select a cached graph. On a miss, ``fn`` is traced on
    fresh tensors of those shapes in that state (each sample of a batched argument contiguous,
    any other argument in its own layout: Note [The layout of a call]; requiring grad where
    the call's do: see docs/autograd.md), outside any enclosing ``torch.func`` transform; its
    ``as_strided`` nodes are rewritten into view ops by :func:`fxviews.rewrite`, dead nodes
    are dropped, and the graph is cached (``cache_size`` entries, least recently used first
    out). The graph then runs on the actual arguments, so ``vmap``, ``jvp``, ``grad``,
    ``vjp``, ``jacfwd``, ``jacrev``, ``hessian`` and their compositions applied around the
    result see plain aten ops and are right for any memory layout, for example a batch dim
    that is not first in memory. ``fn`` may itself use ``torch.func`` transforms.

    Each ``as_strided`` in ``fn`` (written by you or emitted by forward AD/autograd) is read
    relative to the layout its input had when traced: the argument's own where it is called
    directly (eager's numbers), a contiguous sample's under ``vmap``. ``reshape``, ``flatten``,
    ``contiguous()`` and their kin decide view or copy when the graph runs (Note [Layout
    decisions at run time]).

    Tracing records ``fn``'s ops on one sample's real values (one per-sample eager call of
    compute), and goes on to fake mode wherever values could leave the graph (``.item()``,
    boolean masks, ``tolist``), as :func:`fxviews.trace` traces; see *Tracing real programs*
    in docs/transform.md. Where
    ``fn`` cannot be one graph at all (Python control flow on tensor values, shapes computed
    from tensor values), the transformed function runs ``fn`` eagerly for that signature, as
    ``torch.compile`` does at a graph break: it warns once through the ``fxviews`` logger and
    counts the signature in ``cache_info().eager``. Any other failure of a first call is not
    cached: an exception ``fn`` raises propagates unchanged, and where fxviews cannot trace
    ``fn`` (an uninitialized lazy module, a limitation of the tracer) this call runs eagerly
    and the next one traces again. ``strict=True`` raises :class:`fxviews.TracingError`
    instead of running ``fn`` eagerly. A transformed function called while another is traced
    (or under :func:`fxviews.trace`) is traced through, as part of the outer graph.

    Calls leave the state eager calls leave: buffers (BatchNorm's running statistics),
    parameters, closed-over tensors and the random stream are updated once per call, by the
    graph; the trace puts back whatever it wrote outside its own tensors.

    Tracing, cache updates and eager calls hold one process-wide lock (``torch.func`` code,
    traced or eager, is not reentrant across threads); calls that find their graph in the cache
    take no lock, so a transformed function may be called from many threads at once.

    Args:
        fn: the function to transform. Non-tensor arguments are part of the signature and
            baked into the graph. ``fn`` may close over real tensors (parameters, buffers):
            the graph uses them by reference.
        strict: raise :class:`fxviews.UnsafeAsStridedError` instead of keeping an as_strided
            node that cannot be proven expressible with view ops, and
            :class:`fxviews.TracingError` instead of running ``fn`` eagerly when it cannot be
            traced.
        cache_size: how many signatures to keep graphs for (at least 1).
        functionalize: trace ``torch.func.functionalize(fn)``: mutations of intermediates
            become out-of-place ops, so no aliasing inside the graph is observable and every
            ``view`` can become a layout-portable ``reshape``. Mutations of ``fn``'s inputs
            still happen (copied back at the end). Off by default: outputs then no longer
            alias inputs, and forward AD (``jvp``, ``jacfwd``, ``hessian``) applied around
            the result cannot differentiate the functional ``copy`` it introduces.

    Returns:
        A function with ``fn``'s signature (``functools.wraps``), plus ``cache_info()`` and
        ``cache_clear()``.

    Raises:
        TypeError: ``fn`` is not callable.
        TracingError: at call time with ``strict=True``, when ``fn`` cannot be traced.

    Example::

        >>> def f(x, y):
        ...     x = x.clone()
        ...     view = x[0]
        ...     x.copy_(y)
        ...     return view, x
        >>> def push_jvp(x, y, yt):
        ...     return torch.func.jvp(functools.partial(f, x), (y,), (yt,))
        >>> batched = torch.func.vmap(fxviews.transform(push_jvp), in_dims=(1, 2, 2))
        >>> primals, tangents = batched(x, y, yt)   # right for every batch position
    """
    if not callable(fn):
        raise TypeError(f"fxviews.transform expects a callable, got {type(fn).__name__}")
    check_flags("fxviews.transform", strict=strict, functionalize=functionalize)
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
    cache = _GraphCache(fn, strict=strict, maxsize=cache_size, functionalize=functionalize)
    clock = cache.clock  # the cache's own (never replaced)

    @functools.wraps(fn)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        # The hot call, written out (Note [The cached call]): the entry the last
        # positional call used, if these tensors are of the kind it was checked against.
        entry = cache.hot
        if (
            kwargs or entry is None or len(args) != entry.arity or not entry.same_kind(*args)  # type: ignore[misc]
        ):
            entry = None if kwargs else cache.positional_hit(args)
            if entry is None:
                return cache.call(args, kwargs)
        guard = entry.guard
        # StateGuard.check, written out.
        if (
            not guard.check_process()
            or (guard.modules and tuple(map(read_training, guard.modules)) != guard.trainings)
            or (guard.bound and not guard.bindings_hold())
        ):
            return cache.call(args, kwargs)
        cache.hits += 1
        entry.last_used = next(clock)
        return entry.rebuild(entry.forward(*args))  # type: ignore[misc]

    # Note [A transformed function inside torch.compile]
    run_outside_dynamo(transformed, _OUTSIDE_DYNAMO)  # type: ignore[arg-type]
    transformed.cache_info = cache.info  # type: ignore[attr-defined]
    transformed.cache_clear = cache.clear  # type: ignore[attr-defined]
    return transformed  # type: ignore[return-value]


def explain(fn: Callable[..., Any], *args: Any, strict: bool = False) -> RewriteResult:
    """Trace ``fn(*args)`` and rewrite it: ``fxviews.rewrite(fxviews.trace(fn, *args))``.

    For debugging: print the result to see every as_strided node, what it became and why, and
    the diff of the graph code. The trace reads ``args`` as they are, layout included (unlike
    :func:`transform`, which traces each batched sample as a fresh contiguous tensor); call it
    outside ``torch.func``
    transforms.

    Example::

        >>> print(fxviews.explain(push_jvp, x, y, yt))
    """
    check_flags("fxviews.explain", strict=strict)
    return rewrite(trace(fn, *args), strict=strict)


@dataclass(slots=True)
class _Entry:
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
    # tensors are of the kind it last ran on (call_layouts.hot_check); unset until a call
    # with positional tensors only runs it.
    arity: int = -1
    same_kind: Callable[..., bool] | None = None
    # The storage offsets of graph inputs the graph reads memory of by position (Note [The
    # layout of a call]): a call at other offsets needs another graph.
    offsets: Offsets = ()


class _GraphCache:
    """A bounded LRU map from input signatures to traced, rewritten graphs of one function.

    Each signature maps to the entries traced for it, one per state they were traced in
    (Note [The cached call]). Lookups take no lock: a hit only reads the map and stamps the
    entry with ``clock``'s next tick. Misses build under the process-wide tracing lock, and look
    again once they hold it, so threads missing on the same signature trace it once; one that
    overflows the map evicts the entry with the oldest stamp.
    """

    def __init__(
        self, fn: Callable[..., Any], *, strict: bool, maxsize: int, functionalize: bool
    ) -> None:
        self.fn = fn
        self.strict = strict
        self.functionalize = functionalize
        self.maxsize = maxsize
        self.entries: dict[Any, list[_Entry]] = {}
        # The entry the last positional call ran, checked first by the next (the hot call).
        self.hot: _Entry | None = None
        self.clock = itertools.count(1)  # ticks of use: an entry's last_used is one of them
        self.hits = 0
        self.misses = 0
        self.reported: set[str] = set()  # reasons already logged for calls run eagerly
        self.rebinds = False  # whether a trace of fn rebound Python state (_build_graph_...)

    def positional_hit(self, args: tuple[Any, ...]) -> _Entry | None:
        """The first entry of the signature of ``args``, positional tensors only, made the hot
        one; None for other calls and where it has none or runs eagerly. Its state guard is the
        caller's to check. Counts no hit."""
        key = positional_key(args)
        traced = self.entries.get(key) if key is not None else None
        if not traced or traced[0].forward is None or not offsets_hold(args, traced[0].offsets):
            return None
        self._make_hot(traced[0], args)
        return traced[0]

    def _make_hot(self, entry: _Entry, args: tuple[Any, ...]) -> None:
        # A hot entry reached again by the key failed its check: these tensors are of another
        # kind (requires_grad, dispatch keys) than the ones it was checked against.
        if entry.same_kind is None or entry is self.hot:
            entry.same_kind = hot_check(args, entry.offsets)
            entry.arity = len(args)
        self.hot = entry

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` through the cache: the calls the hot call does not finish."""
        if tracing_in_progress():
            # Called while fxviews traces another function: its ops become part of that graph
            # (and that graph's rewrite), as any other function's would.
            return self.fn(*args, **kwargs)
        key = None if kwargs else positional_key(args)
        try:
            entry, tensors = self.lookup(args, kwargs, key)
        except _TraceLater as later:
            result = self._eager(args, kwargs)
            if later.reason is not None and later.reason not in self.reported:
                # Said once the call has succeeded: an exception of fn's is the user's to see.
                self.reported.add(later.reason)
                logger.warning(
                    "fxviews.transform ran %s eagerly for this call (no graph); the next call "
                    "traces again: %s",
                    function_name(self.fn),
                    later.reason,
                )
            return result
        if entry.forward is None:
            return self._eager(args, kwargs)
        if key is not None:
            self._make_hot(entry, args)
        return entry.rebuild(entry.forward(*tensors))  # type: ignore[misc]

    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Eager torch.func is not thread-safe (forward-AD levels and the functorch interpreter
        # state are process-wide): concurrent eager jvp calls return wrong tangents or crash
        # the process. Eager calls take the tracing lock, as traces do.
        with tracing_lock:
            return self.fn(*args, **kwargs)

    def lookup(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any
    ) -> tuple[_Entry, Sequence[Any]]:
        """The entry for this call's signature and state (built on a miss) and the tensors to
        run it on. Raises :class:`_TraceLater` where ``fn`` cannot be traced now but may be
        later, and the TypeError of a call ``fn``'s signature does not accept."""
        if key is not None:
            entry = self._get(key, args)
            if entry is None:
                check_call(self.fn, args, kwargs, function_name(self.fn))
                entry = self._insert(key, *pytree.tree_flatten((args, kwargs)), keepalive=())
            return entry, args
        leaves, spec = pytree.tree_flatten((args, kwargs))
        keepalive: list[Any] = []
        key = (spec, tuple(leaf_key(leaf, keepalive) for leaf in leaves))
        entry = self._get(key, [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)])
        if entry is None:
            check_call(self.fn, args, kwargs, function_name(self.fn))
            entry = self._insert(key, leaves, spec, keepalive=tuple(keepalive))
        return entry, [leaves[i] for i in entry.input_positions]

    def _get(self, key: Any, tensors: Sequence[Any]) -> _Entry | None:
        """The entry of ``key`` whose guard passes now for ``tensors`` (a hit), moved first in
        its list."""
        entry = self._passing(key, tensors)
        if entry is not None:
            self.hits += 1
            entry.last_used = next(self.clock)
        return entry

    def _passing(self, key: Any, tensors: Sequence[Any]) -> _Entry | None:
        traced = self.entries.get(key, [])
        for position, entry in enumerate(traced):
            if entry.guard.check() and offsets_hold(tensors, entry.offsets):
                if position:
                    traced.insert(0, traced.pop(position))
                return entry
        return None

    def _insert(
        self, key: Any, leaves: list[Any], spec: pytree.TreeSpec, *, keepalive: tuple[Any, ...]
    ) -> _Entry:
        with tracing_lock:
            entry = self._passing(key, [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)])
            if entry is not None:  # built by another thread while this one waited
                return entry
            if key in self.entries:  # traced for this signature, in another state
                logger.debug(
                    "fxviews.transform traces %s again for this signature: %s changed",
                    function_name(self.fn),
                    self.entries[key][0].guard.failure(),
                )
            self.misses += 1
            entry = self._build(spec, leaves, keepalive)
            entry.last_used = next(self.clock)
            self.entries.setdefault(key, []).insert(0, entry)
            if sum(map(len, self.entries.values())) > self.maxsize:
                self._evict_least_recently_used()
            return entry

    def _evict_least_recently_used(self) -> None:
        key, oldest = min(
            ((key, entry) for key, traced in self.entries.items() for entry in traced),
            key=lambda item: item[1].last_used,
        )
        self.entries[key].remove(oldest)
        if not self.entries[key]:
            del self.entries[key]
        if oldest is self.hot:
            self.hot = None

    def info(self) -> CacheInfo:
        entries = [entry for traced in self.entries.values() for entry in traced]
        eager = sum(entry.forward is None for entry in entries)
        return CacheInfo(self.hits, self.misses, self.maxsize, len(entries), eager)

    def clear(self) -> None:
        with tracing_lock:
            self.entries.clear()
            self.hot = None
            self.hits = self.misses = 0

    def _build(
        self, spec: pytree.TreeSpec, leaves: list[Any], keepalive: tuple[Any, ...]
    ) -> _Entry:
        """Trace ``fn`` for this signature in the state now in force.

        Returns an eager entry where ``fn``'s result depends on tensor values (cached: no later
        call can trace it), and raises :class:`_TraceLater` where ``fn`` cannot be traced now
        but may be later (run it eagerly this once, trace again next call). An exception
        ``fn``'s own code raises propagates unchanged (:func:`fxviews.tracing.capture`).
        """
        guard = StateGuard()  # the caller's state, before the trace can change anything
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
            raise _TraceLater(None)  # their first call creates the parameters, quietly
        try:
            _check_no_lazy_bits(self.fn, leaves)
            _check_no_captured_wrappers(self.fn, reached)
            generators = generators_among([leaves, reachable_generators(reached)])
            entry = self._build_graph_keeping_state(
                spec, leaves, keepalive, guard, reached, generators
            )
        except TracingError as err:
            if self.strict:
                raise
            if err.cause in EAGER_CAUSES:  # the function's nature: no later call traces it
                logger.warning(
                    "%s For this input signature fxviews.transform runs %s eagerly (no graph).",
                    err,
                    function_name(self.fn),
                )
                return _Entry(
                    forward=None,
                    guard=guard.for_eager_calls(),
                    keepalive=keepalive,
                    eager_reason=str(err),
                )
            # Not the function's nature: a state not ready yet, or fxviews' limit. Eager decides
            # this call (its exception, if any, is the user's), and the next call traces again.
            raise _TraceLater(str(err)) from err
        guard.watch(modules)
        guard.watch_bindings(reached)
        return entry

    def _build_graph_keeping_state(
        self,
        spec: pytree.TreeSpec,
        leaves: list[Any],
        keepalive: tuple[Any, ...],
        guard: StateGuard,
        reached: list[Any],
        generators: list[torch.Generator],
    ) -> _Entry:
        """:meth:`_build_graph`, refusing a trace that rebinds or changes Python state ``fn``
        reaches or is passed, which the graph cannot replay (Note [Python state a trace
        rebinds]); whatever the trace changed is put back, so the call runs as eager does.
        The first refusal of a function traces again at the next call (a lazy ``if self.buf
        is None: self.buf = ...`` rebinds once); a second one is its nature: it runs eagerly
        for this signature."""
        rebinding = Rebinding([*reached, *leaves], reached)
        changed = [f"reaches {iterator}" for iterator in rebinding.iterators]
        in_arguments: set[str] = set()
        if not changed:  # an iterator's item, once taken, cannot be put back: no trace
            try:
                entry = self._build_graph(spec, leaves, keepalive, guard, generators, in_arguments)
            except TracingError:
                rebinding.undo()
                raise
            except Exception as err:  # fn's own: the Python state it wrote first is eager's
                if rebinding.undo() or in_arguments:
                    raise _TraceLater(None) from err  # the call runs eagerly, and raises there
                raise
            changed = rebinding.undo() + sorted(in_arguments)
            if not changed:
                return entry
        message = why_refused(f"{function_name(self.fn)}{definition_line(self.fn)}", changed)
        if self.rebinds:
            raise TracingError(message, "rebinds Python state")
        self.rebinds = True
        raise _TraceLater(message)

    def _build_graph(
        self,
        spec: pytree.TreeSpec,
        leaves: list[Any],
        keepalive: tuple[Any, ...],
        guard: StateGuard,
        generators: list[torch.Generator],
        changed_arguments: set[str],
    ) -> _Entry:
        """Trace and rewrite ``fn``'s graph for this signature; ``generators``: those of the
        call's ``leaves`` and those ``fn`` reaches (Note [Which generators to fork]); what a
        run of ``fn`` changes in its arguments goes to ``changed_arguments``."""
        positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
        # The signature's other leaves: flat_fn may run again eagerly (_eager_when_batched),
        # and must not keep this call's tensors alive.
        template = [None if i in positions else leaf for i, leaf in enumerate(leaves)]
        out_info: dict[str, Any] = {}

        def flat_fn(*tensors: torch.Tensor) -> list[Any]:
            filled = list(template)
            for position, tensor in zip(positions, tensors, strict=True):
                filled[position] = tensor
            args, kwargs = pytree.tree_unflatten(filled, spec)
            containers = ArgumentContainers(self.fn, args, kwargs)
            out_leaves, out_info["spec"] = pytree.tree_flatten(self.fn(*args, **kwargs))
            changed_arguments.update(containers.changed())
            out_info["from_graph"] = tuple(isinstance(o, _GRAPH_OUTPUT_TYPES) for o in out_leaves)
            out_info["constants"] = tuple(
                o for o in out_leaves if not isinstance(o, _GRAPH_OUTPUT_TYPES)
            )
            return [o for o in out_leaves if isinstance(o, _GRAPH_OUTPUT_TYPES)]

        name = function_name(self.fn)
        # The engine verifies rewrites on meta tensors: that work must not be recorded by (or
        # batched under) the transforms or tracers this call happens inside either.
        with _outside_transforms(), ModuleCalls() as calls:
            traced = torch.func.functionalize(flat_fn) if self.functionalize else flat_fn
            tensors = [leaves[i] for i in positions]
            gm = capture(
                traced,
                tensors,
                fresh=True,
                caller="fxviews.transform",
                name=name,
                generators=generators,
            )
            offsets = offsets_of(tensors, offset_bound_inputs(gm))
            guard.watch_layouts(layout_bound_constants(gm))
            if keep_item_values_as_tensors(gm):  # batchable under vmap, as the graph runs
                gm.recompile()
            result = rewrite_in_place(gm, strict=self.strict, bind_calls=True, fx_code=False)
        guard.watch(calls.modules)
        report_rewrite(result, source=f"transform({name})")
        # A call that raises inside a grad-mode region leaves the caller's mode as fn's `with`
        # would (Note [What autograd sees is part of the trace]).
        graph_module = result.graph_module
        forward = restoring_grad_mode(run_only_forward(graph_module), graph_module.graph)
        if _has_dynamic_output_shape(graph_module.graph):
            forward = _eager_when_batched(forward, flat_fn)
        return _Entry(
            forward=forward,
            guard=guard,
            input_positions=positions,
            rebuild=output_rebuilder(
                out_info["spec"], out_info["from_graph"], out_info["constants"]
            ),
            keepalive=keepalive,
            offsets=offsets,
        )


class _TraceLater(Exception):  # noqa: N818 - a signal, not an error users see
    """``fn`` cannot be traced for this call, and may be for a later one: run it eagerly.

    ``reason`` is what to log once the eager call succeeds (None: nothing worth saying).
    """

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


def _modules_among(reached: list[Any]) -> list[torch.nn.Module]:
    """The modules among the objects a function reaches (see
    :func:`fxviews.guards.reachable_objects`), each with its submodules."""
    return [
        module for obj in reached if isinstance(obj, torch.nn.Module) for module in obj.modules()
    ]


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


def _check_no_lazy_bits(fn: Callable[..., Any], leaves: list[Any]) -> None:
    """Refuse a call passing a tensor with the lazy conjugate or negative bit (``z.conj()``,
    ``z.conj().imag``).

    The trace's samples are plain tensors: ``fn`` would be recorded reading ``is_conj()`` as
    False and ``resolve_conj()`` as a no-op, and the graph, run on the caller's tensor, would
    write into its memory where eager writes into a resolved copy. Such a call runs eagerly.
    """
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and (leaf.is_conj() or leaf.is_neg()):
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
        if isinstance(obj, torch.Tensor) and is_functorch_wrapped_tensor(obj):
            raise TracingError(
                f"fxviews.transform cannot trace {function_name(fn)}{definition_line(fn)}: it "
                f"closes over a tensor wrapped by an enclosing torch.func transform, whose "
                f"derivative or batch dim the cached graph would lose. Pass that tensor as an "
                f"argument.",
                "closure over a transformed tensor",
            )
