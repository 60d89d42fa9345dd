"""Python state a trace rebinds: module attributes, object attributes and globals.

Note [Python state a trace rebinds]
-----------------------------------
A recording sees ``fn``'s ops, not its Python statements. A statement that rebinds state
``fn`` can reach, ``self.avg = self.avg * 0.5 + x`` (an EMA, an RNN's carried state),
``self.calls += 1``, ``global total; total = total + x``, runs once, while tracing, and never
again: the cached graph reads the tensor the attribute held when it was traced, and the
attribute keeps the trace's value. Eager rebinds it on every call. In-place writes
(``self.avg.mul_(0.5).add_(x)``) are ops, and are recorded.

So, around the trace, :class:`Rebinding` keeps a shallow copy of the state ``fn`` can reach:

1. the attribute dicts of the modules it reaches (with every submodule) and of the plain
   objects among its arguments and the objects it reaches (``self`` of a bound method, a
   closed-over config), and each module's ``_parameters``, ``_buffers`` and ``_modules``;
2. the module-level names its code reads, in its globals.

After the trace each entry is compared by identity. Whatever changed is put back (the trace's
writes are not the call's: the call then runs as eager does), and the names of what changed
say why the trace is refused. Mutations inside containers (``list.append``) are not seen:
docs/guards.md.

Example::

    >>> rebinding = Rebinding([ema_module], [])
    >>> ema_module(x)          # runs self.avg = self.avg * 0.5 + x
    >>> rebinding.undo()
    ['EMA.avg']
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import torch

from fxviews.guards import REGISTRATIONS, read_globals
from fxviews.passes.source_lines import internal_module

__all__ = ["Rebinding"]

#: The dicts of a module that hold its state besides its ``__dict__``.
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


class Rebinding:
    """A shallow copy of the Python state ``objects`` and ``functions`` reach (see the Note),
    to compare with and put back after a trace."""

    def __init__(self, objects: Iterable[Any], functions: Iterable[Any]) -> None:
        # (whose, the dict, its entries as they were, whether keys it gains count too)
        self._kept: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = []
        seen: set[int] = set()
        for obj in objects:
            for owner in obj.modules() if isinstance(obj, torch.nn.Module) else [obj]:
                if id(owner) in seen or not _has_own_state(owner):
                    continue
                seen.add(id(owner))
                whose = type(owner).__name__
                for state in [vars(owner)] + [
                    getattr(owner, name)
                    for name in (_MODULE_DICTS if isinstance(owner, torch.nn.Module) else ())
                ]:
                    kept = {k: v for k, v in state.items() if k != REGISTRATIONS}
                    self._kept.append((whose, state, kept, True))
        for fn, names in read_globals(functions):
            kept = {name: fn.__globals__[name] for name in names}
            self._kept.append(("global", fn.__globals__, kept, False))

    def undo(self) -> list[str]:
        """Put back every entry that changed since the copy; the changed ones, by name."""
        changed: set[str] = set()
        for whose, state, kept, whole in self._kept:
            # A guard's registration count (set on the modules a trace finds) is fxviews' own.
            for key in [k for k in state if k not in kept and k != REGISTRATIONS] if whole else []:
                changed.add(_spelled(whose, key))
                del state[key]
            for key, value in kept.items():
                if state.get(key, _MISSING) is not value:
                    changed.add(_spelled(whose, key))
                    state[key] = value
        return sorted(changed)


_MISSING = object()


def _spelled(whose: str, key: str) -> str:
    return f"global {key}" if whose == "global" else f"{whose}.{key}"


def _has_own_state(obj: Any) -> bool:
    """Whether ``obj``'s attributes are state ``fn`` computes with: a module's, or those of an
    object of the user's own class (not a function, class, tensor, or PyTorch's own object,
    whose attributes PyTorch may fill in lazily: an ``OpOverload``'s namespace)."""
    if isinstance(obj, torch.nn.Module):
        return True
    plain = not isinstance(
        obj, (torch.Tensor, type, types.ModuleType, types.FunctionType, types.MethodType)
    )
    users = not internal_module(type(obj).__module__ or "")
    return plain and users and isinstance(getattr(obj, "__dict__", None), dict)
