"""What a traced graph bakes in that eager PyTorch reads afresh on every call: the cache's guards.

Note [The state a graph bakes in]
---------------------------------
Tracing runs ``fn`` once and keeps the aten ops it ran. Whatever Python read on the way to
choosing those ops is frozen into the graph: ``if self.training:`` in Dropout and BatchNorm,
the dtype ``torch.zeros(3)`` takes from the default dtype, the casts autocast inserts, the
kernel grad mode or deterministic algorithms select. Eager PyTorch reads each of them again on
every call, so a graph may only be reused where they read the same. Each cache entry holds a
:class:`StateGuard` made when it was traced, checked on every hit (a miss traces again, or
finds the entry made for the state now in force):

1. **Process state**: the set Dynamo's guards check before reusing a compiled graph, snapshot
   and compared in C++ (:class:`GlobalStateGuard`, ~0.2 us): grad mode, autocast (enabled and
   dtype, per device type), the default dtype, deterministic algorithms (and warn-only),
   TF32 and reduced-precision matmul flags, whether torch function modes are enabled, and the
   number of threads (the last decides no value, and costs only a retrace).
2. **Module modes**: the ``training`` flag of every ``nn.Module`` the function reaches, found
   two ways. Statically (:func:`reachable_objects`): ``fn`` itself, ``functools.partial``
   arguments, a bound method's ``self``, closure cells, defaults and the module-level names
   its code reads, with every submodule of each module found. Dynamically: every module whose
   ``forward`` runs while the function is traced (:class:`ModuleCalls`), which finds modules
   reached through attributes, containers and ``torch.func.functional_call`` targets.
   Checking them costs ~50 ns a module (a tuple of flags compared with the traced one).
3. **What a module holds**: the graph holds the parameters and buffers it read by reference,
   so one assigned anew after the trace (``m.weight = nn.Parameter(...)``,
   ``load_state_dict(..., assign=True)``, pruning, a parametrization or a submodule swapped
   in) would leave it reading the old one. Every parameter, buffer or submodule assignment
   goes through ``nn.Module``'s registration hooks; the global ones fxviews installs count
   them up in each watched module's ``__dict__`` (:data:`REGISTRATIONS`), read with
   ``training`` by the same check. Writes into a tensor in place, ``.data`` and ``set_`` are
   none (the graph reads the same object, as eager does); a change of layout is item 5's.
4. **What its code reads by name**: the module-level names the code of ``fn`` (and of the
   functions it reaches) reads, and its closure cells, each with the object it held when
   traced; modules and classes aside. A graph holds what they held by reference, or baked
   in: a functional update ``W = W - lr * g`` of a global, a learning rate rebound, a
   ``nonlocal`` rebinding. Checked by identity (``operator.is_`` mapped in C, ~40 ns a name).
5. **The layout of what it holds, where the graph depends on it**: a held tensor (a
   parameter, a closed-over tensor) whose memory an ``as_strided`` reads, or whose strides,
   contiguity or offset Python read while it was recorded (:func:`fxviews.call_layouts.
   layout_bound_constants`). ``model.to(memory_format=torch.channels_last)`` swaps such a
   parameter's ``.data`` under the same object: eager then reads other memory, or takes the
   other branch. Its strides and offset are compared on every call (~0.3 us a tensor; most
   graphs hold none).

Not guarded, and why: tensor values (a graph is for every value: data dependence is found
while tracing and runs eagerly), ``requires_grad`` of inputs and of closed-over parameters
(autograd reads it at run time on the real tensors; only a Python branch on it would be baked
in), and other Python state ``fn`` reads (attributes other than ``training``, the contents of
a list or dict): a function that branches on those must be called through a fresh
``transform`` or cleared with ``cache_clear()`` when they change.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from fxviews.passes.source_lines import internal_module
from fxviews.passes.torch_internals import GlobalStateGuard, TensorGuards

__all__ = [
    "ModuleCalls",
    "StateGuard",
    "read_globals",
    "reachable_generators",
    "reachable_objects",
    "same_kind_check",
    "uninitialized_lazy_modules",
]

#: The attribute in a watched module's ``__dict__`` counting its registrations (item 3).
REGISTRATIONS = "_fxviews_registrations"

#: Reads a watched module's ``training`` flag and registration count: ``map`` over a tuple of
#: modules with it is the cheapest loop Python has for the check on every cache hit.
read_training = operator.attrgetter("training", REGISTRATIONS)


_read_cell = operator.attrgetter("cell_contents")


def _is_data(value: Any) -> bool:
    """Whether a name holding ``value`` is one a graph may have read (item 4): anything but a
    module of code or a class, which code reads for their functions."""
    return not isinstance(value, (types.ModuleType, type))


def _read_mode(module: torch.nn.Module) -> tuple[bool, int]:
    """A module's ``training`` flag alone, in :data:`read_training`'s shape."""
    return module.training, 0


def _count_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    """A global registration hook: one more assignment of a parameter, buffer or submodule of
    ``module``, counted where a guard watches it (item 3 of the Note)."""
    held = module.__dict__
    if REGISTRATIONS in held:
        held[REGISTRATIONS] += 1


for _register in (
    torch.nn.modules.module.register_module_parameter_registration_hook,
    torch.nn.modules.module.register_module_buffer_registration_hook,
    torch.nn.modules.module.register_module_module_registration_hook,
):
    _register(_count_registration)


class StateGuard:
    """The process state and module modes a graph was traced in; :meth:`check` says whether
    they still hold (see Note [The state a graph bakes in]).

    Made in the caller's state, before tracing; ``modules`` are filled in once the trace has
    found them.

    Example::

        >>> guard = StateGuard([net])
        >>> guard.check()
        True
        >>> net.eval()
        >>> guard.check()
        False
    """

    __slots__ = (
        "bound",
        "cell_values",
        "cells",
        "check_process",
        "global_values",
        "globals",
        "held",
        "modules",
        "names",
        "process",
        "read",
        "trainings",
    )

    def __init__(self, modules: Any = ()) -> None:
        self.process = GlobalStateGuard()
        self.check_process: Callable[[], bool] = self.process.check  # bound once: hits call it
        self.modules: tuple[torch.nn.Module, ...] = ()
        self.trainings: tuple[tuple[bool, int], ...] = ()
        self.read: Callable[[torch.nn.Module], tuple[bool, int]] = read_training
        self.watch(modules)
        # Item 4: (the globals dict, the name, what it held) as three tuples; closure cells and
        # what they held; whether there is any.
        self.globals: tuple[dict[str, Any], ...] = ()
        self.names: tuple[str, ...] = ()
        self.global_values: tuple[Any, ...] = ()
        self.cells: tuple[Any, ...] = ()
        self.cell_values: tuple[Any, ...] = ()
        # Item 5: the tensors the graph holds whose layout it depends on, each with its traced
        # (strides, storage offset).
        self.held: tuple[tuple[torch.Tensor, tuple[int, ...], Any], ...] = ()
        self.bound = False

    def watch_bindings(self, reached: Iterable[Any]) -> None:
        """Guard on the objects the names and closure cells of the functions among ``reached``
        (what :func:`reachable_objects` found) hold now (item 4 of the Note)."""
        named: dict[tuple[int, str], tuple[dict[str, Any], str, Any]] = {}
        cells: dict[int, tuple[Any, Any]] = {}
        for fn, names in read_globals(reached):
            for name in names:
                if _is_data(fn.__globals__[name]):
                    named[id(fn.__globals__), name] = (fn.__globals__, name, fn.__globals__[name])
            for cell in fn.__closure__ or ():
                with contextlib.suppress(ValueError):  # an unassigned cell
                    if _is_data(cell.cell_contents):
                        cells[id(cell)] = (cell, cell.cell_contents)
        if named:
            rows = zip(*named.values(), strict=True)
            self.globals, self.names, self.global_values = map(tuple, rows)
        if cells:
            self.cells, self.cell_values = map(tuple, zip(*cells.values(), strict=True))
        self.bound = bool(named or cells or self.held)

    def watch_layouts(self, held: Iterable[torch.Tensor]) -> None:
        """Guard on the strides and storage offset of each of ``held`` (item 5 of the Note)."""
        self.held = tuple((t, t.stride(), t.storage_offset()) for t in held)
        self.bound = self.bound or bool(self.held)

    def bindings_hold(self) -> bool:
        """Whether every name and cell item 4 watches holds what it held when traced, and every
        tensor item 5 watches has its traced layout."""
        return (
            all(map(operator.is_, map(dict.get, self.globals, self.names), self.global_values))
            and all(map(operator.is_, map(_read_cell, self.cells), self.cell_values))
            and (
                not self.held
                or all(t.stride() == s and t.storage_offset() == o for t, s, o in self.held)
            )
        )

    def watch(self, modules: Any) -> None:
        """Guard on the current ``training`` flag and registrations of each of ``modules`` too."""
        known = {id(module) for module in self.modules}
        added = tuple(m for m in _unique(modules) if id(m) not in known)
        for module in added:
            module.__dict__.setdefault(REGISTRATIONS, 0)
        self.modules += added
        self.trainings += tuple(map(self.read, added))

    def for_eager_calls(self) -> StateGuard:
        """This guard, reading no registrations from now on: an entry that runs ``fn`` eagerly
        reads whatever its modules hold at each call, and one whose function assigns a buffer
        on every call (an EMA kept by rebinding) would otherwise trace again at every call."""
        self.read = _read_mode
        self.trainings = tuple(map(_read_mode, self.modules))
        self.bound = False  # eager calls read every name afresh
        return self

    def check(self) -> bool:
        """Whether eager PyTorch would now read what the trace read (~0.2 us + 50 ns a module,
        ~40 ns a name)."""
        return (
            self.check_process()
            and tuple(map(self.read, self.modules)) == self.trainings
            and (not self.bound or self.bindings_hold())
        )

    def failure(self) -> str:
        """Which part of the state differs now, for logs (empty if none)."""
        if not self.process.check():
            return f"process state ({self.process.reason()})"
        changed = [
            f"{type(m).__name__}'s {'training flag' if m.training != was[0] else 'parameters'}"
            for m, was in zip(self.modules, self.trainings, strict=True)
            if self.read(m) != was
        ]
        if self.bound and not self.bindings_hold():
            changed.append(
                "a name or closure cell the function reads now holds another object, or a "
                "tensor it holds has another layout"
            )
        return ", ".join(changed)


def same_kind_check(
    tensors: Sequence[torch.Tensor], strides: Sequence[Sequence[int] | None] | None = None
) -> Callable[..., bool]:
    """A check, in C++, that the tensors it is given are of the kind of ``tensors``, one by one.

    Same Python type, dispatch keys (under the thread-local dispatch state in force at the
    check, so inside ``vmap`` a BatchedTensor matches only a BatchedTensor), dtype, device,
    ``requires_grad`` and sizes (logical ones for a wrapper); strides where ``strides`` gives
    them (one entry per tensor, None: not compared). That is stricter than transform's
    signature key (shape, dtype, device, and the layout Note [The layout of a call] keys on),
    so a pass implies the key matches. It is Dynamo's ``TensorGuards`` (~80 ns a tensor,
    against ~0.35 us for the key in Python); building one costs ~1.5 us. A call with another
    number of tensors than ``tensors`` raises TypeError: compare the count first.

    Example::

        >>> check = same_kind_check([torch.ones(2, 3)])
        >>> check(torch.zeros(2, 3)), check(torch.zeros(3, 2))
        (True, False)
    """
    # One list per tensor, each dim's size or None for "not compared" (PyTorch's stub types
    # them as one flat list, which the C++ rejects).
    sizes: Any = [list(tensor.shape) for tensor in tensors]
    strides = strides or [None] * len(tensors)
    compared: Any = [
        [None] * tensor.dim() if given is None else list(given)
        for tensor, given in zip(tensors, strides, strict=True)
    ]
    guards = TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=compared)
    return guards.check


def _unique(modules: Any) -> list[torch.nn.Module]:
    seen: dict[int, torch.nn.Module] = {}
    for module in modules:
        seen.setdefault(id(module), module)
    return list(seen.values())


class ModuleCalls:
    """Collects every module whose ``forward`` runs while it is active (a global pre-hook).

    Example::

        >>> with ModuleCalls() as calls:
        ...     net(x)
        >>> net in calls.modules
        True
    """

    def __init__(self) -> None:
        self.modules: list[torch.nn.Module] = []
        self._handle: Any = None

    def __enter__(self) -> ModuleCalls:
        def seen(module: torch.nn.Module, args: Any) -> None:
            self.modules.append(module)

        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(seen)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


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
        elif isinstance(obj, (list, tuple)):
            pending += obj
        elif isinstance(obj, dict):
            pending += obj.values()
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
