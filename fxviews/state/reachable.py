"""What a function reaches: the objects a trace may read, walked without running their code,
within a bound.

Note [What a function reaches]
------------------------------
A cache entry's guard, the Python state a trace must not change, the generators it forks and
the modules whose tensors it reads all start from the objects ``fn`` reaches statically:
``fn`` itself, ``functools.partial`` functions and arguments, a bound method's ``self``,
closure cells, defaults, the module-level names its code reads (nested functions' code
included; not searched in PyTorch's own functions), and the items of lists, tuples and dicts
among them. Two rules keep the walk the user's objects' business and cheap:

1. **Nothing of the user's runs.** Those objects may override anything fxviews could call on
   them to raise or lie (``__len__``, ``__iter__``, ``items``, ``__getattribute__``, a
   ``__class__`` property claiming to be a module, a dead ``weakref.proxy``): e3nn's
   ``Irreps`` is a tuple whose ``len()`` may raise. So kinds are told by ``type(obj)``
   (:func:`of_type`, never ``isinstance``, which reads ``__class__``), containers are read
   through the built-in type's own methods, and attributes through ``object.__getattribute__``
   of the instance dict; an object none of that reads is opaque, reached as itself only.
2. **The walk is bounded.** A function may close over a replay buffer of a million
   transitions, and a first call must not cost seconds more than its trace for it (a closure
   over a list of 10^5 small lists took 2.5 s). The walk goes breadth first, so what ``fn``
   holds directly comes before what its containers hold, and stops after
   :data:`WALK_BUDGET` steps (an object visited, or an item of a container read); a container
   of more than :data:`ITEM_LIMIT` items is reached as itself but not searched. What is past
   the bound stays guarded as ``fn`` holds it, by identity (a name or cell rebound is seen:
   Note [The state a graph bakes in], item 4), but is not searched: a module there is found
   when its ``forward`` runs, a generator there is refused when drawn from (Note [Random state
   set from Python]), and a write into such a container, or an iterator held only there, is
   not seen (Note [Python state a trace rebinds]).

Example::

    >>> scale = torch.nn.Linear(2, 2)
    >>> any(obj is scale for obj in reachable_objects(lambda x: scale(x)))
    True
"""

from __future__ import annotations

import collections
import contextlib
import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from fxviews.passes.source_lines import internal_module

__all__ = [
    "ITEM_LIMIT",
    "WALK_BUDGET",
    "held_by",
    "instance_dict",
    "of_type",
    "reachable_generators",
    "reachable_objects",
    "read_globals",
    "submodules",
    "uninitialized_lazy_modules",
]

#: Steps of a walk over what a function reaches (item 2 of the Note): a few milliseconds of
#: Python, and as many objects at most for what a first call does with each.
WALK_BUDGET = 5_000

#: Containers holding more items than this are reached as themselves, not searched.
ITEM_LIMIT = 10_000

#: Objects that hold nothing a walk looks for: not searched, not spent on.
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def of_type(obj: Any, kind: type | tuple[type, ...]) -> bool:
    """``isinstance(obj, kind)`` by ``obj``'s real type: a ``__class__`` property of the user's
    (which may lie, or raise) is never read (item 1 of the Note).

    Example::

        >>> class Liar:
        ...     __class__ = property(lambda self: torch.nn.Module)
        >>> isinstance(Liar(), torch.nn.Module), of_type(Liar(), torch.nn.Module)
        (True, False)
    """
    return issubclass(type(obj), kind)


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """``obj``'s instance dict, read without its own ``__getattribute__``; None where it has
    none that is a dict (item 1 of the Note).

    Example::

        >>> instance_dict(types.SimpleNamespace(a=1))
        {'a': 1}
    """
    try:
        held = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no instance dict, or a dead proxy's refusal to show it
        return None
    return held if type(held) is dict else None


def reachable_objects(fn: Callable[..., Any], budget: int = WALK_BUDGET) -> Iterator[Any]:
    """Every object ``fn`` reaches statically, ``fn`` included, within ``budget`` steps (see
    the Note). A module found is yielded, not searched further: its submodules are its own
    business.

    Example::

        >>> scale = torch.nn.Linear(2, 2)
        >>> any(obj is scale for obj in reachable_objects(lambda x: scale(x)))
        True
    """
    seen: set[int] = set()
    pending: collections.deque[Any] = collections.deque([fn])
    while pending and budget > 0:
        obj = pending.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        budget -= 1
        yield obj
        found = _references(obj)
        budget -= len(found)
        pending += [item for item in found if type(item) not in _ATOMS]


