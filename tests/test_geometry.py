"""Property tests for the geometry algebra and synthesis, against brute-force enumeration.

The reference for containment is the set of addresses enumerated element by element; the
reference for a rewrite is ``as_strided`` itself on a real tensor.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fxviews.passes.chains.chain import apply_chain, describe_chain
from fxviews.passes.chains.synthesis import synthesize
from fxviews.passes.geometry.concrete import (
    Geometry,
    contains_address,
    embed,
    equivalent,
    find_exposed_address,
    is_one_to_one,
)

# CI runs the same examples every time (a landing must not hinge on a lucky draw); local runs
# draw new ones. Either way a failure prints the example that reproduces it.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
SETTINGS = settings(
    # `make fuzz` sets FXVIEWS_EXAMPLES for a thorough run; 300 keeps the suite quick.
    max_examples=int(os.environ.get("FXVIEWS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def storage_for(geometry: Geometry, extra: int = 0) -> torch.Tensor:
    """A real tensor of ``geometry`` over distinct values ``1..n``."""
    storage = torch.arange(1.0, geometry.storage_extent() + extra + 1)
    return storage.as_strided(geometry.sizes, geometry.strides, geometry.offset)


def assert_same_view(view: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values and equal memory: same storage, and equivalent geometry."""
    assert view.untyped_storage().data_ptr() == expected.untyped_storage().data_ptr()
    assert equivalent(Geometry.of(view), Geometry.of(expected)), (view.stride(), expected.stride())
    assert torch.equal(view, expected)


