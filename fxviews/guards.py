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

Not guarded, and why: tensor values (a graph is for every value: data dependence is found
while tracing and runs eagerly), ``requires_grad`` of inputs and of closed-over parameters
(autograd reads it at run time on the real tensors; only a Python branch on it would be baked
in), and other Python state ``fn`` reads (globals, attributes other than ``training``): a
function that branches on those must be called through a fresh ``transform`` or cleared with
``cache_clear()`` when they change.
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
    "global_names",
    "reachable_generators",
    "reachable_objects",
    "same_kind_check",
    "uninitialized_lazy_modules",
]

#: Reads a module's ``training`` flag: ``map`` over a tuple of modules with it is the cheapest
#: loop Python has for the check on every cache hit.
read_training = operator.attrgetter("training")


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

    __slots__ = ("check_process", "modules", "process", "trainings")

    def __init__(self, modules: Any = ()) -> None:
        self.process = GlobalStateGuard()
        self.check_process: Callable[[], bool] = self.process.check  # bound once: hits call it
        self.modules: tuple[torch.nn.Module, ...] = ()
        self.trainings: tuple[bool, ...] = ()
        self.watch(modules)

    def watch(self, modules: Any) -> None:
        """Guard on the current ``training`` flag of each of ``modules`` too."""
        known = {id(module) for module in self.modules}
        added = tuple(m for m in _unique(modules) if id(m) not in known)
        self.modules += added
        self.trainings += tuple(map(read_training, added))

    def check(self) -> bool:
        """Whether eager PyTorch would now read what the trace read (~0.2 us + 50 ns a module)."""
        return self.check_process() and tuple(map(read_training, self.modules)) == self.trainings

    def failure(self) -> str:
        """Which part of the state differs now, for logs (empty if none)."""
        if not self.process.check():
            return f"process state ({self.process.reason()})"
        changed = [
            type(m).__name__
            for m, was in zip(self.modules, self.trainings, strict=True)
            if m.training != was
        ]
        return f"training flag of {', '.join(changed)}" if changed else ""


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
        elif isinstance(obj, types.FunctionType) and not internal_module(obj.__module__ or ""):
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
    names = global_names(fn.__code__)
    found += [fn.__globals__[name] for name in names if name in fn.__globals__]
    return found


def global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code of functions defined in it may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
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
