"""Synthesis (the second of three ideas): derive a chain of view ops from two geometries.

Note [From an embedding to view ops]
------------------------------------
Given an :class:`~.geometry.Embedding` of the target in the source, the chain is built in the
order that keeps every intermediate a plain view and touches no dim the target does not need:

1. drop source dims that walk no memory (size 1: squeeze; stride 0: select 0);
2. flatten each multi-dim group (permute its dims together first only if they are not already
   adjacent) - the only step that needs a ``view`` to merge dims;
3. per group: ``select`` it away if no target dim uses it; otherwise ``slice`` to the used
   window [start, start + span) with the one coefficient as step, or, when several target dims
   share the group, cut it into one virtual dim per target dim with ``unfold`` (or ``view`` when
   the windows tile exactly) and step-``slice`` the innermost;
4. ``diagonal`` together the virtual dims that belong to one target dim (it walks two source
   dims at once);
5. ``permute`` into target order, then ``unsqueeze`` size-1 dims and ``expand`` stride-0 dims.

Every chain is verified on meta tensors before it is used (see ``chain_verification.verify_chain``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..geometry.concrete import Embedding, Geometry, active_target_dims, embed, equivalent
from .chain import ViewChain, ViewStep
from .verification import verify_chain

aten = torch.ops.aten

#: A dim's label while a chain is built: its kind (``in``, ``group``, ``virtual``, ``rest``,
#: ``target``) and the dims it stands for.
Label = tuple[Any, ...]


class _ChainBuilder:
    """Records view steps while tracking the result's shape on a meta tensor and dim labels."""

    def __init__(self, source: Geometry, labels: list[Label]) -> None:
        self.value = source.meta_tensor()
        self.before_last = self.value
        self.labels = labels
        self.steps: list[ViewStep] = []

    @property
    def sizes(self) -> list[int]:
        return list(self.value.shape)

    def do(self, op: Any, *args: Any) -> None:
        if op is aten.view.default and self.steps and self.steps[-1].op is op:
            # view(view(x, a), b) is view(x, b): one view op, not two.
            self.steps.pop()
            self.value = self.before_last
        self.before_last = self.value
        self.value = op(self.value, *args)
        self.steps.append(ViewStep(op, tuple(args)))


def synthesize(
    source: Geometry, target: Geometry, counted: frozenset[int] = frozenset()
) -> ViewChain | None:
    """A verified chain of view ops taking ``source`` to ``target``, or None.

    Where target dims overlap on one input dim (windows), the one with the largest stride
    counts the windows and the others lie within each; ``counted`` names target dims to count
    windows by first whatever their strides (symbolic synthesis: a dim whose size follows the
    sizes must count them, or the window would follow the sizes too).

    Example::

        >>> chain = synthesize(Geometry((3, 3), (3, 1), 0), Geometry((3,), (4,), 0))
        >>> [step.name() for step in chain]
        ['diagonal']
    """
    return _synthesize(source, target, False, True, counted)


def synthesize_uniform(
    source: Geometry, target: Geometry, counted: frozenset[int] = frozenset()
) -> ViewChain | None:
    """:func:`synthesize` with the same steps whatever the sizes: windows that tile a dim are
    taken by ``unfold`` rather than ``view``, and every used dim is sliced, even whole.

    ``unfold(x, 0, 2, 2)`` counts its windows by a floor division of the dim's size where
    ``view(x, [-1, 2])`` needs the size to be a multiple of 2; and a slice that takes a whole
    dim at one size takes part of it at another. Symbolic synthesis, which compares the chains
    of two sizes step by step, tries this form second.

    Example::

        >>> synthesize_uniform(Geometry((6,), (1,), 0), Geometry((3, 2), (2, 1), 0))
        (ViewStep(op=aten.slice.Tensor, args=(0, 0, 6, 1)),
         ViewStep(op=aten.unfold.default, args=(0, 2, 2)))
    """
    return _synthesize(source, target, True, False, counted)


def synthesize_sliced(
    source: Geometry, target: Geometry, counted: frozenset[int] = frozenset()
) -> ViewChain | None:
    """:func:`synthesize` with every used dim sliced, even whole: the steps of a chain whose
    slice takes a whole dim at one size and part of it at another (windows of a matrix's rows
    tile them at even widths only) are the same at every size.

    Example::

        >>> synthesize_sliced(Geometry((2, 4), (4, 1), 0), Geometry((2, 2, 2), (4, 2, 1), 0))
        (ViewStep(op=aten.slice.Tensor, args=(0, 0, 2, 1)),
         ViewStep(op=aten.slice.Tensor, args=(1, 0, 4, 1)),
         ViewStep(op=aten.view.default, args=([2, 2, 2],)))
    """
    return _synthesize(source, target, True, True, counted)


def _synthesize(
    source: Geometry,
    target: Geometry,
    slice_whole: bool,
    split_with_view: bool,
    counted: frozenset[int],
) -> ViewChain | None:
    if target.numel == 0:
        chain = _synthesize_empty(source, target)
    else:
        embedding = embed(source, target)
        chain = (
            None
            if embedding is None
            else _chain_from_embedding(
                source, target, embedding, slice_whole, split_with_view, counted
            )
        )
    if chain is not None and verify_chain(chain, source, target):
        return chain
    return None


