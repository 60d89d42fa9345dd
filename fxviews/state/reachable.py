"""TODO"""

import contextlib
import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from fxviews.passes.source_lines import internal_module

__all__ = [
    "held_by",
    "reachable_generators",
    "reachable_objects",
    "read_globals",
    "uninitialized_lazy_modules",
]


def reachable_objects(fn: Callable[..., Any]) -> Iterator[Any]:
    """Every object ``fn`` reaches statically, ``fn`` included: ``functools.partial`` functions
    and arguments, a bound method's ``self``, closure cells, defaults, the module-level names its
    code (nested functions' code included) reads (not searched in PyTorch's own functions),
    and the items of lists, tuples and dicts among
    them. A module found is yielded, not searched further: its submodules are its own business.

    Example::

        >>> scale = torch.nn.Linear(2, 2)
        >>> any(obj is scale for obj in reachable_objects(lambda x: scale(x)))
        True
    """
    seen: set[int] = set()
    pending: list[Any] = [fn]
    while pending:
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, (torch.Tensor, torch.nn.Module, type, types.ModuleType)):
            continue
        if isinstance(obj, functools.partial):
            pending += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, list):
            # The built-in type's own iteration: a subclass's may raise or lie (e3nn's Irreps).
            pending += list.__iter__(obj)
        elif isinstance(obj, tuple):
            pending += tuple.__iter__(obj)
        elif isinstance(obj, dict):
            pending += dict.values(obj)
        elif isinstance(obj, types.MethodType):
            pending += [obj.__self__, obj.__func__]
        elif _users_function(obj):
            # PyTorch's and fxviews' own functions reach no module of the user's but through
            # their arguments: their globals would only lead through torch.
            pending += _function_references(obj)


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
        modules = obj.modules() if isinstance(obj, torch.nn.Module) else ()
        attributes = [value for module in modules for value in vars(module).values()]
        for candidate in (obj, *attributes):
            if isinstance(candidate, torch.Generator):
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
        try:
            attributes = object.__getattribute__(obj, "__dict__")
        except Exception:  # noqa: BLE001 - no instance dict, or one its class will not show
            continue
        if type(attributes) is not dict:
            continue
        for value in dict.values(attributes):
            yield value
            if type(value) is dict and isinstance(obj, torch.nn.Module):
                yield from dict.values(value)  # _parameters, _buffers, _modules


def _function_references(fn: types.FunctionType) -> list[Any]:
    found: list[Any] = []
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):  # an unassigned cell
            found.append(cell.cell_contents)
    found += fn.__defaults__ or ()
    found += (fn.__kwdefaults__ or {}).values()
    names = _global_names(fn.__code__)
    found += [fn.__globals__[name] for name in names if name in fn.__globals__]
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
            yield fn, _global_names(fn.__code__) & fn.__globals__.keys()


def _users_function(obj: Any) -> bool:
    """Whether ``obj`` is a Python function of the user's: defined in a module that is not
    PyTorch's or fxviews' (read from its globals: ``functools.wraps``, as around a transformed
    function, copies the user's ``__module__`` onto fxviews' own wrapper)."""
    if not isinstance(obj, types.FunctionType):
        return False
    return not internal_module(obj.__globals__.get("__name__") or obj.__module__ or "")


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code of functions defined in it may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
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
        if isinstance(module, lazy) and module.has_uninitialized_params()  # type: ignore[misc]
    ]
