"""ViewToReshape: views that break under vmap become reshape where no alias is observed.

Differential corpus: ``f(x, y)`` clones a base, mutates it in place with ``y`` (the operand
carrying a tangent or gradient), *then* takes a view, so the view's sharing with the base cannot
be observed afterwards::

    base = x.clone(); inplace_op(base, y); v = view_op(base); return finish(v), base

wrapped in jvp or grad, traced with :func:`fxviews.trace`, rewritten with
:func:`fxviews.rewrite`, then :class:`ViewToReshape` is applied. The graph is vmapped with the
batch dim physically at every position and compared with eager PyTorch per sample. A self-check
runs the graph without the pass and requires "view size is not compatible" (or "last dimension
with stride 1") for some placement: the corpus does exercise the failure.

Observed-alias cases (the view is written through after it is taken; the view is returned as an
alias of an input or of another output) must keep ``view`` with a reason, and stay right.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.func import vmap

import fxviews
from fxviews.passes import ViewToReshape
from tests.differential import assert_every_layout_matches, check_vmap, with_transform
from tests.reference import (
    assert_tree_close,
    in_dims_sweep,
    make_samples,
    stack_batched,
)

aten = torch.ops.aten
BATCH = 3
LAYOUT_ERRORS = ("view size is not compatible", "last dimension with stride 1")
REWRITTEN_OPS = (
    aten.view.default,
    aten._unsafe_view.default,
    aten._reshape_alias.default,
    aten.view_as_complex.default,
)


@dataclass(frozen=True)
class ViewCase:
    """A view op on the base and a function of the view giving a real tensor."""

    name: str
    shape: tuple[int, ...]
    view: Callable[[torch.Tensor], torch.Tensor]
    finish: Callable[[torch.Tensor], torch.Tensor] = torch.sin


VIEWS = [
    ViewCase("view", (3, 4), lambda b: b.view(-1)),
    ViewCase("flatten", (2, 3, 4), lambda b: b.flatten(1)),
    ViewCase("reshape", (3, 4), lambda b: b.reshape(4, 3)),
    ViewCase("ravel", (3, 4), torch.ravel),
    ViewCase("view_as", (3, 4), lambda b: b.view_as(torch.empty(12, dtype=b.dtype))),
    ViewCase("unflatten", (3, 4), lambda b: b.unflatten(1, (2, 2))),
    ViewCase(
        "view_as_complex",
        (3, 2),
        torch.view_as_complex,
        lambda c: torch.view_as_real(c * c),
    ),
]

INPLACE = {
    "mul_": lambda b, y: b.mul_(y),
    "add_": lambda b, y: b.add_(y, alpha=2.0),
    "copy_": lambda b, y: b.copy_(y),
}


def _function(case: ViewCase, inplace: str) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = x.clone()
        INPLACE[inplace](base, y)
        return case.finish(case.view(base)), base

    return f


@functools.cache
def _traced(case_name: str, inplace: str, transform: str) -> tuple[Any, ...]:
    """(eager fn, samples, as_strided-rewritten graph, same graph after ViewToReshape, records)."""
    case = next(c for c in VIEWS if c.name == case_name)
    fn, n_args = with_transform(_function(case, inplace), transform)
    samples = make_samples([case.shape] * n_args, BATCH, seed=len(case_name) + n_args)
    traced = fxviews.trace(fn, *samples[0])
    rewritten = fxviews.rewrite(traced, reshape_views=False, pin_layouts=False).graph_module
    passed = fxviews.rewrite(traced)  # the reshape step is on by default
    return fn, samples, rewritten, passed.graph_module, passed.view_records


CASES = [
    pytest.param(case.name, inplace, transform, id=f"{case.name}-{inplace}-{transform}")
    for case in VIEWS
    for inplace in INPLACE
    for transform in ("jvp", "grad")
]


def _placements(case_name: str, n_args: int) -> list[tuple[int, ...]]:
    ndim = len(next(c for c in VIEWS if c.name == case_name).shape)
    return in_dims_sweep([ndim] * n_args)


@pytest.mark.parametrize("case_name, inplace, transform", CASES)
def test_views_rewritten_and_right_at_every_batch_position(
    case_name: str, inplace: str, transform: str
) -> None:
    fn, samples, _, passed, records = _traced(case_name, inplace, transform)
    assert records, "the corpus case should trace to at least one view"
    # "runtime": the user's reshape, flatten or ravel, kept as called (Note [Layout decisions
    # at run time]); the views autograd made become reshape.
    assert {r.method for r in records} <= {"reshape", "runtime"}, records
    assert not [n for n in passed.graph.nodes if n.target in REWRITTEN_OPS[:3]]
    assert_every_layout_matches(passed, fn, samples, label=f"{case_name}-{inplace}-{transform}")


# Splitting one dim is viewable on every layout, and its backward merges exactly the dims it
# split, so unflatten never fails: it is in the corpus to show the pass does not break it.
NEVER_FAILS = {"unflatten"}


@pytest.mark.parametrize("case_name", [c.name for c in VIEWS if c.name not in NEVER_FAILS])
def test_without_the_pass_some_placement_raises(case_name: str) -> None:
    failures = []
    for inplace in INPLACE:
        for transform in ("jvp", "grad"):
            _, samples, rewritten, _, _ = _traced(case_name, inplace, transform)
            for in_dims in _placements(case_name, len(samples[0])):
                try:
                    vmap(rewritten, in_dims=in_dims)(*stack_batched(samples, in_dims))
                except RuntimeError as err:
                    assert any(m in str(err) for m in LAYOUT_ERRORS), err
                    failures.append((inplace, transform, in_dims))
    assert failures, f"{case_name}: the un-passed graphs never failed, so the test proves nothing"


# --------------------------------------------------------------------------------------------
# Observed aliasing: the view is kept, with the reason, and the results stay right.
# --------------------------------------------------------------------------------------------


def _run_pass(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, list[Any]]:
    gm = fxviews.rewrite(fxviews.trace(fn, *args)).graph_module
    return gm, ViewToReshape()(gm).records


def _kept_reasons(records: list[Any]) -> list[str]:
    return [r.reason for r in records if r.method == "kept"]


def _assert_matches_eager(fn: Callable[..., Any], gm: Any, n_args: int) -> None:
    """Every batch placement: a kept view's buffer is pinned to its traced layout."""
    assert_every_layout_matches(gm, fn, make_samples([(3, 4)] * n_args, BATCH, seed=7))