def _references(obj: Any) -> list[Any]:
    """What ``obj`` holds that a walk follows, read by its real type (item 1 of the Note)."""
    kind = type(obj)
    if issubclass(kind, (torch.Tensor, torch.nn.Module, type, types.ModuleType)):
        return []
    if issubclass(kind, functools.partial):
        return [obj.func, *obj.args, *dict.values(obj.keywords)]
    for container, items in ((list, list.copy), (tuple, tuple.__iter__), (dict, dict.values)):
        if issubclass(kind, container):
            # Past the limit, reached as itself, not searched (item 2 of the Note).
            return [] if container.__len__(obj) > ITEM_LIMIT else list(items(obj))
    if issubclass(kind, types.MethodType):
        return [obj.__self__, obj.__func__]
    if _users_function(obj):
        # PyTorch's and fxviews' own functions reach no module of the user's but through
        # their arguments: their globals would only lead through torch.
        return _function_references(obj)
    return []


def submodules(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``module.modules()``, each once, read from the ``_modules`` dicts themselves: an object
    registered there because its ``__class__`` claims to be a module is left out (PyTorch's own
    walk would ask it for ``_modules``, which it lacks).

    Example::

        >>> len(list(submodules(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))))
        3
    """
    seen: set[int] = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        children = (instance_dict(current) or {}).get("_modules")
        if type(children) is dict:
            pending += reversed([c for c in children.values() if of_type(c, torch.nn.Module)])


def reachable_generators(reached: Iterable[Any]) -> list[torch.Generator]:
    """The ``torch.Generator`` objects among ``reached`` (what :func:`reachable_objects` found)
    and among the attributes of the modules there and their submodules (a module drawing from
    a generator of its own), each once: those a traced function may draw from besides the
    default ones and its arguments'.

    Example::

        >>> g = torch.Generator()
        >>> reachable_generators(reachable_objects(lambda x: x + torch.rand(3, generator=g)))
        [<torch._C.Generator object at ...>]
    """
    found: dict[int, torch.Generator] = {}
    for obj in reached:
        modules = submodules(obj) if of_type(obj, torch.nn.Module) else ()
        attributes = [
            value for module in modules for value in (instance_dict(module) or {}).values()
        ]
        for candidate in (obj, *attributes):
            if of_type(candidate, torch.Generator):
                found.setdefault(id(candidate), candidate)
    return list(found.values())


def held_by(reached: Iterable[Any]) -> Iterator[Any]:
    """What the objects among ``reached`` hold as attributes (a module's parameters, buffers and
    submodules among them, one level down), read without running their own code: what ``fn``
    may hand out as ``self.config``.

    Example::

        >>> config = {"scale": 2}
        >>> holder = types.SimpleNamespace(config=config)
        >>> any(obj is config for obj in held_by([holder]))
        True
    """
    for obj in reached:
        attributes = instance_dict(obj)
        for value in dict.values(attributes) if attributes is not None else ():
            yield value
            if type(value) is dict and of_type(obj, torch.nn.Module):
                yield from dict.values(value)  # _parameters, _buffers, _modules


def _function_references(fn: types.FunctionType) -> list[Any]:
    found: list[Any] = []
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):  # an unassigned cell
            found.append(cell.cell_contents)
    found += fn.__defaults__ or ()
    found += dict.values(fn.__kwdefaults__ or {})
    held = fn.__globals__
    found += [held[name] for name in _global_names(fn.__code__) & dict.keys(held)]
    return found


def read_globals(reached: Iterable[Any]) -> Iterator[tuple[types.FunctionType, set[str]]]:
    """Each of the user's functions among ``reached`` (PyTorch's and fxviews' left out), with
    the module-level names its code reads that its globals hold.

    Example::

        >>> [sorted(names) for _, names in read_globals([lambda x: x @ W])]
        [['W']]
    """
    for fn in reached:
        if _users_function(fn):
            yield fn, _global_names(fn.__code__) & dict.keys(fn.__globals__)


def _users_function(obj: Any) -> bool:
    """Whether ``obj`` is a Python function of the user's: defined in a module that is not
    PyTorch's or fxviews' (read from its globals: ``functools.wraps``, as around a transformed
    function, copies the user's ``__module__`` onto fxviews' own wrapper)."""
    if type(obj) is not types.FunctionType:
        return False
    return not internal_module(dict.get(obj.__globals__, "__name__") or obj.__module__ or "")


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code of functions defined in it may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if type(const) is types.CodeType:
            names |= _global_names(const)
    return names


def uninitialized_lazy_modules(modules: Any) -> list[Any]:
    """The lazy modules (``nn.LazyLinear``, ...) among ``modules`` whose parameters do not exist
    yet: their first call creates them, so only a later call can be traced.

    Example::

        >>> uninitialized_lazy_modules([torch.nn.LazyLinear(3)])
        [LazyLinear(in_features=0, out_features=3, bias=True)]
    """
    lazy = torch.nn.modules.lazy.LazyModuleMixin
    return [
        module
        for module in modules
        if of_type(module, lazy) and module.has_uninitialized_params()  # type: ignore[misc]
    ]
