"""Python state a trace rebinds or changes: attributes, globals, closure cells, the lists,
dicts, sets and deques ``fn`` reaches or is passed, Python's and NumPy's random streams, and
the iterators it reaches.

Note [Python state a trace rebinds]
-----------------------------------
A recording sees ``fn``'s ops, not its Python statements. A statement that rebinds state
``fn`` can reach, ``self.avg = self.avg * 0.5 + x`` (an EMA, an RNN's carried state),
``self.calls += 1``, ``global total; total = total + x``, ``nonlocal step; step += 1``, or
changes a container it can reach, ``losses.append(loss.detach())``, ``self.cache[key] = y``,
``state["h"] = h`` on a dict it was passed, runs once, while tracing, and never again: the
cached graph reads the tensor the attribute held when it was traced, the attribute keeps the
trace's value, the list holds one trace-time tensor, and a dict of the caller's is never
written at all (the trace ran on a copy ``pytree`` rebuilt). A memo in a mutable default
(``def f(x, cache={})``) even changes the numbers: the graph recomputes what eager reads back.
An item taken from an iterator (``next(self.batches)``) is baked in too, and lost: it cannot
be put back, so a function that reaches an iterator is not traced at all, except an iterator
over a built-in sequence (``iter(list)``, a tuple's, a range's, a string's), whose position
is read and set back (``__reduce__``/``__setstate__``): a trace that advances one is put back
and refused, one that leaves it where it was is kept (torchrl's MLP holds such iterators and
never advances them in ``forward``). A draw from Python's
``random`` or NumPy's random state (``random.random() < eps`` in an
epsilon-greedy policy, ``np.random.randn()`` as a jitter) is baked into the graph as the
number the trace drew. Eager does each of these on every call. In-place writes
(``self.avg.mul_(0.5).add_(x)``) are ops, and are recorded.

So, around the trace, :class:`Rebinding` keeps a shallow copy of the state ``fn`` can reach:

1. the attribute dicts of the modules it reaches (with every submodule) and of the plain
   objects among its arguments and the objects it reaches (``self`` of a bound method, a
   closed-over config), and each module's ``_parameters``, ``_buffers`` and ``_modules``;
2. the module-level names its code reads, in its globals, and its closure cells;
3. the items of every list, dict, set and deque among those (nested ones too), among its
   defaults, and among the objects it reaches; ``nn.Module``'s own bookkeeping (its hook
   dicts) is PyTorch's and left out;
4. the states of Python's ``random`` module, of NumPy's global random state (where NumPy is
   imported), and of each ``random.Random``, NumPy ``Generator`` and ``RandomState`` among
   those objects and attributes;

and :class:`ArgumentContainers` the structure of each argument as one run of ``fn`` got it.
After the trace each entry is compared by identity. Whatever changed is put back (the trace's
writes are not the call's: the call then runs as eager does), and the names of what changed
say why the trace is refused. A trace that raises an exception of ``fn``'s own after writing
such state is put back too, and the call runs eagerly: the writes and the exception are then
eager's (under ``vmap``, the trace would have logged one sample where eager logs the batch).
Not seen: containers reached only through an object that is not one of those (an attribute of
a Python module, an item of a user object's list), and, to keep a first call's cost bounded
(Note [What a function reaches], item 2), containers past the walk's budget and writes into
one of more than :data:`_KEEP_LIMIT` items other than growing it (its length is kept, and a
list or deque that grew is cut back). All of it is read without running the user's code: an
object whose dunders raise or lie is kept by identity or left alone.

Example::

    >>> rebinding = Rebinding([ema_module], [])
    >>> ema_module(x)          # runs self.avg = self.avg * 0.5 + x
    >>> rebinding.undo()
    ['rebinds EMA.avg']
"""

from __future__ import annotations

import collections
import inspect
import operator
import pickle
import random
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import torch

from fxviews.passes.compat.torch_internals import pytree
from fxviews.passes.source_lines import internal_module
from fxviews.state.guard import REGISTRATIONS, SWAPS
from fxviews.state.reachable import (
    WALK_BUDGET,
    instance_dict,
    of_type,
    read_globals,
    submodules,
)

