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
   Read afresh only where item 7's version tags moved (see there).
3. **What a module holds**: the tensors of the modules ``fn`` reaches statically are read
   when the graph runs (Note [Parameters are read when the graph runs] in
   :mod:`fxviews.state.module_slots`), each checked to be of the kind traced; the graph holds
   those of modules found only while tracing by reference, so one assigned anew after the
   trace (``m.weight = nn.Parameter(...)``, ``load_state_dict(..., assign=True)``, pruning, a
   parametrization or a submodule swapped in) would leave it reading the old one, and a new
   submodule or parameter changes what ``fn`` computes. Every parameter, buffer or submodule
   assignment goes through ``nn.Module``'s registration hooks; the global ones fxviews
   installs count them up in each watched module's ``__dict__`` (:data:`REGISTRATIONS`), read
   with ``training`` by the same check. Writes into a tensor in place, ``.data`` and ``set_``
   are none (the graph reads the same object, as eager does); a change of layout is item 5's.
4. **What its code reads by name**: the module-level names the code of ``fn`` (and of the
   functions it reaches) reads, and its closure cells, each with the object it held when
   traced; modules and classes aside. A graph holds what they held by reference, or baked
   in: a functional update ``W = W - lr * g`` of a global, a learning rate rebound, a
   ``nonlocal`` rebinding. Checked by identity (``operator.is_`` mapped in C, ~40 ns a name).
5. **The layout of what it holds, where the graph depends on it**: a held tensor (a
   parameter, a closed-over tensor) whose memory an ``as_strided`` reads, or whose strides,
   contiguity or offset Python read while it was recorded (:func:`fxviews.state.layouts.
   layout_bound_constants`). ``model.to(memory_format=torch.channels_last)`` swaps such a
   parameter's ``.data`` under the same object: eager then reads other memory, or takes the
   other branch. Its strides and offset are compared on every call (~0.3 us a tensor; most
   graphs hold none). A tensor read from a module slot has its strides checked with its kind.
