"""Overwritten clones: ``clone(a)`` then ``copy_(clone, b)`` becomes ``clone(b)`` only where proven.

Differential against eager PyTorch per sample (the harness of ``tests/differential.py``), with
each argument's batch dim physically at every position (0, 1, last, staggered):

- graphs the step rewrites: push_jvp, views taken before the overwrite and written after it,
  a merging view over a clone the pinning step made contiguous, symbolic sizes;
- ``grad`` and ``jvp`` around the transformed function (the overwritten input gets no
  gradient, the source all of it);
- graphs the step must keep, one per condition of Note [Overwritten clones]: the record says
  which condition failed, the ``copy_`` is still there, and the results still equal eager's;
- arguments that share memory (the same tensor twice, a view or slice of it, an argument
  viewing a tensor the function closes over and writes): a write to one is a write to the
  source of the ``copy_``, so the step keeps the copy, and the transformed function and the
  rewritten graph give eager's results and leave the caller's tensors as eager does. Where the
  source is the graph's own memory, which no argument can alias, the step still applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.func import grad
from torch.fx.experimental.proxy_tensor import make_fx

import fxviews
from fxviews.examples import push_jvp, seed_args
from fxviews.passes.compat.torch_internals import pytree
from tests.differential import (
    assert_every_layout_matches,
    nonlinear_loss,
    prepare,
    push_in_y,
    with_transform,
)
from tests.reference import InDims, assert_tree_close, make_samples, stable_seed

aten = torch.ops.aten
BATCH = 3


def _copies(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return list(gm.graph.find_nodes(op="call_function", target=aten.copy_.default))


def _overwrite(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """push_jvp's primal: a view of a copy taken before the copy is overwritten."""
    base = x.clone()
    view = base[0]
    base.copy_(y)
    return view, base


def assert_strides_match_eager(gm: torch.fx.GraphModule, fn: Callable[..., Any], args: Any) -> None:
    """On the traced inputs, every output has eager's strides, not only its values."""
    actual, expected = pytree.tree_leaves(gm(*args)), pytree.tree_leaves(fn(*args))
    assert [t.stride() for t in actual] == [t.stride() for t in expected]


# --------------------------------------------------------------------------------------------
# Rewritten: the copy_ goes, every layout still gives eager's numbers.
# --------------------------------------------------------------------------------------------


def test_push_jvp_clones_its_source_and_loses_the_copy():
    gm = fxviews.trace(push_jvp, *seed_args())
    res = fxviews.rewrite(gm)
    (record,) = res.clone_records
    assert (record.method, record.after) == ("reclone", "clone(y_1)"), record
    assert _copies(gm) and not _copies(res.graph_module)  # the caller's graph keeps its copy_
    clones = res.graph_module.graph.find_nodes(op="call_function", target=aten.clone.default)
    assert sorted(c.args[0].name for c in clones) == ["y_1", "yt_1"]
    assert "overwritten clone 1 rewritten (reclone 1), 0 kept" in str(res)