__all__ = ["ArgumentContainers", "Rebinding", "why_refused"]

#: The dicts of a module that hold its state besides its ``__dict__``.
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")

#: The attributes every ``nn.Module`` has: PyTorch's bookkeeping (hook dicts a lazy module's
#: first call empties), not state of the user's.
_MODULE_OWN = frozenset(vars(torch.nn.Module()))

#: The containers whose items a trace may change in place, and the types kept as they are.
_CONTAINERS = (list, dict, set, collections.deque)

#: The entries of a container past which nested containers are not searched (its own items
#: are still kept): a replay buffer's transitions are not the state a step writes.
_SEARCH_LIMIT = 10_000

#: The entries of a container past which its items are not kept, only its length: copying and
#: comparing them would cost a first call tens of milliseconds a million (Note [What a
#: function reaches], item 2). A list or deque that grew is cut back; other writes into it are
#: not seen.
_KEEP_LIMIT = 200_000

#: The roots (attributes, globals, cells, defaults, reached objects) whose containers and
#: streams are kept, at most: each costs a first call about a microsecond.
_ROOT_LIMIT = 20_000

#: What searching one container costs the walk's budget besides its items.
_CONTAINER_COST = 10


class Rebinding:
    """A shallow copy of the Python state ``objects`` and ``functions`` reach (see the Note),
    to compare with and put back after a trace."""

    def __init__(self, objects: Iterable[Any], functions: Iterable[Any]) -> None:
        objects = list(objects)
        # (whose, the dict, its entries as they were, whether keys it gains count too)
        self._kept: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = []
        self._cells: list[tuple[str, Any, Any]] = []
        roots: list[tuple[str, Any]] = []
        seen: set[int] = set()
        for obj in objects:
            for owner in submodules(obj) if of_type(obj, torch.nn.Module) else [obj]:
                attributes = instance_dict(owner)
                if id(owner) in seen or attributes is None or not _has_own_state(owner):
                    continue
                seen.add(id(owner))
                whose = type(owner).__name__
                module = of_type(owner, torch.nn.Module)
                held = [attributes.get(name) for name in (_MODULE_DICTS if module else ())]
                for state in [attributes, *(d for d in held if type(d) is dict)]:
                    kept = {k: v for k, v in state.items() if k not in _COUNTS}
                    self._kept.append((whose, state, kept, True))
                own = _MODULE_OWN if module else ()
                roots += [
                    (f"{whose}.{_escaped(k)}{{}}", v) for k, v in attributes.items() if k not in own
                ]
        for fn, names in read_globals(functions):
            kept = {name: fn.__globals__[name] for name in names}
            self._kept.append(("global", fn.__globals__, kept, False))
            roots += [(f"global {name}{{}}", value) for name, value in kept.items()]
            roots += _closure_and_defaults(fn, self._cells)
        del roots[_ROOT_LIMIT:]  # Note [What a function reaches], item 2
        # What the walk found besides what is named: searched within the budget only.
        found = [("that the function reaches{}", obj) for obj in objects[:_ROOT_LIMIT]]
        # (where the container is, the container, its items as they were or its length)
        self._containers = list(_containers_under(roots, found))
        roots += found
        #: The iterators among them, named: a trace would take an item, which cannot be put
        #: back, so a function reaching one is not traced at all.
        named = {id(obj): (name.format(""), obj) for name, obj in reversed(roots)}
        iterators = [(name, obj) for name, obj in named.values() if _is_iterator(obj)]
        self.iterators = sorted(
            {f"the {type(obj).__name__} {name}" for name, obj in iterators if not _seekable(obj)}
        )
        # (its name, an iterator over a built-in sequence, its position as it was)
        self._positions = [
            (f"the {type(obj).__name__} {name}", obj, _position(obj))
            for name, obj in iterators
            if _seekable(obj)
        ]
        # (the stream's name, its state as it was, how to read it, how to set it)
        self._streams = [
            (name, state, get, put)
            for name, get, put in _random_streams(roots)
            if (state := _state_of(get)) is not _MISSING
        ]

    def undo(self) -> list[str]:
        """Put back every entry that changed since the copy; what changed, in words."""
        changed: set[str] = set()
        for whose, state, kept, whole in self._kept:
            # A guard's registration count (set on the modules a trace finds) is fxviews' own.
            for key in (
                [k for k in state if k not in kept and k not in (REGISTRATIONS, SWAPS)]
                if whole
                else []
            ):
                changed.add(f"rebinds {_spelled(whose, key)}")
                del state[key]
            for key, value in kept.items():
                if state.get(key, _MISSING) is not value:
                    changed.add(f"rebinds {_spelled(whose, key)}")
                    state[key] = value
        for name, cell, value in self._cells:
            if _cell_value(cell) is not value:
                changed.add(f"rebinds {name}")
                if value is _MISSING:
                    del cell.cell_contents
                else:
                    cell.cell_contents = value
        for where, container, items in self._containers:
            if not _same_items(container, items):
                changed.add(f"changes the {type(container).__name__} {where.spelled()}")
                _put_back(container, items)
        for name, state, get, put in self._streams:
            if not _same_state(_state_of(get), state):
                changed.add(f"draws from {name}")
                put(state)
        for name, iterator, position in self._positions:
            if _position(iterator) != position:
                changed.add(f"advances {name}")
                if position is not None:  # an exhausted one stays exhausted: no item was taken
                    iterator.__setstate__(position)
        return sorted(changed)


