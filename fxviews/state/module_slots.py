"""The tensors a graph takes from the modules a function reaches, read when the graph runs.

Note [Parameters are read when the graph runs]
----------------------------------------------
Libraries built on ``torch.func`` change a model's tensors between calls without assigning
them through ``nn.Module.__setattr__``: ``torch.func.functional_call`` and tensordict's
``to_module`` write ``module._parameters[name]`` (and ``_buffers``) for the length of a call,
``stack_module_state`` ensembles put tensors batched by an enclosing ``vmap`` there, torchopt's
``MetaSGD`` pops a parameter and sets a plain tensor attribute in its place, and
``torch.utils.swap_tensors`` changes a tensor's contents under the same object. A graph that
held the tensors of the first call as constants would keep computing with them. So, as
Dynamo's inlined ``nn.Module``s lift parameters and buffers to graph inputs (torch 2.5 on):

1. **Slots.** Before a trace, every tensor held in a ``_parameters``, ``_buffers`` or instance
   ``__dict__`` entry of the modules ``fn`` reaches (:class:`ModuleSlots`: a dict and a key
   each) becomes an input of the graph. Tensors on the meta device hold no values and stay
   where they are (the recipe of ``stack_module_state`` keeps its base model there). A tensor
   held in two slots (tied weights) is one input, and the slots must hold one object when the
   graph runs.
2. **The trace** runs ``fn`` with each slot holding the trace's sample for it
   (:meth:`ModuleSlots.holding`), made as an argument's is (Note [The layout of a call]), and
   put back after. Slots the graph never reads are dropped from it (a ``functional_call`` that
   replaced them all reads none). A recurrent module's weight cache (``_flat_weights``, which
   its ``forward`` rebuilds where it finds other weights there, a rebinding a trace refuses)
   follows the slots for as long.
3. **Each call** reads the slots afresh (:meth:`ModuleSlots.read`, a C-level ``dict.get`` a
   slot) and passes what they hold to the graph, after checking in C++ that each is of the kind
   its sample was (type, dispatch keys, dtype, device, ``requires_grad``, sizes, strides where
   called directly: Dynamo's ``TensorGuards``, as for positional tensors). A slot holding
   another kind of tensor, nothing, or another object where tied ones shared one, traces
   again: another graph, never a wrong one. Whatever a library swapped in of the same kind (a
   plain tensor, a ``Parameter``, a tensor of an enclosing ``grad`` or of a ``vmap`` ensemble)
   is what the graph computes with, and what a call writes into a buffer lands in the tensor
   the module holds at that call.

What is not a slot: tensors of modules reached only while ``fn`` runs (through another
object's attributes or a container), which stay constants of the graph, guarded on their
assignment (Note [The state a graph bakes in], item 3).

Example::

    >>> slots = ModuleSlots.of([net])
    >>> [key for key in slots.keys]
    ['weight', 'bias']
    >>> with slots.holding([w, b]):
    ...     net(x)   # computes with w and b
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.passes.compat.torch_internals import rnn_weights_as_held

__all__ = ["NO_SLOTS", "ModuleSlots"]

_SLOT_DICTS = ("_parameters", "_buffers")


@dataclass(frozen=True, eq=False)
class ModuleSlots:
    """The slots a graph reads tensors from (see the Note): one per distinct tensor, as the
    dict that holds it and its key there; ``alias_*`` are further slots that held one of those
    tensors (``alias_of`` its position) and must hold the same object when the graph runs."""

    dicts: tuple[dict[str, Any], ...] = ()
    keys: tuple[str, ...] = ()
    alias_dicts: tuple[dict[str, Any], ...] = ()
    alias_keys: tuple[str, ...] = ()
    alias_of: tuple[int, ...] = ()
    #: The recurrent modules among them, whose weight caches follow what the slots hold.
    recurrent: tuple[torch.nn.RNNBase, ...] = ()

    @classmethod
    def of(cls, modules: Iterable[torch.nn.Module]) -> ModuleSlots:
        """The slots of ``modules`` (each module once) that hold a tensor with values."""
        dicts: list[dict[str, Any]] = []
        keys: list[str] = []
        position: dict[int, int] = {}  # id of a tensor -> its slot
        aliases: list[tuple[dict[str, Any], str, int]] = []
        recurrent: list[torch.nn.RNNBase] = []
        seen: set[int] = set()
        for module in modules:
            if id(module) in seen:
                continue
            seen.add(id(module))
            if isinstance(module, torch.nn.RNNBase):
                recurrent.append(module)
            held = [module.__dict__[name] for name in _SLOT_DICTS]
            for holder in (*held, module.__dict__):
                for key, value in holder.items():
                    # By its real type: a __class__ of the user's may raise (Note [What a
                    # function reaches], item 1).
                    if not issubclass(type(value), torch.Tensor) or value.device.type == "meta":
                        continue
                    if id(value) in position:
                        aliases.append((holder, key, position[id(value)]))
                        continue
                    position[id(value)] = len(dicts)
                    dicts.append(holder)
                    keys.append(key)
        return cls(tuple(dicts), tuple(keys), *_alias_columns(aliases), recurrent=tuple(recurrent))

    def __len__(self) -> int:
        return len(self.keys)

    def read(self) -> tuple[Any, ...]:
        """What each slot holds now (None for a slot emptied since)."""
        return tuple(map(dict.get, self.dicts, self.keys))

    def aliases_hold(self, values: Sequence[Any]) -> bool:
        """Whether each alias slot holds the object its tensor's slot holds (``values``)."""
        held = map(dict.get, self.alias_dicts, self.alias_keys)
        return all(map(operator.is_, held, map(values.__getitem__, self.alias_of)))

    def keep(self, positions: Sequence[int]) -> ModuleSlots:
        """These slots, only those at ``positions`` (the ones a graph reads) and their aliases."""
        renumber = {old: new for new, old in enumerate(positions)}
        aliases = [
            (d, k, renumber[of])
            for d, k, of in zip(self.alias_dicts, self.alias_keys, self.alias_of, strict=True)
            if of in renumber
        ]
        return ModuleSlots(
            tuple(self.dicts[i] for i in positions),
            tuple(self.keys[i] for i in positions),
            *_alias_columns(aliases),
            recurrent=self.recurrent,
        )

    @contextlib.contextmanager
    def holding(self, values: Sequence[Any]) -> Iterator[list[str]]:
        """Within, each slot (and its aliases) holds the corresponding one of ``values``; what
        they held before is put back after, whatever happens. Yields a list that names, on
        exit, each slot the block assigned anew (``self.avg = ...`` on a buffer): a rebinding
        of Python state, which a graph cannot replay (Note [Python state a trace rebinds]).

        Example::

            >>> with slots.holding(samples) as rebound:
            ...     fn(x)
            >>> rebound
            ['avg']
        """
        dicts = (*self.dicts, *self.alias_dicts)
        keys = (*self.keys, *self.alias_keys)
        new = (*values, *(values[i] for i in self.alias_of))
        before = [d.get(k, _EMPTY) for d, k in zip(dicts, keys, strict=True)]
        rebound: list[str] = []
        try:
            for d, k, value in zip(dicts, keys, new, strict=True):
                d[k] = value
            # An RNN's forward rebuilds its weight cache where its weights changed (a
            # rebinding the trace would refuse): the cache follows the slots too.
            with rnn_weights_as_held(self.recurrent):
                yield rebound
        finally:
            for d, k, value, was in zip(dicts, keys, new, before, strict=True):
                if d.get(k, _EMPTY) is not value:
                    rebound.append(k)
                if was is _EMPTY:
                    d.pop(k, None)
                else:
                    d[k] = was


_EMPTY = object()

#: The slots of a graph that reads none.
NO_SLOTS = ModuleSlots()


def _alias_columns(
    rows: Sequence[tuple[dict[str, Any], str, int]],
) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...], tuple[int, ...]]:
    """Alias rows (dict, key, position of its tensor's slot) as ModuleSlots' three columns."""
    return (
        tuple(row[0] for row in rows),
        tuple(row[1] for row in rows),
        tuple(row[2] for row in rows),
    )