def _synthesize_empty(source: Geometry, target: Geometry) -> ViewChain | None:
    """An empty target: build it with its empty dims at size 1, then slice those to 0."""
    if source.numel == 0:
        return () if equivalent(source, target) else None
    inflated_sizes = tuple(max(s, 1) for s in target.sizes)
    for offset in (target.offset, source.offset):
        inflated = Geometry(inflated_sizes, target.strides, offset)
        embedding = embed(source, inflated)
        if embedding is None:
            continue
        chain = _chain_from_embedding(source, inflated, embedding)
        empty_dims = [j for j, s in enumerate(target.sizes) if s == 0]
        return chain + tuple(ViewStep(aten.slice.Tensor, (j, 0, 0)) for j in empty_dims)
    return None


def _chain_from_embedding(
    source: Geometry,
    target: Geometry,
    emb: Embedding,
    slice_whole: bool = False,
    split_with_view: bool = True,
    counted: frozenset[int] = frozenset(),
) -> ViewChain:
    b = _ChainBuilder(source, [("in", i) for i in range(source.ndim)])
    _drop_idle_dims(b, source, emb)
    _flatten_groups(b, emb)
    for g in range(len(emb.groups)):
        _cut_group(b, target, emb, g, slice_whole, split_with_view, counted)
    walking = active_target_dims(target)
    _diagonalize(b, walking)
    _to_target_order(b, target, walking)
    return tuple(b.steps)


def _drop_idle_dims(b: _ChainBuilder, source: Geometry, emb: Embedding) -> None:
    dropped = emb.dropped_input_dims
    if not dropped:
        return
    if all(source.sizes[i] == 1 for i in dropped):
        b.do(aten.squeeze.dims, list(dropped))
    else:
        for i in sorted(dropped, reverse=True):
            b.do(aten.select.int, i, 0)
    b.labels = [label for label in b.labels if label[1] not in dropped]


def _flatten_groups(b: _ChainBuilder, emb: Embedding) -> None:
    group_of = {dim: g for g, group in enumerate(emb.groups) for dim in group.dims}
    position = {label[1]: p for p, label in enumerate(b.labels)}
    order: list[int] = []
    seen: set[int] = set()
    for label in b.labels:
        g = group_of[label[1]]
        if g not in seen:
            seen.add(g)
            order.extend(position[dim] for dim in emb.groups[g].dims)
    if order != list(range(len(order))):
        b.do(aten.permute.default, order)
        b.labels = [b.labels[p] for p in order]
    merged = [("group", group_of[label[1]]) for label in b.labels]
    new_labels = [label for p, label in enumerate(merged) if p == 0 or merged[p - 1] != label]
    if len(new_labels) != len(b.labels):
        b.do(aten.view.default, [emb.groups[label[1]].size for label in new_labels])
    b.labels = new_labels


def _cut_group(
    b: _ChainBuilder,
    target: Geometry,
    emb: Embedding,
    g: int,
    slice_whole: bool,
    split_with_view: bool,
    counted: frozenset[int],
) -> None:
    dim = b.labels.index(("group", g))
    start = emb.start[g]
    uses = sorted(emb.coeffs[g].items(), key=lambda item: (item[0] not in counted, -item[1]))
    if not uses:
        b.do(aten.select.int, dim, start)
        del b.labels[dim]
        return
    spans = [(target.sizes[j] - 1) * d for j, d in uses]
    length = 1 + sum(spans)
    last_step = uses[-1][1] if len(uses) == 1 else 1
    if slice_whole or (start, length, last_step) != (0, b.sizes[dim], 1):
        b.do(aten.slice.Tensor, dim, start, start + length, last_step)
    for n, (j, d) in enumerate(uses[:-1]):
        rest = 1 + sum(spans[n + 1 :])
        b.labels[dim] = ("virtual", j, g)
        if rest == d and split_with_view:  # the windows tile the dim exactly: an unflatten
            sizes = b.sizes
            b.do(aten.view.default, sizes[:dim] + [target.sizes[j], d] + sizes[dim + 1 :])
            dim += 1
            b.labels.insert(dim, ("rest", g))
        else:
            b.do(aten.unfold.default, dim, rest, d)
            dim = len(b.labels)
            b.labels.append(("rest", g))
    j, d = uses[-1]
    if len(uses) > 1 and d != 1:
        b.do(aten.slice.Tensor, dim, 0, b.sizes[dim], d)
    b.labels[dim] = ("virtual", j, g)


def _diagonalize(b: _ChainBuilder, walking: list[int]) -> None:
    for j in walking:
        while True:
            where = [p for p, label in enumerate(b.labels) if label[1] == j]
            if len(where) < 2:
                break
            b.do(aten.diagonal.default, 0, where[0], where[1])
            b.labels = [label for p, label in enumerate(b.labels) if p not in where[:2]]
            b.labels.append(("target", j))


def _to_target_order(b: _ChainBuilder, target: Geometry, walking: list[int]) -> None:
    position = {label[1]: p for p, label in enumerate(b.labels)}
    order = [position[j] for j in walking]
    if order != list(range(len(order))):
        b.do(aten.permute.default, order)
    for j in range(target.ndim):
        if j not in walking:
            b.do(aten.unsqueeze.default, j)
    if any(s > 1 and t == 0 for s, t in zip(target.sizes, target.strides, strict=True)):
        b.do(aten.expand.default, list(target.sizes))