class ArgumentContainers:
    """The structure of the arguments one run of ``fn`` gets (lists, dicts and tuples ``pytree``
    rebuilt from the call's: a copy, so what ``fn`` writes there never reaches the caller),
    to tell after the run which ones ``fn`` changed.

    Example::

        >>> args = ({"h": h},)
        >>> watch = ArgumentContainers(step, args, {})
        >>> step(*args)            # runs state["h"] = torch.tanh(...)
        >>> watch.changed()
        ['changes the dict passed as state']
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._call = (fn, args, kwargs)
        # (its position among args and kwargs' values, the argument, its leaves, its structure;
        # a leaf, a tensor, is the caller's own object, and its attributes are Rebinding's)
        self._before = [
            (position, value, *pytree.tree_flatten(value))
            for position, value in enumerate([*args, *kwargs.values()])
            if not pytree.tree_is_leaf(value)
        ]

    def changed(self) -> list[str]:
        """The arguments whose structure or leaves (by identity) differ from before the run."""
        changed = [
            (position, value)
            for position, value, leaves, spec in self._before
            if (now := pytree.tree_flatten(value))[1] != spec
            or not all(map(operator.is_, now[0], leaves))
        ]
        names = {id(v): name for name, v in _named_arguments(*self._call)} if changed else {}
        return [
            f"changes the {type(value).__name__} passed as "
            f"{names.get(id(value), f'argument {position}')}"
            for position, value in changed
        ]


def why_refused(where: str, changes: list[str]) -> str:
    """Why the function ``where`` (its name and line) is not traced, for ``changes``
    (:meth:`Rebinding.undo`'s and :meth:`ArgumentContainers.changed`'s words, or "reaches" an
    iterator), and what to write instead.

    Example::

        >>> why_refused("loss (train.py:12)", ["changes the list global losses"])
        'fxviews.transform cannot trace loss (train.py:12): it changes the list global ...'
    """
    what = " and ".join([", ".join(changes[:-1]), changes[-1]] if len(changes) > 1 else changes)
    verbs = {change.split(" ", 1)[0] for change in changes}
    advice = [text for verb, text in _ADVICE.items() if verb in verbs]
    return (
        f"fxviews.transform cannot trace {where}: it {what}, which a graph cannot replay (it "
        f"would keep what the trace wrote, drew or took, and later calls would do none of "
        f"it). To have it traced, {'; '.join(advice)}."
    )


#: What to write instead, by the verb of a change (in the order the advice is given).
_ADVICE = {
    "reaches": "take the item outside and pass it in as an argument (f(w, next(it)))",
    "advances": "take the item outside and pass it in as an argument (f(w, next(it)))",
    "rebinds": "keep a tensor and write into it in place (self.avg.mul_(0.5).add_(x) for "
    "self.avg = self.avg * 0.5 + x), or pass the value in as an argument",
    "changes": "return what it logs, caches or updates, and store it after the call",
    "draws": "draw with torch (torch.rand, torch.randint, torch.bernoulli: the graph replays "
    "those), or pass the drawn value in as an argument",
}

_MISSING = object()

#: The counts a guard keeps in a watched module's ``__dict__``: fxviews' own, not the user's.
_COUNTS = (REGISTRATIONS, SWAPS)


def _spelled(whose: str, key: str) -> str:
    return f"global {key}" if whose == "global" else f"{whose}.{key}"


def _closure_and_defaults(
    fn: types.FunctionType, cells: list[tuple[str, Any, Any]]
) -> list[tuple[str, Any]]:
    """``fn``'s closure cells (added to ``cells`` as name, cell, value) and defaults, with
    names to fill a subscript in (``"default cache{} of f"``)."""
    named = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        value = _cell_value(cell)
        cells.append((f"{name} (closed over by {fn.__qualname__})", cell, value))
        named.append((f"closed-over {name}{{}} of {fn.__qualname__}", value))
    positional = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    values = fn.__defaults__ or ()
    defaults = [*zip(positional[len(positional) - len(values) :], values, strict=True)]
    defaults += (fn.__kwdefaults__ or {}).items()
    return named + [(f"default {name}{{}} of {fn.__qualname__}", v) for name, v in defaults]


def _random_streams(
    roots: list[tuple[str, Any]],
) -> list[tuple[str, Callable[[], Any], Callable[[Any], Any]]]:
    """Python's and NumPy's global random streams, and the generators among ``roots``: each
    named, with how to read and set its state."""
    streams: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]] = [
        ("Python's random module", random.getstate, random.setstate)
    ]
    # A program that draws from NumPy has imported numpy.random (`import numpy` alone does not;
    # torch._dynamo does, once anything traces). Reading its state costs ~40 us.
    numpy = sys.modules.get("numpy") if "numpy.random" in sys.modules else None
    if numpy is not None:
        streams.append(("NumPy's random state", numpy.random.get_state, numpy.random.set_state))
    seen: set[int] = set()
    for name, obj in roots:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        spelled, kind = name.format(""), type(obj).__name__
        if of_type(obj, random.Random) and not of_type(obj, random.SystemRandom):
            streams.append((f"the {kind} {spelled}", obj.getstate, obj.setstate))
        elif numpy is not None and of_type(obj, numpy.random.RandomState):
            streams.append((f"the {kind} {spelled}", obj.get_state, obj.set_state))
        elif numpy is not None and of_type(obj, numpy.random.Generator):
            bits = obj.bit_generator
            read = partial(getattr, bits, "state")
            streams.append((f"the {kind} {spelled}", read, partial(setattr, bits, "state")))
    return streams


#: Iterators over built-in sequences: their position is ``__reduce__()[2]`` and
#: ``__setstate__`` sets it back.
_SEEKABLE: tuple[type, ...] = (
    type(iter([])),
    type(iter(())),
    type(iter(range(0))),
    type(iter("")),
)


def _seekable(obj: Any) -> bool:
    return type(obj) in _SEEKABLE


def _position(iterator: Any) -> int | None:
    """Where an iterator over a built-in sequence is (None once exhausted)."""
    state = iterator.__reduce__()
    return state[2] if len(state) > 2 else None


def _is_iterator(obj: Any) -> bool:
    """Whether ``obj`` hands out items with ``next`` (a generator, ``iter(list)``, a data
    loader's iterator, a file): not a tensor or module, which only iterate when asked to, nor
    a ``weakref.proxy``, whose type has every slot (its referent is not read: it may be dead)."""
    return of_type(obj, collections.abc.Iterator) and not of_type(
        obj, (torch.Tensor, torch.nn.Module, weakref.ProxyType, weakref.CallableProxyType)
    )


def _state_of(get: Callable[[], Any]) -> Any:
    """A random stream's state; ``_MISSING`` where reading it raises (a generator of the user's
    class whose ``getstate`` does: not a stream fxviews can put back)."""
    try:
        return get()
    except Exception:  # noqa: BLE001 - the user's method, theirs to fail
        return _MISSING


def _same_state(now: Any, before: Any) -> bool:
    """Whether two states of a random stream are equal (Python's compare as tuples of ints;
    those holding NumPy arrays, whose ``==`` has no truth value, as their pickles)."""
    try:
        return bool(now == before)
    except ValueError:
        return pickle.dumps(now) == pickle.dumps(before)


def _cell_value(cell: Any) -> Any:
    """What ``cell`` holds; ``_MISSING`` where it is unassigned (assigning it rebinds it)."""
    try:
        return cell.cell_contents
    except ValueError:
        return _MISSING


class _Where:
    """Where a container sits: a root's name with a ``{}`` where a subscript goes, or the
    container holding it and its subscript; spelled only when a change is reported (a deep nest
    spelled at every level would cost the square of its depth)."""

    __slots__ = ("name", "parent", "subscript")

    def __init__(self, name: str, parent: _Where | None = None, subscript: str = "") -> None:
        self.name, self.parent, self.subscript = name, parent, subscript

    def spelled(self) -> str:
        subscripts, where = [], self
        while where.parent is not None:
            subscripts.append(where.subscript)
            where = where.parent
        return where.name.format("".join(reversed(subscripts)))


def _containers_under(
    roots: list[tuple[str, Any]], found: list[tuple[str, Any]]
) -> Iterator[tuple[_Where, Any, Any]]:
    """Each list, dict, set and deque among ``roots`` and ``found`` (named with a ``{}`` where
    a subscript goes) and inside them (through tuples too), once, with where it is and a copy
    of its items (its length, past :data:`_KEEP_LIMIT` items).

    Every root container is kept; ``found`` and the containers inside them are searched
    breadth first within :data:`~fxviews.state.reachable.WALK_BUDGET` items in all (Note
    [What a function reaches], item 2), and a container of more than :data:`_SEARCH_LIMIT`
    items is kept but not searched.
    """
    seen: set[int] = set()
    budget = WALK_BUDGET
    pending = collections.deque(
        [(_Where(name), obj, True) for name, obj in roots]
        + [(_Where(name), obj, False) for name, obj in found]
    )
    while pending:
        where, obj, root = pending.popleft()
        if not of_type(obj, (*_CONTAINERS, tuple)) or id(obj) in seen:
            continue
        if not root and budget <= 0:
            continue
        seen.add(id(obj))
        length = _length(obj)
        if length > _KEEP_LIMIT:
            yield where, obj, length
            continue
        items = _items(obj)
        budget -= length + _CONTAINER_COST
        if not of_type(obj, tuple):
            yield where, obj, items
        if length > _SEARCH_LIMIT or of_type(obj, set):  # a set holds no containers
            continue
        if of_type(obj, dict):
            inner = [(k, v) for k, v in _pairs(items) if of_type(v, (*_CONTAINERS, tuple))]
            pending += [(_Where("", where, f"[{_spelled_key(k)}]"), v, False) for k, v in inner]
        else:
            pending += [
                (_Where("", where, f"[{i}]"), value, False)
                for i, value in enumerate(items)
                if of_type(value, (*_CONTAINERS, tuple))
            ]


def _spelled_key(key: Any) -> str:
    """A dict key as a name spells it (its repr; its type where its repr raises), braces
    escaped for the ``{}`` a name is filled in at."""
    try:
        spelled = repr(key) if type(key) in (str, int, float, bool, bytes) else object.__repr__(key)
    except Exception:  # noqa: BLE001 - a repr of the user's is theirs to fail
        spelled = f"<{type(key).__name__}>"
    return _escaped(spelled)


def _escaped(text: str) -> str:
    """``text`` to go into a name that is filled in by ``str.format``."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _items(container: Any) -> list[Any]:
    """A container's items as a list: a dict's keys, then its values, in order (pairs would be
    as many new tuples: a cycle of the garbage collector over everything alive, on a large
    dict).

    Read through the built-in type's own methods: a subclass may override ``__len__``,
    ``__iter__`` or ``items`` to raise or lie (e3nn's ``Irreps``, a tuple whose ``len()`` may
    raise), and what it holds is what the built-in type stores.
    """
    if of_type(container, dict):
        return [*dict.keys(container), *dict.values(container)]
    for base in (list, tuple, set, collections.deque):
        if of_type(container, base):
            return list(base.__iter__(container))  # type: ignore[attr-defined]
    raise TypeError(f"not a container: {type(container).__name__}")


