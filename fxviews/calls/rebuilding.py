"""What ``fn`` returns, from its traced graph's flat outputs, cheaply per call.

Note [What fn returns]
----------------------
A cached graph returns a flat list of tensors; ``fn``'s result is rebuilt around them on every
call, and must be what eager's call returns: the same types, the objects eager hands out again
where it hands them out again, new ones where it makes new ones. :func:`flatten_result` reads
the result of the trace's run of ``fn``:

1. **Containers** pytree knows (tuples, lists, dicts, named tuples, PyTorch's return types,
   registered classes) are rebuilt on each call; a ``torch.Size`` as a ``torch.Size`` (pytree
   unflattens it as a tuple), and a dataclass pytree does not know as itself, by calling its
   class with its fields (every field an init field, no other attribute, no ``__post_init__``,
   which could change what it is given: such an object is one ``fn`` makes, item 3).
2. **A tensor** is what the graph returns: an ``nn.Parameter`` where ``fn`` made one (the trace
   keeps ``nn.Parameter(t)`` as a node: Note [What autograd sees is part of the trace]), and a
   tensor ``fn`` returned as it got it (an argument, a parameter, a closed-over tensor) is that
   tensor, the graph's input or constant itself.
3. **Any other object** is returned as itself where ``fn`` reached it before the call (an
   argument, a module's or reached object's attribute, a global, a closed-over object:
   containers among them too, which pytree would have copied), or where it is a value (a
   number, string, dtype, device, enum, function, class). An object ``fn`` makes on each call
   (a generator, a coroutine, a set, an object of the user's class) cannot be handed out once
   for every call: :attr:`Result.made` names it, and that signature runs eagerly (a generator
   function then returns a fresh generator, run per call, as in eager).

The rebuild itself is compiled once per signature (:func:`output_rebuilder`): for nests of
tuples and lists into one expression (``((produced[0], produced[1]), constants[0])``), since
``pytree.tree_unflatten`` walks the spec on every call (several microseconds for a pair of
pairs); other containers keep the general unflatten.

Example::

    >>> leaves, spec = pytree.tree_flatten(((1, 2), [3]))
    >>> output_rebuilder(spec, (True, True, True), ())(["a", "b", "c"])
    (('a', 'b'), ['c'])
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from fxviews.passes.compat.torch_internals import pytree
from fxviews.tracing.autograd import PLAIN_VALUES

__all__ = ["Result", "flatten_result", "output_rebuilder"]

Rebuilder = Callable[[Sequence[Any]], Any]

# What the traced graph itself returns: tensors, and the symbolic scalars that `.item()` and
# friends produce while tracing (they are computed again on every run).
GRAPH_OUTPUT_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)

#: Objects that are values (item 3 of the Note): one is as good as another of the same value,
#: or they are unique (functions, classes, modules): handed out again as eager may.
_VALUES = (
    *PLAIN_VALUES,
    range,
    type(NotImplemented),
    frozenset,
    enum.Enum,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
    functools.partial,
    torch.qscheme,
)


class Result(NamedTuple):
    """A result of ``fn`` as :func:`flatten_result` reads it (see the Note)."""

    leaves: list[Any]
    spec: pytree.TreeSpec
    #: The object ``fn`` made that a graph cannot hand out once for every call, in words.
    made: str | None


def flatten_result(out: Any, reached: Callable[[Any], bool]) -> Result:
    """``fn``'s result ``out`` as leaves and a spec to rebuild it (see the Note); ``reached``
    says whether ``fn`` reached an object before the call.

    Example::

        >>> result = flatten_result((torch.ones(2), x.shape), reached=lambda obj: False)
        >>> result.spec.children()[1].type, result.made
        (<class 'fxviews.calls.rebuilding._Size'>, None)
    """
    leaves, spec = pytree.tree_flatten(_marked(out, reached), is_leaf=reached)
    made = next(
        (
            _made(leaf)
            for leaf in leaves
            if not isinstance(leaf, GRAPH_OUTPUT_TYPES)
            and not issubclass(type(leaf), _VALUES)
            and not reached(leaf)
        ),
        None,
    )
    return Result(leaves, spec, made)


def _made(obj: Any) -> str:
    """``obj``, an object ``fn`` made, in words (a generator or coroutine closed: it never ran,
    and a coroutine left unawaited warns)."""
    if type(obj) in (types.GeneratorType, types.CoroutineType):
        obj.close()
    return f"a {type(obj).__qualname__}"


def _marked(value: Any, reached: Callable[[Any], bool]) -> Any:
    """``value`` with each ``torch.Size`` and plain dataclass in it (not reached ones) as the
    node that rebuilds it (item 1 of the Note)."""

    def mark(leaf: Any) -> Any:
        if reached(leaf):
            return leaf
        if type(leaf) is torch.Size:
            return _Size(leaf)
        names = _rebuildable_fields(leaf)
        if names is not None:
            return _Dataclass(
                type(leaf), names, [_marked(getattr(leaf, n), reached) for n in names]
            )
        return leaf

    return pytree.tree_map(
        mark,
        value,
        is_leaf=lambda v: reached(v) or type(v) is torch.Size or _rebuildable_fields(v) is not None,
    )


def _rebuildable_fields(obj: Any) -> tuple[str, ...] | None:
    """The fields of a dataclass instance pytree does not know that calling its class with them
    rebuilds (all init fields, no other attribute); None for anything else."""
    cls = type(obj)
    if not dataclasses.is_dataclass(cls) or cls in pytree.SUPPORTED_NODES:
        return None
    if hasattr(cls, "__post_init__"):  # it may change the fields it is given
        return None
    fields = dataclasses.fields(cls)
    try:
        held = object.__getattribute__(obj, "__dict__")
    except AttributeError:  # __slots__: its fields are all it holds
        held = None
    names = tuple(f.name for f in fields)
    if not all(f.init for f in fields) or (held is not None and set(held) != set(names)):
        return None
    return names


class _Size(tuple):  # type: ignore[type-arg]
    """A ``torch.Size`` in a result, rebuilt as one."""


class _Dataclass:
    """A dataclass instance in a result: its class, field names and values."""

    def __init__(self, cls: type, names: tuple[str, ...], values: list[Any]) -> None:
        self.cls, self.names, self.values = cls, names, values


pytree.register_pytree_node(
    _Size,
    lambda size: (list(size), None),
    lambda values, _: torch.Size(values),
    serialized_type_name="fxviews.calls.rebuilding._Size",
)
pytree.register_pytree_node(
    _Dataclass,
    lambda node: (node.values, (node.cls, node.names)),
    lambda values, context: context[0](**dict(zip(context[1], values, strict=True))),
    serialized_type_name="fxviews.calls.rebuilding._Dataclass",
)


def output_rebuilder(
    spec: pytree.TreeSpec, from_graph: Sequence[bool], constants: Sequence[Any]
) -> Rebuilder:
    """A function from the graph's outputs to ``fn``'s output tree.

    ``from_graph`` says, leaf by leaf in ``spec``'s order, whether the graph produces it (in
    order) or it is the next of ``constants`` (values fixed for the signature: None, numbers).
    """
    sources = iter(from_graph)
    produced, constant = itertools.count(), itertools.count()
    expression = _expression(spec, sources, produced, constant)
    if expression is None:
        return _general_rebuilder(spec, from_graph, tuple(constants))
    return _builder(expression)(tuple(constants))


@functools.lru_cache(maxsize=256)
def _builder(expression: str) -> Callable[[tuple[Any, ...]], Rebuilder]:
    """The function from a signature's constants to its rebuilder, compiled once per structure
    (most outputs are one of a few: ``produced[0]``, a pair, a list)."""
    # The source holds only brackets, commas and integer indices (no value of the caller's), so
    # compiling it runs nothing but the indexing it spells.
    code = compile(f"lambda constants: lambda produced: {expression}", "<fxviews output>", "eval")
    return eval(code, {})  # type: ignore[no-any-return]


def _expression(
    spec: pytree.TreeSpec, sources: Iterator[bool], produced: Iterator[int], constant: Iterator[int]
) -> str | None:
    """Python source building ``spec``'s tree, or None for a container other than tuple/list."""
    if spec.is_leaf():
        return f"produced[{next(produced)}]" if next(sources) else f"constants[{next(constant)}]"
    if spec.type is not tuple and spec.type is not list:
        return None
    parts = []
    for child in spec.children():
        part = _expression(child, sources, produced, constant)
        if part is None:
            return None
        parts.append(part)
    if spec.type is list:
        return "[" + ", ".join(parts) + "]"
    return "(" + "".join(f"{part}, " for part in parts) + ")"  # (x,) for one element


def _general_rebuilder(
    spec: pytree.TreeSpec, from_graph: Sequence[bool], constants: tuple[Any, ...]
) -> Rebuilder:
    """The general form: merge graph outputs and constants, then ``tree_unflatten``."""
    if all(from_graph):
        return lambda produced: pytree.tree_unflatten(list(produced), spec)

    def rebuild(produced: Sequence[Any]) -> Any:
        produced_iter, constants_iter = iter(produced), iter(constants)
        leaves = [next(produced_iter) if traced else next(constants_iter) for traced in from_graph]
        return pytree.tree_unflatten(leaves, spec)

    return rebuild