@st.composite
def sources(draw: st.DrawFn) -> torch.Tensor:
    """A non-overlapping strided tensor: a contiguous block, permuted and step-sliced."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    x = torch.arange(1.0, 1 + torch.Size(sizes).numel()).reshape(sizes)
    order = draw(st.permutations(range(len(sizes))))
    x = x.permute(order)
    for dim in range(x.ndim):
        size = x.shape[dim]
        start = draw(st.integers(0, size - 1))
        step = draw(st.integers(1, 3))
        x = x.narrow(dim, start, size - start)[(slice(None),) * dim + (slice(None, None, step),)]
    return x


def random_view(draw: st.DrawFn, x: torch.Tensor, steps: int) -> torch.Tensor:
    """Apply ``steps`` random view ops (only ops that return views) to ``x``."""
    for _ in range(steps):
        kind = draw(
            st.sampled_from(
                [
                    "select",
                    "slice",
                    "diagonal",
                    "unfold",
                    "expand",
                    "unsqueeze",
                    "squeeze",
                    "permute",
                    "flatten",
                    "unflatten",
                    "split",
                    "movedim",
                ]
            )
        )
        if x.ndim == 0 and kind not in ("unsqueeze",):
            continue
        dim = draw(st.integers(0, max(x.ndim - 1, 0)))
        size = x.shape[dim] if x.ndim else 1
        if kind == "select" and size > 0:
            x = x.select(dim, draw(st.integers(0, size - 1)))
        elif kind == "slice" and size > 0:
            start = draw(st.integers(0, size - 1))
            stop = draw(st.integers(start + 1, size))
            x = x[(slice(None),) * dim + (slice(start, stop, draw(st.integers(1, 3))),)]
        elif kind == "diagonal" and x.ndim >= 2:
            other = draw(st.integers(0, x.ndim - 1).filter(lambda d, dim=dim: d != dim))
            offset = draw(st.integers(-2, 2))
            candidate = x.diagonal(offset, dim, other)
            if candidate.numel() > 0:
                x = candidate
        elif kind == "unfold" and size > 0:
            window = draw(st.integers(1, size))
            x = x.unfold(dim, window, draw(st.integers(1, 3)))
        elif kind == "expand":
            x = x.unsqueeze(dim).expand(*x.shape[:dim], draw(st.integers(1, 3)), *x.shape[dim:])
        elif kind == "unsqueeze":
            x = x.unsqueeze(draw(st.integers(0, x.ndim)))
        elif kind == "squeeze":
            x = x.squeeze(dim)
        elif kind == "permute":
            x = x.permute(draw(st.permutations(range(x.ndim))))
        elif kind == "flatten" and x.ndim >= 2 and dim < x.ndim - 1:
            try:
                x = x.view(*x.shape[:dim], -1, *x.shape[dim + 2 :])
            except RuntimeError:
                pass  # not expressible as a view: skip (reshape would copy)
        elif kind == "unflatten" and size >= 2:
            divisors = [d for d in range(1, size + 1) if size % d == 0]
            first = draw(st.sampled_from(divisors))
            x = x.unflatten(dim, (first, size // first))
        elif kind == "split" and size > 0:
            pieces = x.split(draw(st.integers(1, size)), dim)
            x = pieces[draw(st.integers(0, len(pieces) - 1))]
        elif kind == "movedim":
            x = x.movedim(dim, draw(st.integers(0, x.ndim - 1)))
    return x


@st.composite
def view_chain_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    source = draw(sources())
    target = random_view(draw, source, draw(st.integers(1, 4)))
    assume(target.numel() > 0)
    return source, target


@SETTINGS
@given(view_chain_cases())
def test_targets_made_by_view_chains_are_always_rewritten(case) -> None:
    source, target = case
    source_geometry, target_geometry = Geometry.of(source), Geometry.of(target)
    chain = synthesize(source_geometry, target_geometry)
    assert chain is not None, f"{source_geometry} -> {target_geometry}"
    rewritten = apply_chain(chain, source)
    expected = source.as_strided(target.shape, target.stride(), target.storage_offset())
    assert_same_view(rewritten, expected)
    assert_same_view(rewritten, target)


@st.composite
def random_target_cases(draw: st.DrawFn) -> tuple[torch.Tensor, Geometry]:
    source = draw(sources())
    if draw(st.booleans()):  # also overlapping or expanded inputs: views of a source
        source = random_view(draw, source, draw(st.integers(1, 3)))
        assume(source.numel() > 0)
    extent = source.untyped_storage().nbytes() // source.element_size()
    ndim = draw(st.integers(0, 3))
    sizes = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    strides = draw(st.lists(st.integers(0, 12), min_size=ndim, max_size=ndim))
    offset = draw(st.integers(0, extent - 1))
    target = Geometry(tuple(sizes), tuple(strides), offset)
    assume(target.numel == 0 or target.bounds()[1] < extent)
    return source, target


@SETTINGS
@given(random_target_cases())
def test_random_targets_are_rewritten_only_when_safe_and_then_exactly(case) -> None:
    source, target = case
    source_geometry = Geometry.of(source)
    exposed = set(source_geometry.addresses())
    touched = set(target.addresses())
    safe = touched <= exposed
    chain = synthesize(source_geometry, target)
    if chain is not None:
        assert safe, f"rewrote an unsafe target {target} of {source_geometry}"
        rewritten = apply_chain(chain, source)
        expected = source.as_strided(target.sizes, target.strides, target.offset)
        assert_same_view(rewritten, expected)
    witness = find_exposed_address(source_geometry, target)
    if witness is not None:
        assert witness in touched and witness not in exposed
    if not safe and target.numel:
        assert embed(source_geometry, target) is None


@SETTINGS
@given(sources(), st.integers(0, 200))
def test_contains_address_matches_enumeration(source: torch.Tensor, address: int) -> None:
    geometry = Geometry.of(source)
    assert contains_address(geometry, address) == (address in set(geometry.addresses()))


@SETTINGS
@given(st.data())
def test_contains_address_on_overlapping_geometries(data: st.DataObject) -> None:
    source = data.draw(sources())
    overlapping = random_view(data.draw, source, 3)
    geometry = Geometry.of(overlapping)
    address = data.draw(st.integers(0, 120))
    answer = contains_address(geometry, address)
    assert answer is None or answer == (address in set(geometry.addresses()))


def test_equivalence_ignores_strides_of_size_one_dims_and_offset_of_empty() -> None:
    assert equivalent(Geometry((1, 3), (99, 1), 2), Geometry((1, 3), (3, 1), 2))
    assert not equivalent(Geometry((2, 3), (99, 1), 2), Geometry((2, 3), (3, 1), 2))
    assert equivalent(Geometry((0, 3), (3, 1), 7), Geometry((0, 3), (3, 1), 0))
    assert not equivalent(Geometry((3,), (1,), 1), Geometry((3,), (1,), 0))


def test_synthesis_uses_the_view_ops_a_person_would_write() -> None:
    cases = {
        ((2, 6), (6, 1), 0, (6,), (1,), 0): "select(x, 0, 0)",
        ((3, 3), (3, 1), 0, (3,), (4,), 0): "diagonal(x, 0, 0, 1)",
        ((12,), (1,), 0, (2, 6), (6, 1), 0): "view(x, [2, 6])",
        ((3, 4), (4, 1), 0, (4, 3), (1, 4), 0): "permute(x, [1, 0])",
        ((8,), (1,), 0, (3, 4), (2, 1), 0): "unfold(x, 0, 4, 2)",
        ((2, 3), (3, 1), 0, (2, 4, 3), (3, 0, 1), 0): "expand(unsqueeze(x, 1), [2, 4, 3])",
        # A flatten followed by an unflatten is one view.
        ((60,), (1,), 0, (3, 4, 3, 3), (20, 5, 1, 1), 0): "unfold(view(x, [3, 4, 5]), 2, 3, 1)",
    }
    for (s, t, o, s2, t2, o2), expected in cases.items():
        chain = synthesize(Geometry(s, t, o), Geometry(s2, t2, o2))
        assert chain is not None and describe_chain(chain, "x") == expected


def test_no_flatten_or_permute_beyond_what_the_target_needs() -> None:
    # A column of a transposed tensor: a select, no permute, no view.
    source = Geometry((4, 3), (1, 4), 0)
    chain = synthesize(source, Geometry((4,), (1,), 8))
    assert chain is not None and [step.name() for step in chain] == ["select"]
    # Flattening one pair of dims of a 3-d tensor leaves the third alone.
    source = Geometry((2, 3, 4), (12, 4, 1), 0)
    chain = synthesize(source, Geometry((6,), (4,), 1))
    assert chain is not None and [step.name() for step in chain] == ["view", "select"]


@SETTINGS
@given(st.data())
def test_one_to_one_is_never_claimed_for_overlapping_geometries(data: st.DataObject) -> None:
    source = data.draw(sources())
    if data.draw(st.booleans()):  # views of a source overlap too: unfold, expand
        source = random_view(data.draw, source, 3)
    geometry = Geometry.of(source)
    addresses = list(geometry.addresses())
    if is_one_to_one(geometry):
        assert len(set(addresses)) == len(addresses), geometry
    if source.is_contiguous():  # the sufficient condition holds for every dense layout
        assert is_one_to_one(geometry), geometry