def _pairs(items: list[Any]) -> Iterator[tuple[Any, Any]]:
    """A dict's (key, value) pairs from its :func:`_items`."""
    half = len(items) // 2
    return zip(items[:half], items[half:], strict=True)


def _length(container: Any) -> int:
    """A container's length, by its built-in type's own ``__len__``."""
    base = next(b for b in (*_CONTAINERS, tuple) if of_type(container, b))
    return base.__len__(container)  # type: ignore[no-any-return]


def _same_items(container: Any, items: list[Any] | int) -> bool:
    """Whether ``container`` holds exactly ``items`` (by identity; a set in any order), or has
    the length ``items`` where only that was kept."""
    if isinstance(items, int):  # only its length was kept
        return _length(container) == items
    now = _items(container)
    if len(now) != len(items):
        return False
    if of_type(container, set):
        return sorted(map(id, now)) == sorted(map(id, items))
    return all(map(operator.is_, now, items))


def _put_back(container: Any, items: list[Any] | int) -> None:
    """Make ``container`` hold ``items`` again, through its own methods (an ``OrderedDict``
    keeps its order, a subclass its invariants), or its built-in type's where its own raise;
    one of which only the length was kept is cut back to it where it is a list or deque."""
    if isinstance(items, int):  # only its length was kept
        if of_type(container, list):
            list.__delitem__(container, slice(items, None))
        elif of_type(container, collections.deque):
            while len(container) > items:
                collections.deque.pop(container)
        return
    try:
        _refill(container, items, type(container))
    except Exception:  # noqa: BLE001 - a subclass's own methods may raise: the base's do not
        base = next(b for b in (list, dict, set, collections.deque) if of_type(container, b))
        _refill(container, items, base)