6. **The hooks a module call runs**: forward, forward-pre, backward and backward-pre hooks on
   each module above and the global ones (``register_module_forward_hook``, ...). A trace
   refuses a module that has any (a hook is a Python function of one call, which a graph
   cannot keep: that state runs eagerly), so a hook registered or removed later must be seen:
   the guard holds the keys of each hook dict (the hooks' handle ids, unique in the process).
   ``RemovableHandle.next_id`` counts every registration in the process: while it is the one
   the guard last saw, no dict changed (one compare); when it moved, the dicts are compared
   (~30 ns a dict) and, if they hold, the count is taken as seen.

7. **What a module binds**: every other entry of each module's instance dict above, by identity:
   a ``forward`` a library puts on the instance (accelerate's hooks do, as does ``m.forward =
   transform(m.forward)``), a number a module reads (``negative_slope``, ``p``, ``eps``), any
   attribute added or deleted; and the submodules of each that has any (a ``del m.sub``, or
   ``_modules`` written directly, which no registration hook sees); a tensor attribute of a
   module ``fn`` reaches statically is a slot, read and checked by kind (item 3), so a swap of
   the same kind runs the same graph. The hot check reads the version tag of each of those dicts
   (PEP 509's, which every write to the dict moves; ~40 ns a dict): while none moved, items 2,
   3 and 7 hold as they did. Where one moved, the flags, counts and bindings are compared (~0.6
   us a module), and the tags taken as seen if they hold (a ``train()`` and back). Where this
   Python gives no such tag, or a module's ``training`` is a property of its class, they are
   compared on every call.

Not guarded, and why: tensor values (a graph is for every value: data dependence is found
while tracing and runs eagerly), ``requires_grad`` of closed-over tensors that are no module's
(autograd reads it at run time on the real tensors; only a Python branch on it would be baked
in), and other Python state ``fn`` reads (the contents of a list or dict, in a module's
attribute or elsewhere; the attributes of objects that are no module; a method of a module's
class patched): a function that branches on those must be called through a fresh
``transform`` or cleared with ``cache_clear()`` when they change.
"""

from __future__ import annotations

import contextlib
import operator
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from fxviews.passes.compat.torch_internals import (
    GlobalStateGuard,
    TensorGuards,
    dict_version_reader,
    global_module_hook_dicts,
    module_hook_dicts,
    submodule_dict,
)
from fxviews.state.reachable import of_type, read_globals

__all__ = [
    "ModuleCalls",
    "StateGuard",
    "process_state",
    "read_version",
    "same_kind_check",
]

#: The attribute in a watched module's ``__dict__`` counting its registrations (item 3).
REGISTRATIONS = "_fxviews_registrations"

#: The attribute in a watched module's ``__dict__`` counting the parameters and buffers
#: assigned in place of one it held (item 3): what a graph reading the module's slots when it
#: runs reads anyway, but one holding them as constants does not.
SWAPS = "_fxviews_swaps"

#: Reads a watched module's ``training`` flag and registration count, where item 7's version
#: tags moved.
read_training = operator.attrgetter("training", REGISTRATIONS)
#: The same, with the swaps, for a module whose tensors the graph holds.
read_training_and_swaps = operator.attrgetter("training", REGISTRATIONS, SWAPS)


_read_cell = operator.attrgetter("cell_contents")


def _is_data(value: Any) -> bool:
    """Whether a name holding ``value`` is one a graph may have read (item 4): anything but a
    module of code or a class, which code reads for their functions."""
    return not of_type(value, (types.ModuleType, type))


def _read_mode(module: torch.nn.Module) -> tuple[bool, int]:
    """A module's ``training`` flag alone, in :data:`read_training`'s shape."""
    return module.training, 0


def _counting(kind: str) -> Callable[[torch.nn.Module, str, Any], None]:
    """A global registration hook for ``kind`` (``"_parameters"``, ``"_buffers"`` or
    ``"_modules"``): one more assignment of ``module``'s, counted where a guard watches it
    (item 3 of the Note), as a swap where a tensor takes a tensor's place."""

    def count(module: torch.nn.Module, name: str, value: Any) -> None:
        held = module.__dict__
        if REGISTRATIONS not in held:
            return
        before = held[kind].get(name)
        swap = of_type(value, torch.Tensor) and of_type(before, torch.Tensor)
        held[SWAPS if swap else REGISTRATIONS] += 1

    return count


torch.nn.modules.module.register_module_parameter_registration_hook(_counting("_parameters"))
torch.nn.modules.module.register_module_buffer_registration_hook(_counting("_buffers"))
torch.nn.modules.module.register_module_module_registration_hook(_counting("_modules"))


def process_state() -> GlobalStateGuard:
    """A snapshot of the process state now (item 1 of the Note), for a :class:`StateGuard`.

    Taken before a trace, which may change that state while it runs.
    """
    return GlobalStateGuard()


class StateGuard:
    """The state a graph was traced in; :meth:`check` says whether it still holds (Note [The
    state a graph bakes in]).

    Made once, finished, when the trace is done: ``process`` is the snapshot taken before it
    (:func:`process_state`), ``modules`` those ``fn`` reaches and those that ran, ``reached``
    what :func:`~fxviews.state.reachable.reachable_objects` found (whose functions' names and
    closure cells it holds), ``held`` the tensors the graph holds whose layout it depends on.

    Example::

        >>> guard = StateGuard(process_state(), [net])
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
        "hook_clock",
        "hook_dicts",
        "hook_keys",
        "holders",
        "holder_counts",
        "attributes",
        "module_dicts",
        "modules",
        "names",
        "process",
        "read",
        "trainings",
        "versions",
    )

    def __init__(
        self,
        process: GlobalStateGuard,
        modules: Iterable[torch.nn.Module] = (),
        *,
        holders: Iterable[torch.nn.Module] = (),
        reached: Iterable[Any] = (),
        held: Iterable[torch.Tensor] = (),
    ) -> None:
        self.process = process
        self.check_process: Callable[[], bool] = process.check  # bound once: hits call it
        # Items 2 and 3: each module's training flag and registration count; for ``holders``,
        # the modules whose tensors the graph holds as constants, their swaps too.
        # Of those whose flag reads: a module whose `training` raises has no mode eager could
        # branch on.
        self.modules = tuple(m for m in _unique(modules) if _mode_reads(m))
        known = {id(module) for module in self.modules}
        self.holders = tuple(m for m in _unique(holders) if id(m) not in known and _mode_reads(m))
        for module in (*self.modules, *self.holders):
            module.__dict__.setdefault(REGISTRATIONS, 0)
            module.__dict__.setdefault(SWAPS, 0)
        self.read: Callable[[torch.nn.Module], tuple[Any, ...]] = read_training
        self.trainings = tuple(map(read_training, self.modules))
        self.holder_counts = tuple(map(read_training_and_swaps, self.holders))
        # Item 7: what each module's instance dict binds besides those, and its submodules
        # where it has any; the dicts' version tags stand for items 2, 3 and 7 while no write
        # moves them.
        watched = (*self.modules, *self.holders)
        instance_dicts = tuple(module.__dict__ for module in watched)
        children = tuple(d for d in map(submodule_dict, watched) if d)
        self.module_dicts = (*instance_dicts, *children)
        self.attributes: tuple[Attributes, ...] | None = (
            *(
                _attributes(held, slots=i < len(self.modules))
                for i, held in enumerate(instance_dicts)
            ),
            *(_attributes(held, slots=False) for held in children),
        )
        self.versions = _versions(watched, self.module_dicts)
        # Item 4: (the globals dict, the name, what it held) as three tuples; closure cells and
        # what they held.
        named, cells = _bindings(reached)
        self.globals: tuple[dict[str, Any], ...] = ()
        self.names: tuple[str, ...] = ()
        self.global_values: tuple[Any, ...] = ()
        self.cells: tuple[Any, ...] = ()
        self.cell_values: tuple[Any, ...] = ()
        if named:
            rows = zip(*named, strict=True)
            self.globals, self.names, self.global_values = map(tuple, rows)
        if cells:
            self.cells, self.cell_values = map(tuple, zip(*cells, strict=True))
        # Item 5: the tensors the graph holds whose layout it depends on, each with its traced
        # (strides, storage offset).
        self.held = tuple((t, t.stride(), t.storage_offset()) for t in held)
        # Whether items 4 and 5 hold anything: most graphs skip their check.
        self.bound = bool(self.globals or self.cells or self.held)
        # Item 6: the hook dicts of the modules and the global ones, with their keys now.
        self.hook_dicts = (
            *global_module_hook_dicts(),
            *(d for module in (*self.modules, *self.holders) for d in module_hook_dicts(module)),
        )
        self.hook_keys = tuple(map(tuple, self.hook_dicts))
        self.hook_clock = RemovableHandle.next_id

    @classmethod
    def for_eager_calls(
        cls, process: GlobalStateGuard, modules: Iterable[torch.nn.Module]
    ) -> StateGuard:
        """The guard of an entry that runs ``fn`` eagerly: process state and module modes only.

        Eager calls read whatever the modules hold, and every name, afresh at each call; one
        whose function assigns a buffer on every call (an EMA kept by rebinding) would
        otherwise trace again at every call.
        """
        guard = cls(process, modules)
        guard.read = _read_mode
        guard.trainings = tuple(map(_read_mode, guard.modules))
        guard.attributes = None
        return guard

    def modules_hold(self) -> bool:
        """Whether every module items 2, 3 and 7 watch reads as when traced: at once where no
        write moved their dicts' version tags; else by comparing what they hold, taking the
        tags as seen where it holds (``train()`` and back, a registration undone)."""
        versions = tuple(map(read_version, self.module_dicts))
        if versions == self.versions:
            return True
        if (
            tuple(map(self.read, self.modules)) != self.trainings
            or tuple(map(read_training_and_swaps, self.holders)) != self.holder_counts
            or not self.attributes_hold()
        ):
            return False
        if self.versions is not None:
            self.versions = versions
        return True

    def attributes_hold(self) -> bool:
        """Whether each module's instance dict binds what it bound when traced (item 7)."""
        if self.attributes is None:  # an eager entry: eager reads them at each call
            return True
        return all(map(_binds_as_traced, self.module_dicts, self.attributes))

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

    def hooks_hold(self) -> bool:
        """Whether every hook dict item 6 watches holds the hooks it held when traced."""
        clock = RemovableHandle.next_id
        if clock == self.hook_clock:
            return True
        if tuple(map(tuple, self.hook_dicts)) != self.hook_keys:
            return False
        self.hook_clock = clock  # registrations elsewhere, or added and removed since
        return True

    def check(self) -> bool:
        """Whether eager PyTorch would now read what the trace read (~0.2 us, ~40 ns a module
        dict no write moved, ~40 ns a name); False where reading it raises (a module's
        ``training`` property)."""
        try:
            return (
                self.check_process()
                and self.modules_hold()
                and (not self.bound or self.bindings_hold())
                and self.hooks_hold()
            )
        except Exception:  # noqa: BLE001 - the user's property failed: not the state traced
            return False

    def failure(self) -> str:
        """Which part of the state differs now, for logs (empty if none)."""
        try:
            return self._failure()
        except Exception as err:  # noqa: BLE001 - a module's `training` property raised
            return f"a module's mode could not be read ({type(err).__name__})"

    def _failure(self) -> str:
        if not self.process.check():
            return f"process state ({self.process.reason()})"
        reads: list[tuple[Callable[[torch.nn.Module], Any], tuple[Any, ...], tuple[Any, ...]]] = [
            (self.read, self.modules, self.trainings),
            (read_training_and_swaps, self.holders, self.holder_counts),
        ]
        changed = [
            f"{type(m).__name__}'s {'training flag' if m.training != was[0] else 'parameters'}"
            for read, modules, counts in reads
            for m, was in zip(modules, counts, strict=True)
            if read(m) != was
        ]
        if not self.attributes_hold():
            changed.append(
                "a module attribute (its forward, another attribute than a parameter or buffer, "
                "a submodule) was assigned or deleted"
            )
        if self.bound and not self.bindings_hold():
            changed.append(
                "a name or closure cell the function reads now holds another object, or a "
                "tensor it holds has another layout"
            )
        if not self.hooks_hold():
            changed.append("a module hook was registered or removed")
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


def _bindings(
    reached: Iterable[Any],
) -> tuple[list[tuple[dict[str, Any], str, Any]], list[tuple[Any, Any]]]:
    """The module-level names and closure cells the functions among ``reached`` read (item 4),
    each with what it holds now: (globals dict, name, object) and (cell, object) rows."""
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
    return list(named.values()), list(cells.values())


#: Reads a dict's version tag, which every write to the dict moves (item 7).
read_version = dict_version_reader()


#: What :func:`_attributes` keeps of a module's dict: its names in order, their objects
#: (:data:`_SLOT` for a tensor the graph reads as a slot), the positions item 7 does not
#: compare (the swap count's) and those of the slots.
Attributes = tuple[tuple[str, ...], tuple[Any, ...], tuple[int, ...], tuple[int, ...]]

#: Stands for a tensor of a module's instance dict read as a slot: item 7 leaves it to the
#: slots' check (Note [Parameters are read when the graph runs]), which takes a swap in of
#: the same kind (torchopt's MetaSGD assigns one at every step).
_SLOT = object()


def _attributes(held: dict[str, Any], *, slots: bool) -> Attributes:
    """What a module's instance dict or submodule dict binds (item 7); its tensors are slots
    where ``slots`` (a module ``fn`` reaches statically), else bound by identity too (a
    module found only while tracing, whose tensors the graph holds)."""
    names = tuple(held)
    objects = list(held.values())
    positions = (
        tuple(i for i, value in enumerate(objects) if of_type(value, torch.Tensor)) if slots else ()
    )
    for i in positions:
        objects[i] = _SLOT
    skipped = (names.index(SWAPS),) if SWAPS in held else ()
    return names, tuple(objects), skipped, positions


def _binds_as_traced(held: dict[str, Any], traced: Attributes) -> bool:
    """Whether ``held`` binds the names of ``traced``, in order, each to the same object, a
    slot to a tensor, and anything to the swap count: a tensor swapped in for a slot's is read
    when the graph runs (item 3 holds it to its count where the graph holds the module's
    tensors). Its ``training`` flag and registration count compared equal first (items 2 and
    3), they are the same objects too (``True``, ``False``, a count only ever incremented)."""
    names, objects, skipped, slots = traced
    if tuple(held) != names:
        return False
    values = list(held.values())
    for i in skipped:
        values[i] = objects[i]
    for i in slots:
        if of_type(values[i], torch.Tensor):
            values[i] = _SLOT
    return all(map(operator.is_, values, objects))


def _versions(
    modules: Sequence[torch.nn.Module], dicts: Sequence[dict[str, Any]]
) -> tuple[Any, ...] | None:
    """The version tags of ``dicts`` (those of ``modules``); None (never equal to a reading)
    where a module's ``training`` is not an entry of its dict (a property of its class),
    which a write to the dict would not show."""
    if all(
        "training" in module.__dict__ and not hasattr(type(module), "training")
        for module in modules
    ):
        return tuple(map(read_version, dicts))
    return None


def _mode_reads(module: torch.nn.Module) -> bool:
    """Whether ``module.training`` reads (a property of the user's may raise)."""
    try:
        module.training  # noqa: B018 - the read is the check
    except Exception:  # noqa: BLE001 - the user's property, theirs to fail
        return False
    return True


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