def _write_through_view(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    base = x.clone()
    flat = base.view(-1)
    flat.mul_(y.reshape(-1))  # the write through the view must reach the base
    return base.sin(), flat


@pytest.mark.parametrize("transform", ["plain", "jvp", "grad"])
def test_write_through_view_keeps_it(transform: str) -> None:
    fn = _write_through_view
    n_args = 2
    if transform != "plain":
        fn, n_args = with_transform(_write_through_view, transform)
    args = make_samples([(3, 4)] * n_args, 1, seed=3)[0]
    gm, records = _run_pass(fn, *args)
    assert any("written afterwards" in reason for reason in _kept_reasons(records)), records
    assert_tree_close(gm(*args), fn(*args))
    _assert_matches_eager(fn, gm, n_args)


def test_write_to_another_alias_of_the_base_keeps_the_view() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        base = x.clone()
        flat = base.view(-1)
        base[0].mul_(2.0)  # a sibling view of the base, written after `flat` is taken
        return flat.sin()

    x = torch.randn(3, 4, dtype=torch.float64)
    gm, records = _run_pass(f, x)
    assert [r.method for r in records] == ["kept"], records
    assert "written afterwards" in records[0].reason
    torch.testing.assert_close(gm(x), f(x))


def test_out_variant_counts_as_a_write() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        buffer = torch.zeros(12, dtype=x.dtype)
        grid = buffer.view(3, 4)
        torch.add(x.reshape(-1), 1.0, out=buffer)
        return grid.sin()

    x = torch.randn(3, 4, dtype=torch.float64)
    gm, records = _run_pass(f, x)
    by_name = {r.node: r for r in records}
    assert by_name["view"].method == "kept" and "'add'" in by_name["view"].reason, records
    torch.testing.assert_close(gm(x), f(x))


def test_view_returned_as_alias_of_an_input_is_kept() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    x = torch.randn(3, 4, dtype=torch.float64)
    gm, records = _run_pass(f, x)
    assert [r.method for r in records] == ["kept"]
    assert "aliases graph input 'x_1'" in records[0].reason
    out = gm(x)
    assert out.data_ptr() == x.data_ptr()  # the caller still gets an alias of its input


@pytest.mark.xfail(
    raises=RuntimeError,
    strict=True,
    reason="a view of a graph input cannot be pinned: with the batch dim between the merged "
    "dims it raises under vmap, as eager vmap does",
)
def test_view_returned_as_alias_of_an_input_under_vmap() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    gm = fxviews.rewrite(fxviews.trace(f, torch.randn(3, 4, dtype=torch.float64))).graph_module
    samples = make_samples([(3, 4)], BATCH, seed=7)
    for in_dims in in_dims_sweep([2]):  # check_vmap lets the RuntimeError through
        check_vmap(gm, f, samples, in_dims)


def test_view_returned_with_its_base_is_kept() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = x.clone()
        return base.view(-1), base

    x = torch.randn(3, 4, dtype=torch.float64)
    gm, records = _run_pass(f, x)
    assert [r.method for r in records] == ["kept"]
    assert "aliases output" in records[0].reason
    flat, base = gm(x)
    assert flat.data_ptr() == base.data_ptr()
    _assert_matches_eager(f, gm, 1)


def test_view_as_complex_kept_when_the_base_is_written_afterwards() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        base = x.clone()
        z = torch.view_as_complex(base)
        base.mul_(3.0)  # visible through z
        return torch.view_as_real(z * z)

    x = torch.randn(3, 2, dtype=torch.float64)
    gm, records = _run_pass(f, x)
    assert [r.method for r in records] == ["kept"], records
    torch.testing.assert_close(gm(x), f(x))


# --------------------------------------------------------------------------------------------
# The pass as a torch.fx pass.
# --------------------------------------------------------------------------------------------


def test_pass_result_and_records_for_a_fresh_view() -> None:
    gm = fxviews.trace(lambda x: x.clone().view(-1), torch.randn(2, 3))
    result = ViewToReshape()(gm)
    assert result.modified and result.graph_module is gm
    (record,) = result.records
    assert (record.before, record.after, record.method) == (
        "view(clone, [-1])",
        "reshape(clone, [-1])",
        "reshape",
    )
    x = torch.randn(4, 2, 3, dtype=torch.float64).permute(1, 0, 2)  # batch dim in the middle
    torch.testing.assert_close(vmap(gm, in_dims=1)(x), x.movedim(1, 0).reshape(4, -1))


def test_unsafe_view_and_reshape_alias_become_reshape() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = x.clone()
        return aten._unsafe_view(base.sin(), [12]), aten._reshape_alias(base, [12], [1])

    gm = fxviews.trace(f, torch.randn(3, 4))
    records = ViewToReshape()(gm).records
    ops = sorted(r.before.split("(")[0] for r in records)
    assert ops == ["_reshape_alias", "_unsafe_view"]
    assert {r.method for r in records} == {"reshape"}
    samples = make_samples([(3, 4)], BATCH, seed=5)
    assert_every_layout_matches(gm, lambda x: (x.sin().reshape(12), x.reshape(12)), samples)


def test_opaque_call_counts_as_alias_and_write() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    base = graph.call_function(aten.clone.default, (x,))
    flat = graph.call_function(aten.view.default, (base, [-1]))
    graph.call_function(torch.Tensor.mul_, (base, 2.0))  # a Python callable, not an aten op
    graph.output(graph.call_function(aten.sin.default, (flat,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    result = ViewToReshape()(gm)
    assert not result.modified  # works without meta['val'] too
    assert "written afterwards, at 'mul_'" in result.records[0].reason


def test_graph_without_views_is_untouched() -> None:
    gm = fxviews.trace(lambda x: x.sin(), torch.randn(2, 3))
    code = gm.code
    result = ViewToReshape()(gm)
    assert not result.modified
    assert result.records == [] and gm.code == code


def _mutate_after_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    flat = y.view(-1)  # merges both dims: a view only if they are adjacent in memory
    y.mul_(2)  # written after the view is taken: aliasing through `flat` is observable
    return flat * 3


def test_functionalize_makes_aliasing_unobservable_so_views_become_reshape() -> None:
    samples = [torch.randn(2, 3) for _ in range(3)]
    batched = torch.stack(samples, dim=1)  # the batch dim sits between the merged dims
    expected = torch.stack([_mutate_after_view(s) for s in samples])
    plain = fxviews.rewrite(fxviews.trace(_mutate_after_view, samples[0]), pin_layouts=False)
    assert "kept" in {r.method for r in plain.view_records}
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        torch.func.vmap(plain.graph_module, in_dims=1)(batched)
    functional = fxviews.rewrite(fxviews.trace(_mutate_after_view, samples[0], functionalize=True))
    assert {r.method for r in functional.view_records} == {"reshape"}
    vmapped = torch.func.vmap(functional.graph_module, in_dims=1)
    torch.testing.assert_close(vmapped(batched), expected)
    transformed = fxviews.transform(_mutate_after_view, functionalize=True)
    torch.testing.assert_close(torch.func.vmap(transformed, in_dims=1)(batched), expected)


def test_functionalize_still_mutates_inputs() -> None:
    def scale_in_place(x: torch.Tensor) -> torch.Tensor:
        x.view(-1).mul_(2)
        return x.sum()

    x = torch.randn(2, 3)
    expected_x, expected = x * 2, (x * 2).sum()
    out = fxviews.transform(scale_in_place, functionalize=True)(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected_x)