def _refill(container: Any, items: list[Any], kind: type) -> None:
    if issubclass(kind, list):
        kind.__setitem__(container, slice(None), items)
        return
    kind.clear(container)  # type: ignore[attr-defined]
    if issubclass(kind, dict):
        kind.update(container, _pairs(items))  # type: ignore[attr-defined]
    elif issubclass(kind, set):
        kind.update(container, items)  # type: ignore[attr-defined]
    else:  # a deque
        kind.extend(container, items)  # type: ignore[attr-defined]


def _named_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, Any]]:
    """The call's arguments with ``fn``'s parameter names (positions where it has none)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    named = []
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named += [(f"{name}[{k!r}]", v) for k, v in value.items()]
        else:
            named.append((name, value))
    return named


def _has_own_state(obj: Any) -> bool:
    """Whether ``obj``'s attributes are state ``fn`` computes with: a module's, or those of an
    object of the user's own class (not a function, class, tensor, or PyTorch's own object,
    whose attributes PyTorch may fill in lazily: an ``OpOverload``'s namespace)."""
    if of_type(obj, torch.nn.Module):
        return True
    plain = not of_type(
        obj, (torch.Tensor, type, types.ModuleType, types.FunctionType, types.MethodType)
    )
    return plain and not internal_module(type(obj).__module__ or "")