def _views_then_written(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    corner = base.t()[1:]  # a chain of views before the overwrite ...
    row = corner.unsqueeze(0)
    base.copy_(y)
    row.mul_(2)  # ... written through after it: the write reaches `base` and `corner`
    return corner, base, row


def _split_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    scaled = y * 3
    base = x.clone()
    first, second = base.split(3, dim=1)
    base.copy_(scaled)
    return first + 1, second, base


def _merging_view_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    flat = base.view(-1)  # layout-bound: the pinning step makes `base` contiguous_format
    base.copy_(y)
    base.mul_(y)
    return flat


REWRITTEN: dict[str, tuple[Callable[..., Any], int]] = {
    "push_jvp": (push_jvp, 3),
    "overwrite": (_overwrite, 2),
    "views_then_written": (_views_then_written, 2),
    "split_before": (_split_before, 2),
    "merging_view_before": (_merging_view_before, 2),
    "overwrite_under_jvp": with_transform(_overwrite, "jvp"),
    "overwrite_under_grad": with_transform(_overwrite, "grad"),
    "merging_view_under_grad": with_transform(_merging_view_before, "grad"),
}


@pytest.mark.parametrize("name", list(REWRITTEN))
def test_rewritten_graph_matches_eager_at_every_layout(name):
    fn, n_args = REWRITTEN[name]
    samples = make_samples([(2, 6)] * n_args, BATCH, seed=stable_seed(name))
    res = prepare(name, fn, samples).or_skip().result
    assert res is not None
    methods = [r.method for r in res.clone_records]
    assert methods and set(methods) == {"reclone"}, res.clone_records
    clones = {r.node for r in res.clone_records}
    assert not [c for c in _copies(res.graph_module) if c.args[0].name in clones]
    assert_every_layout_matches(res.graph_module, fn, samples, label=name)
    assert_strides_match_eager(res.graph_module, fn, samples[0])


def _both_gradients(f: Callable[..., Any]) -> Callable[..., Any]:
    """Gradients in ``x`` and ``y`` of a nonlinear loss of ``f(x, y)``."""

    def pull(x: torch.Tensor, y: torch.Tensor) -> Any:
        return grad(lambda x_, y_: nonlinear_loss(f(x_, y_)), argnums=(0, 1))(x, y)

    return pull


AROUND = {
    "jvp": (push_in_y, 3),
    "grad": (_both_gradients, 2),
}


@pytest.mark.parametrize("name", list(AROUND))
def test_transforms_around_the_transformed_function_match_eager(name):
    wrap, n_args = AROUND[name]
    samples = make_samples([(2, 6)] * n_args, BATCH, seed=stable_seed(name))
    explained = fxviews.explain(_overwrite, *samples[0][:2])
    assert [r.method for r in explained.clone_records] == ["reclone"]
    transformed = fxviews.transform(_overwrite)
    assert_every_layout_matches(wrap(transformed), wrap(_overwrite), samples, label=name)
    if name == "grad":  # the overwritten input gets no gradient, in both
        x_grad, _ = wrap(transformed)(*samples[0])
        assert torch.count_nonzero(x_grad) == 0


def test_symbolic_sizes_are_proven_equal_and_right_at_other_sizes():
    gm = make_fx(_overwrite, tracing_mode="symbolic")(torch.randn(4, 5), torch.randn(4, 5))
    res = fxviews.rewrite(gm)
    assert [r.method for r in res.clone_records] == ["reclone"], res.clone_records
    for shape in ((4, 5), (3, 7)):
        x, y = torch.randn(shape), torch.randn(shape)
        assert_tree_close(res.graph_module(x, y), _overwrite(x, y), msg=f"{shape}")


# --------------------------------------------------------------------------------------------
# Kept: one case per condition; the copy_ stays and the numbers are still eager's.
# --------------------------------------------------------------------------------------------


@dataclass
class Kept:
    fn: Callable[..., Any]
    why: str  # part of the kept record's reason
    shapes: Sequence[tuple[int, ...]] = ((2, 6), (2, 6))
    pin_layouts: bool = True
    #: None: the whole sweep; the graph must be right on every layout.
    layouts: Sequence[InDims] | None = None


def _sum_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    total = base.sum(0)  # reads `a`'s values
    base.copy_(y)
    return base, total


def _view_read_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    row = base[0]
    doubled = row * 2  # reads through a view
    base.copy_(y)
    return row, doubled, base


def _written_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    base[0].mul_(2)  # reads and writes `a`'s values through a view
    base.copy_(y)
    return base


def _broadcast(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    base.copy_(y)  # y is (6,): broadcast over base's rows
    return base


def _cast(x: torch.Tensor, y: torch.Tensor) -> Any:
    single = y.float()
    base = x.clone()
    base.copy_(single)  # float32 into float64: copy_ casts
    return base


def _as_strided_before(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    # Reads the whole buffer through its first row, behind a same-dtype view.dtype the engine
    # reads no base through: it keeps the node (through plain views it would read the clone
    # itself, tests/test_kept_nodes.py), and the pinning step has it read the pinned buffer.
    whole = base[0].view(base.dtype).as_strided((2, 6), (6, 1), 0)
    base.copy_(y)
    return whole, base


def _source_written(x: torch.Tensor, y: torch.Tensor) -> Any:
    source = y * 1
    base = x.clone()
    source[0].add_(1)  # clone(source) at base's place would miss this write
    base.copy_(source)
    return base


def _source_after(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    source = y.sin()
    base.copy_(source)
    return base


def _other_traced_layout(x: torch.Tensor, y: torch.Tensor) -> Any:
    source = y.t()  # (6, 2) transposed: same sizes as base, other strides
    base = x.clone()
    base.copy_(source)
    return base


def _layout_bound_after(x: torch.Tensor, y: torch.Tensor) -> Any:
    base = x.clone()
    base.copy_(y)
    flat = base.view(-1)  # merges dims, and stays a view: base is written afterwards
    base.mul_(2)
    return flat


BATCH_FIRST = [(0, 0)]

KEPT = {
    "sum_before": Kept(_sum_before, "sum(clone, [0]) uses clone before copy_"),
    "view_read_before": Kept(_view_read_before, "mul(select, 2) uses select before copy_"),
    "written_before": Kept(_written_before, "mul_(select, 2) uses select before copy_"),
    "broadcast": Kept(_broadcast, "copy_ broadcasts", shapes=((2, 6), (6,))),
    "cast": Kept(_cast, "copy_ casts"),
    "as_strided_before": Kept(
        _as_strided_before, "as_strided(clone_default, [2, 6], [6, 1], 0) uses"
    ),
    "source_written": Kept(_source_written, "add_(select, 1) writes mul between clone and copy_"),
    "source_after": Kept(_source_after, "sin is made after clone"),
    "other_traced_layout": Kept(
        _other_traced_layout, "has another layout than clone", shapes=((2, 6), (6, 2))
    ),
    # Without pins the merging view depends on the clone's layout at run time: kept. The
    # graph itself is then right only where every sample has its traced layout.
    "layout_bound_after": Kept(
        _layout_bound_after, "depends on its layout", pin_layouts=False, layouts=BATCH_FIRST
    ),
}


@pytest.mark.parametrize("name", list(KEPT))
def test_unproven_overwrite_is_kept_and_still_right(name):
    case = KEPT[name]
    samples = make_samples(case.shapes, BATCH, seed=stable_seed(name))
    gm = fxviews.trace(case.fn, *samples[0])
    res = fxviews.rewrite(gm, pin_layouts=case.pin_layouts)
    (record,) = res.clone_records
    assert record.method == "kept" and case.why in record.reason, record
    assert any(c.args[0].name == record.node for c in _copies(res.graph_module))
    assert_every_layout_matches(
        res.graph_module, case.fn, samples, layouts=case.layouts, label=name
    )
    assert_strides_match_eager(res.graph_module, case.fn, samples[0])


def test_pinned_clone_of_the_layout_bound_case_is_rewritten():
    # The counterpart of "layout_bound_after": with pins, the clone is contiguous_format, one
    # layout from any source, and the step applies on every layout.
    samples = make_samples([(2, 6), (2, 6)], BATCH, seed=5)
    res = fxviews.rewrite(fxviews.trace(_layout_bound_after, *samples[0]))
    (record,) = res.clone_records
    assert record.method == "reclone", record
    assert record.after == "clone(y_1, memory_format=torch.contiguous_format)"
    assert_every_layout_matches(res.graph_module, _layout_bound_after, samples, label="pinned")


def test_exported_program_holds_a_functional_copy_and_stays_right():
    # torch.export functionalizes: `copy(clone, y)` out of place, no `copy_` to drop. The
    # program is left as it is (no candidate) and still computes eager's values.
    class Overwrite(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            return _overwrite(x, y)

    x, y = make_samples([(2, 6), (2, 6)], 1, seed=3)[0]
    res = fxviews.rewrite(torch.export.export(Overwrite(), (x, y)))
    assert res.clone_records == [] and not _copies(res.graph_module)
    assert_tree_close(res.exported_program.module()(x, y), _overwrite(x, y), msg="export")


# --------------------------------------------------------------------------------------------
# Arguments sharing memory: traced as separate tensors, but one memory when the graph runs.
# --------------------------------------------------------------------------------------------


def _added_then_copied(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    base = a.clone()
    a.add_(1)  # `b` sees this write where it is `a`'s memory
    base.copy_(b)
    return base


def _set_then_copied(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    base = a.clone()
    a[0] = 100.0
    base[:] = b
    return base


def _out_then_copied(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    base = a.clone()
    torch.mul(a, 2, out=a)
    base.copy_(b)
    return base


def _writes_closed_over(buffer: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function writing ``buffer``, which it closes over, then copying its argument."""

    def copy_after_write(a: torch.Tensor) -> torch.Tensor:
        base = a.clone()
        buffer.add_(1)  # `a` sees this write where it views `buffer`
        base.copy_(a)
        return base

    return copy_after_write


#: Ways a caller passes one tensor's memory again, as a second argument.
SAME_MEMORY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "same_tensor": lambda t: t,
    "view": lambda t: t.view(6),
    "slice": lambda t: t[:],
}
WRITTEN_THEN_COPIED = {
    "add_": _added_then_copied,
    "setitem": _set_then_copied,
    "out": _out_then_copied,
}


def _graph_of(fn: Callable[..., Any], n_args: int) -> torch.fx.GraphModule:
    """The rewritten graph of ``fn``, traced on separate tensors, with the copy_ kept."""
    res = fxviews.rewrite(fxviews.trace(fn, *(torch.arange(6.0) for _ in range(n_args))))
    (record,) = res.clone_records
    assert record.method == "kept" and "between clone and" in record.reason, record
    return res.graph_module


def _assert_like_eager(runners: dict[str, Callable[..., Any]], call: Any, memory: Any) -> None:
    """Each runner, given fresh memory by ``memory()`` and called by ``call``, returns eager's
    result and leaves the caller's tensors as eager leaves them."""
    expected_memory = memory()
    expected = call(runners.pop("eager"), expected_memory)
    for name, runner in runners.items():
        actual_memory = memory()
        actual = call(runner, actual_memory)
        assert_tree_close((actual, actual_memory), (expected, expected_memory), msg=name)


@pytest.mark.parametrize("alias", list(SAME_MEMORY))
@pytest.mark.parametrize("write", list(WRITTEN_THEN_COPIED))
def test_arguments_sharing_memory_copy_the_written_values(write, alias):
    fn = WRITTEN_THEN_COPIED[write]
    runners = {"eager": fn, "transform": fxviews.transform(fn), "rewrite": _graph_of(fn, 2)}
    _assert_like_eager(runners, lambda f, t: f(t, SAME_MEMORY[alias](t)), lambda: torch.arange(6.0))


def test_argument_viewing_a_written_closed_over_tensor_copies_the_written_values():
    buffer = torch.zeros(6)
    fn = _writes_closed_over(buffer)
    runners = {"eager": fn, "transform": fxviews.transform(fn), "rewrite": _graph_of(fn, 1)}

    def fresh_buffer() -> torch.Tensor:
        return buffer.copy_(torch.arange(6.0))

    _assert_like_eager(runners, lambda f, t: f(t[:]), fresh_buffer)


def _input_written_owned_source(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    source = b * 2  # the graph's own memory: no argument can alias it
    base = a.clone()
    a.add_(1)
    base.copy_(source)
    return base


def test_source_the_graph_owns_is_recloned_over_a_write_to_an_argument():
    res = fxviews.rewrite(fxviews.trace(_input_written_owned_source, torch.ones(6), torch.ones(6)))
    assert [(r.method, r.after) for r in res.clone_records] == [("reclone", "clone(mul)")]
    fn = _input_written_owned_source
    runners = {"eager": fn, "transform": fxviews.transform(fn), "rewrite": res.graph_module}
    _assert_like_eager(runners, lambda f, t: f(t, t), lambda: torch.arange(6.0))
