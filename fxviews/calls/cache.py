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
   (:func:`fxviews.calls.keys.hot_check`, Dynamo's ``TensorGuards``: type, dispatch keys,
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
   process state, module modes and attributes, hooks). A hit is that guard passing (~0.2 us,
   and ~40 ns per module the function reaches: its dict's version tag), and what the modules'
   slots hold now being of the kind the graph was traced for (Note [Parameters are read when
   the graph runs]: one C++ check over them, like the hot call's, whose tensors then follow
   the call's); otherwise the call looks through the others, and traces a new one for the
   state now in force if none passes. The entry it runs becomes the hot one.
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
   written by :mod:`fxviews.calls.graph_code` (Note [The code of a graph only run]), not FX.

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
``torch.compiler.disable`` would (:func:`~fxviews.passes.compat.torch_internals.run_outside_dynamo`,
which costs a call nothing, where that wrapper costs ~0.6 us): the function ``transform``
returns carries the mark Dynamo reads (a graph break at a call of it, with the reason given
here), and its code runs, with every frame it calls, as plain Python: through the cache as
outside ``torch.compile`` (its guards, its graph), the user's function included while it is
recorded. ``torch.compile(outer, backend="fxviews")`` puts the whole of ``outer`` in one
rewritten graph instead.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import torch
from torch.utils.hooks import RemovableHandle

from fxviews.arguments import check_call
from fxviews.calls.build import Entry, EntryBuilder, TraceLater
from fxviews.calls.keys import (
    hot_check,
    leaf_key,
    offsets_hold,
    positional_key,
)
from fxviews.passes.compat.torch_internals import (
    pytree,
    run_outside_dynamo,
)
from fxviews.rewriting.printouts import logger
from fxviews.state.guard import read_version
from fxviews.state.reachable import of_type
from fxviews.tracing.failures import first_line, function_name
from fxviews.tracing.lock import tracing_in_progress, tracing_lock

__all__ = ["DEFAULT_CACHE_SIZE", "CacheInfo", "cached_function"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: How many input signatures a transformed function remembers by default.
DEFAULT_CACHE_SIZE = 32

#: Why Dynamo graph-breaks at a transformed function (Note [A transformed function inside
#: torch.compile]); Dynamo shows it in graph-break logs and fullgraph errors.
_OUTSIDE_DYNAMO = (
    "fxviews.transform runs its own cached, rewritten graph with its own guards; to compile "
    "the caller as one rewritten graph, use torch.compile(caller, backend='fxviews')"
)


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


def cached_function(fn: _F, *, strict: bool, cache_size: int, functionalize: bool) -> _F:
    """``fn`` through a graph cache of ``cache_size`` entries: what :func:`fxviews.transform`
    returns, with ``cache_info()`` and ``cache_clear()`` (arguments checked by the caller).

    Example::

        >>> f = cached_function(torch.sin, strict=False, cache_size=4, functionalize=False)
        >>> f(torch.zeros(2)), f.cache_info().misses
        (tensor([0., 0.]), 1)
    """
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
        # StateGuard.check, written out; one that raises (a module's `training` property of the
        # user's) fails, and the slow path checks it as StateGuard.check does.
        try:
            holds = (
                guard.check_process()
                and (
                    tuple(map(read_version, guard.module_dicts)) == guard.versions
                    or guard.modules_hold()
                )
                and (not guard.bound or guard.bindings_hold())
                and (RemovableHandle.next_id == guard.hook_clock or guard.hooks_hold())
            )
        except Exception:  # noqa: BLE001
            holds = False
        if not holds:
            return cache.call(args, kwargs)
        if entry.slots.keys:  # what the model's slots hold now (Note [Parameters are read ...])
            held = entry.slot_values()
            if held is None:
                return cache.call(args, kwargs)
            args += held
        cache.hits += 1
        entry.last_used = next(clock)
        return entry.rebuild(entry.forward(*args))  # type: ignore[misc]

    # Note [A transformed function inside torch.compile]
    run_outside_dynamo(transformed, _OUTSIDE_DYNAMO)  # type: ignore[arg-type]
    transformed.cache_info = cache.info  # type: ignore[attr-defined]
    transformed.cache_clear = cache.clear  # type: ignore[attr-defined]
    return transformed  # type: ignore[return-value]


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
        self.builder = EntryBuilder(fn, strict=strict, functionalize=functionalize)
        self.maxsize = maxsize
        self.entries: dict[Any, list[Entry]] = {}
        # The entry the last positional call ran, checked first by the next (the hot call).
        self.hot: Entry | None = None
        self.clock = itertools.count(1)  # ticks of use: an entry's last_used is one of them
        self.hits = 0
        self.misses = 0
        self.reported: set[str] = set()  # reasons already logged for calls run eagerly

    def positional_hit(self, args: tuple[Any, ...]) -> Entry | None:
        """The first entry of the signature of ``args``, positional tensors only, made the hot
        one; None for other calls and where it has none or runs eagerly. Its state guard is the
        caller's to check. Counts no hit."""
        key = positional_key(args)
        traced = self.entries.get(key) if key is not None else None
        if not traced or traced[0].forward is None or not offsets_hold(args, traced[0].offsets):
            return None
        self._make_hot(traced[0], args)
        return traced[0]

    def _make_hot(self, entry: Entry, args: tuple[Any, ...]) -> None:
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
        except TraceLater as later:
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
        held = entry.slots.read()  # checked by the lookup (Note [Parameters are read ...])
        return entry.rebuild(entry.forward(*tensors, *held))  # type: ignore[misc]

    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Eager torch.func is not thread-safe (forward-AD levels and the functorch interpreter
        # state are process-wide): concurrent eager jvp calls return wrong tangents or crash
        # the process. Eager calls take the tracing lock, as traces do.
        with tracing_lock:
            return self.fn(*args, **kwargs)

    def lookup(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any
    ) -> tuple[Entry, Sequence[Any]]:
        """The entry for this call's signature and state (built on a miss) and the tensors to
        run it on. Raises :class:`TraceLater` where ``fn`` cannot be traced now but may be
        later, and the TypeError of a call ``fn``'s signature does not accept."""
        if key is not None:
            entry = self._get(key, args)
            if entry is None:
                check_call(self.fn, args, kwargs, function_name(self.fn))
                entry = self._insert(key, *pytree.tree_flatten((args, kwargs)), keepalive=())
            return entry, args
        keepalive: list[Any] = []
        try:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            key = (spec, tuple(leaf_key(leaf, keepalive) for leaf in leaves))
            entry = self._get(key, [leaf for leaf in leaves if of_type(leaf, torch.Tensor)])
        except Exception as err:  # noqa: BLE001 - Note [Keys of the user's objects]
            raise TraceLater(
                f"fxviews.transform cannot key a call of {function_name(self.fn)}: an object "
                f"among its arguments fails to be read or compared ({type(err).__name__}: "
                f"{first_line(err)}); it runs eagerly"
            ) from err
        if entry is None:
            check_call(self.fn, args, kwargs, function_name(self.fn))
            entry = self._insert(key, leaves, spec, keepalive=tuple(keepalive))
        return entry, [leaves[i] for i in entry.input_positions]

    def _get(self, key: Any, tensors: Sequence[Any]) -> Entry | None:
        """The entry of ``key`` whose guard passes now for ``tensors`` (a hit), moved first in
        its list."""
        entry = self._passing(key, tensors)
        if entry is not None:
            self.hits += 1
            entry.last_used = next(self.clock)
        return entry

    def _passing(self, key: Any, tensors: Sequence[Any]) -> Entry | None:
        traced = self.entries.get(key, [])
        for position, entry in enumerate(traced):
            if (
                entry.guard.check()
                and offsets_hold(tensors, entry.offsets)
                and entry.slot_values() is not None
            ):
                if position:
                    traced.insert(0, traced.pop(position))
                return entry
        return None

    def _insert(
        self, key: Any, leaves: list[Any], spec: pytree.TreeSpec, *, keepalive: tuple[Any, ...]
    ) -> Entry:
        with tracing_lock:
            entry = self._passing(key, [leaf for leaf in leaves if of_type(leaf, torch.Tensor)])
            if entry is not None:  # built by another thread while this one waited
                return entry
            if key in self.entries:  # traced for this signature, in another state
                logger.debug(
                    "fxviews.transform traces %s again for this signature: %s changed",
                    function_name(self.fn),
                    self.entries[key][0].guard.failure(),
                )
            self.misses += 1
            entry = self.builder.build(spec, leaves, keepalive)
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
