"""Sizes/strides/offset algebra: addresses, containment (safety) and equivalence.

A *geometry* is what ``as_strided`` takes: ``sizes``, ``strides`` and a storage ``offset``, all
counted in elements. It touches the addresses ``offset + sum(k[i] * strides[i])`` for every index
``0 <= k[i] < sizes[i]``.

Note [Embedding a target geometry in an input geometry]
--------------------------------------------------------
An ``as_strided(input, S', T', O')`` is safe when every address of the target is an address of
the input. We prove it algebraically with an *embedding*: input "groups" g (runs of input dims
that can be flattened into one dim: ``stride[a] == size[b] * stride[b]``), a start coordinate
``c[g]`` and non-negative integer coefficients ``d[g][j]`` such that, for every target index m,

    address(m) = O + sum_g (c[g] + sum_j d[g][j] * m[j]) * stride[g]
    0 <= c[g] + sum_j d[g][j] * m[j] < size[g]                       (the box condition)

The box condition only needs checking at the far corner (``m[j] = S'[j] - 1``) because every
coefficient is non-negative. Such an embedding both proves containment and *is* the recipe for
the view chain (synthesis turns each ``d`` into slices, unfolds and diagonals), so "provably
safe" and "expressible with view ops" are decided together.

The coefficients come from a greedy mixed-radix decomposition over the groups in descending
stride order. For a non-overlapping input every digit of a view-generated target is below its
group's size, the representation is unique, and greedy finds it; when a target dim walks past the
end of a group (the carry of a flatten), the group is merged with its outer neighbour, if the two
are flattenable, and the decomposition is retried. Overlapping inputs go through the same steps;
whatever comes out is still checked exactly by the box condition and later on meta tensors.

Containment that has no embedding exists (the anti-diagonal ``{1, 4}`` of a 2x2 block of a
row-stride-3 tensor): such nodes are safe but have no view-op form, and are kept.
:func:`find_exposed_address` looks for a witness that a target reads memory the input does not
expose, so kept nodes get the right reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch


@dataclass(frozen=True)
class Geometry:
    """Sizes, strides and storage offset of a strided tensor, in elements.

    Example::

        >>> Geometry.of(torch.empty(2, 6)[0])
        Geometry(sizes=(6,), strides=(1,), offset=0)
    """

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    def __post_init__(self) -> None:
        # Accept lists (FX node arguments are lists) but store tuples, so keys compare equal.
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "strides", tuple(self.strides))
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"sizes {self.sizes} and strides {self.strides} differ in length")

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Geometry:
        """The geometry of ``tensor`` (a real, fake or meta tensor).

        A tensor with symbolic shapes gives SymInts, which callers that need ints reject.
        """
        return cls(tuple(tensor.shape), tuple(tensor.stride()), cast(int, tensor.storage_offset()))

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def __str__(self) -> str:
        return f"sizes={list(self.sizes)} strides={list(self.strides)} offset={self.offset}"

    def bounds(self) -> tuple[int, int]:
        """Lowest and highest address touched (strides are never negative in PyTorch)."""
        high = self.offset + sum((s - 1) * t for s, t in zip(self.sizes, self.strides, strict=True))
        return self.offset, high

    def storage_extent(self) -> int:
        """Elements a storage needs to hold this geometry."""
        return self.bounds()[1] + 1 if self.numel else self.offset

    def key(self) -> tuple:
        """A hashable form under which equivalent geometries are equal (see :func:`equivalent`)."""
        strides = tuple(t if s > 1 else 0 for s, t in zip(self.sizes, self.strides, strict=True))
        return (self.sizes, strides, self.offset if self.numel else 0)

    def meta_tensor(self) -> torch.Tensor:
        """A meta tensor with exactly this geometry, for verifying view chains."""
        storage = torch.empty(self.storage_extent(), device="meta")
        return storage.as_strided(self.sizes, self.strides, self.offset)

    def addresses(self) -> Iterator[int]:
        """Every address, in index order. Only for small geometries (tests, diagnostics)."""

        def walk(dim: int, base: int) -> Iterator[int]:
            if dim == self.ndim:
                yield base
                return
            for k in range(self.sizes[dim]):
                yield from walk(dim + 1, base + k * self.strides[dim])

        if self.numel:
            yield from walk(0, self.offset)


def is_one_to_one(geometry: Geometry) -> bool:
    """Whether distinct indices always touch distinct addresses (proven, never enumerated).

    Sufficient condition: in ascending stride order, each walking dim's stride exceeds the
    furthest address the smaller dims reach. It may say False for exotic interleavings that
    are one-to-one; it never says True for an overlapping geometry.

    Example::

        >>> is_one_to_one(Geometry((3, 2), (1, 3), 0)), is_one_to_one(Geometry((3, 2), (1, 0), 0))
        (True, False)
    """
    reach = 0
    walking = sorted((t, s) for s, t in zip(geometry.sizes, geometry.strides, strict=True) if s > 1)
    for stride, size in walking:
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def equivalent(a: Geometry, b: Geometry) -> bool:
    """Same sizes; same strides on dims of size > 1; same offset when there is an element."""
    return a.key() == b.key()


@dataclass(frozen=True)
class Group:
    """Input dims (in descending-stride order) that flatten into one dim of ``size``/``stride``."""

    dims: tuple[int, ...]
    size: int
    stride: int


@dataclass(frozen=True)
class Embedding:
    """A proof that a target sits inside an input (see the Note above), and the recipe for it.

    ``groups`` are the input groups in descending-stride order; ``start[g]`` is ``c[g]``;
    ``coeffs[g]`` maps target dim ``j`` to ``d[g][j] > 0``. Target dims of size 1 or stride 0
    (and all dims of an empty target) appear in no group: they are added back by
    unsqueeze/expand.
    """

    groups: tuple[Group, ...]
    start: tuple[int, ...]
    coeffs: tuple[dict[int, int], ...]
    dropped_input_dims: tuple[int, ...]


def active_target_dims(target: Geometry) -> list[int]:
    """Target dims that walk memory: size > 1 and stride > 0."""
    return [
        j
        for j, (s, t) in enumerate(zip(target.sizes, target.strides, strict=True))
        if s > 1 and t > 0
    ]


def _initial_groups(source: Geometry) -> tuple[list[Group], tuple[int, ...]]:
    active = [
        i
        for i, (s, t) in enumerate(zip(source.sizes, source.strides, strict=True))
        if s > 1 and t > 0
    ]
    active.sort(key=lambda i: (-source.strides[i], i))
    dropped = tuple(i for i in range(source.ndim) if i not in active)
    return [Group((i,), source.sizes[i], source.strides[i]) for i in active], dropped


def _digits(value: int, groups: Sequence[Group]) -> list[int] | None:
    """Greedy mixed-radix digits of ``value`` over ``groups``; None if it does not divide out."""
    digits = []
    for group in groups:
        digit, value = divmod(value, group.stride)
        digits.append(digit)
    return digits if value == 0 else None


def embed(source: Geometry, target: Geometry) -> Embedding | None:
    """Find an embedding of ``target`` in ``source``, or None when there is none we can prove.

    Both geometries must have at least one element. See the Note at the top of this module.

    Example::

        >>> e = embed(Geometry((2, 6), (6, 1), 0), Geometry((6,), (1,), 0))
        >>> e.start, e.coeffs
        ((0, 0), ({}, {0: 1}))
    """
    if source.numel == 0 or target.numel == 0:
        return None
    groups, dropped = _initial_groups(source)
    walking = active_target_dims(target)
    while True:
        start = _digits(target.offset - source.offset, groups)
        if target.offset < source.offset or start is None:
            return None
        coeffs: list[dict[int, int]] = [{} for _ in groups]
        for j in walking:
            digits = _digits(target.strides[j], groups)
            if digits is None:
                return None
            for g, digit in enumerate(digits):
                if digit:
                    coeffs[g][j] = digit
        overflow = next(
            (
                g
                for g, group in enumerate(groups)
                if start[g] + sum((target.sizes[j] - 1) * d for j, d in coeffs[g].items())
                >= group.size
            ),
            None,
        )
        if overflow is None:
            return Embedding(tuple(groups), tuple(start), tuple(coeffs), dropped)
        # The walk carries out of group `overflow`: merge it into its outer neighbour, which is
        # only a view if the two tile memory exactly (a flatten).
        if overflow == 0:
            return None
        outer, inner = groups[overflow - 1], groups[overflow]
        if outer.stride != inner.size * inner.stride:
            return None
        groups[overflow - 1 : overflow + 1] = [
            Group(outer.dims + inner.dims, outer.size * inner.size, inner.stride)
        ]


def contains_address(source: Geometry, address: int, budget: int = 10_000) -> bool | None:
    """Whether ``source`` touches ``address``, without enumerating ``source``.

    A search over dims in descending-stride order, pruned by the range the inner dims can still
    reach; for non-overlapping geometries at most one index per dim survives the pruning, so it
    is linear in the number of dims. Returns None when an overlapping geometry exhausts
    ``budget`` search steps before an answer.
    """
    if source.numel == 0:
        return False
    dims = sorted(
        (i for i in range(source.ndim) if source.sizes[i] > 1 and source.strides[i] > 0),
        key=lambda i: -source.strides[i],
    )
    reach = [0] * (len(dims) + 1)
    for pos in range(len(dims) - 1, -1, -1):
        i = dims[pos]
        reach[pos] = reach[pos + 1] + (source.sizes[i] - 1) * source.strides[i]
    steps = 0

    def search(pos: int, remaining: int) -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            raise _BudgetExhausted
        if remaining == 0:
            return True
        if pos == len(dims) or remaining < 0 or remaining > reach[pos]:
            return False
        stride = source.strides[dims[pos]]
        # Only indices that leave a remainder the inner dims can still reach are worth trying.
        low = max(0, -(-(remaining - reach[pos + 1]) // stride))
        high = min(source.sizes[dims[pos]] - 1, remaining // stride)
        return any(search(pos + 1, remaining - k * stride) for k in range(high, low - 1, -1))

    try:
        return search(0, address - source.offset)
    except _BudgetExhausted:
        return None


class _BudgetExhausted(Exception):
    pass


def find_exposed_address(source: Geometry, target: Geometry) -> int | None:
    """An address the target touches and the source does not, if a cheap probe finds one.

    Probes the corners of the target box and the first step along every dim. A returned
    address is a proof that the as_strided is unsafe; ``None`` proves nothing.
    """
    if target.numel == 0:
        return None
    walking = active_target_dims(target)
    probes = {target.offset}
    for j in walking:
        probes.add(target.offset + target.strides[j])
        probes.add(target.offset + (target.sizes[j] - 1) * target.strides[j])
    low, high = target.bounds()
    probes.update((low, high))
    for address in sorted(probes):
        if contains_address(source, address) is False:
            return address
    return None
