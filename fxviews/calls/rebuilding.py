"""Rebuild a function's output pytree from its traced graph's flat outputs, cheaply per call.

A transformed function's graph returns a flat list; the caller gets ``fn``'s own structure
back. ``pytree.tree_unflatten`` walks the spec on every call, several microseconds for a pair
of pairs. The structure is fixed per cached signature, so for nests of tuples and lists it is
compiled once into one expression (``((produced[0], produced[1]), constants[0])``); other
containers (dicts, namedtuples, registered classes) keep the general unflatten.

Example::

    >>> leaves, spec = pytree.tree_flatten(((1, 2), [3]))
    >>> output_rebuilder(spec, (True, True, True), ())(["a", "b", "c"])
    (('a', 'b'), ['c'])
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fxviews.passes.compat.torch_internals import pytree

__all__ = ["output_rebuilder"]

Rebuilder = Callable[[Sequence[Any]], Any]


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
