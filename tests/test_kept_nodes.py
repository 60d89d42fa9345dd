"""Kept as_strided nodes and vmap: rewritten relative to a base, or guarded; named by source line.

Every value is checked against eager PyTorch one sample at a time, each sample a fresh tensor
(the layout ``transform`` traces on), with the batch dim physically where ``in_dims`` says, on
:data:`tests.reference.TEST_DEVICE` (``FXVIEWS_TEST_DEVICE``, CPU by default). See
docs/kept-nodes.md.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.func import grad, vmap

import fxviews
from fxviews.passes.rewrites.vmap_guards import per_sample_geometry
from fxviews.rewriting.steps import rewrite_in_place
from fxviews.tracing.capture import capture
from tests.reference import (
    as_strided_nodes,
    make_samples,
    per_sample_reference,
    randn,
    stack_batched,
)


def _past_the_slice(x):
    # x[:2] holds two elements; the as_strided reads four: x[0:4].
    return x[:2].as_strided((4,), (1,)) * 1


def _past_the_columns(x):
    # x[:, :2] of a (3, 4) sample; the as_strided reads x[:, :3].
    return x[:, :2].as_strided((3, 3), (4, 1)) * 2


def _after_a_write(x):
    y = x.clone()
    window = y[:2]
    y.mul_(3)  # written after the view, before the as_strided: eager reads the new values
    window.add_(1)  # and through the view itself
    return window.as_strided((4,), (1,)) + 0


def _restrided_input(x):
    window = x[:2]
    x.unsqueeze_(0)  # the input's layout changes in place: no base can be trusted
    return window.as_strided((4,), (1,)) * 1  # LINE: restrided


def _line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if f"LINE: {marker}" in text)


def _check_vmap(fn, shapes, bd):
    samples = make_samples(shapes, batch=3, seed=bd + 7)
    expected = per_sample_reference(fn, [tuple(t.clone() for t in s) for s in samples], (bd,))
    actual = vmap(fxviews.transform(fn), in_dims=bd)(*stack_batched(samples, (bd,)))
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("bd", [0, 1])
def test_a_read_past_its_input_view_is_rebased_on_the_graph_input(bd):
    _check_vmap(_past_the_slice, [(6,)], bd)
    [record] = fxviews.explain(_past_the_slice, randn(6)).records
    assert record.method == "rebased"
    assert record.after == "slice(x_1, 0, 0, 4, 1)"
    assert "'x_1'" in record.reason and "'slice_1'" in record.reason


@pytest.mark.parametrize("bd", [0, 1, 2])
def test_rebased_at_every_batch_position_of_a_2d_input(bd):
    _check_vmap(_past_the_columns, [(3, 4)], bd)


def test_rebased_reads_have_the_derivative_of_what_they_read():
    x = randn(3, 4, dtype=torch.float64).requires_grad_()
    transformed = fxviews.transform(_past_the_columns)
    # The numerical Jacobian is the reference, in both modes: column 2 is read, so it has a
    # derivative. Eager's reverse mode drops it (as_strided's backward only reaches the
    # elements of its input, x[:, :2]); its forward mode keeps it.
    assert torch.autograd.gradcheck(transformed, (x,))
    assert torch.autograd.gradcheck(
        transformed, (x,), check_forward_ad=True, check_backward_ad=False, check_batched_grad=False
    )
    eager_grad = grad(lambda x: _past_the_columns(x).sum())(x.detach())
    assert not eager_grad[:, 2].any()
    # A non-contiguous argument called directly: its layout is a fact of the call, and the
    # graph traced on it reads the memory eager's as_strided reads (Note [The layout of a
    # call]), which is not x[:, :3] there.
    xt = x.detach().t().contiguous().t()
    torch.testing.assert_close(transformed(xt), _past_the_columns(xt))
    assert not torch.equal(_past_the_columns(xt), _past_the_columns(x.detach()))


@pytest.mark.parametrize("bd", [0, 1])
def test_a_rebased_read_sees_writes_made_before_it_through_any_alias(bd):
    _check_vmap(_after_a_write, [(6,)], bd)
    gm = fxviews.explain(_after_a_write, randn(6)).graph_module
    assert not as_strided_nodes(gm)


def test_a_rebased_read_stops_at_detach():
    def f(x):
        # Only x, past the detach, exposes the four elements read.
        return (x[:3].detach()[:2].as_strided((4,), (1,)) * x[:4]).sum()

    x = randn(6)
    # The detached factor must stay a constant: only x[:4] carries a gradient.
    torch.testing.assert_close(grad(fxviews.transform(f))(x), grad(f)(x.clone()))
    [record] = fxviews.explain(f, x).records
    assert record.method == "kept"


def test_a_node_that_must_stay_kept_raises_under_vmap_naming_its_source_line():
    samples = make_samples([(6,)], batch=3, seed=1)
    transformed = fxviews.transform(_restrided_input)
    where = f"test_kept_nodes.py:{_line_of(_restrided_input, 'restrided')}"
    for bd in (0, 1):
        batched = stack_batched(samples, (bd,))
        with pytest.raises(fxviews.FxViewsError, match="under vmap") as caught:
            vmap(transformed, in_dims=bd)(*batched)
        assert where in str(caught.value) and "as_strided" in str(caught.value)
    # Outside vmap the kept node computes what eager computes.
    x = randn(6)
    torch.testing.assert_close(transformed(x.clone()), _restrided_input(x.clone()))


def test_kept_records_and_their_printout_name_the_source_line():
    where = f"test_kept_nodes.py:{_line_of(_restrided_input, 'restrided')}"
    gm = capture(_restrided_input, [randn(6)], fresh=True, caller="test", name="f")
    result = fxviews.rewrite(gm)  # a recorded trace, as transform makes it
    [record] = result.records
    assert record.method == "kept" and record.source is not None and where in record.source
    assert where in str(result)


def test_strict_names_the_source_line():
    where = f"test_kept_nodes.py:{_line_of(_restrided_input, 'restrided')}"
    with pytest.raises(fxviews.UnsafeAsStridedError) as caught:
        fxviews.transform(_restrided_input, strict=True)(randn(6))
    assert where in str(caught.value)
    assert caught.value.source is not None and where in caught.value.source


def _no_view_form(x):
    return torch.as_strided(x, (2,), (3,), 1) * 1  # the anti-diagonal of a 2x2 window


def test_a_guarded_node_runs_where_each_sample_is_laid_out_as_traced():
    # Traced on a 2x2 window of a 4x4 buffer, the node reads addresses 1 and 4 of it: no view
    # form from the window, and the window is a graph input (its buffer is the caller's).
    windows = [randn(4, 4)[:2, :2] for _ in range(3)]
    gm = fxviews.trace(_no_view_form, windows[0])
    result = rewrite_in_place(gm)
    [pin] = result.pin_records
    assert pin.method == "kept" and "under vmap it runs where" in pin.reason
    expected = torch.stack([_no_view_form(w) for w in windows])
    # Each sample laid out as traced: a 2x2 window at offset 0 of its own 4x4 block.
    blocks = torch.stack([w.as_strided((4, 4), (4, 1), 0) for w in windows])
    torch.testing.assert_close(vmap(gm)(blocks[:, :2, :2]), expected)
    # The batch dim inside each sample's block: each sample is laid out otherwise.
    interleaved = torch.stack([w.as_strided((4, 4), (4, 1), 0) for w in windows], dim=2)
    with pytest.raises(fxviews.FxViewsError, match="each sample of 'x_1' is laid out as"):
        vmap(gm, in_dims=2)(interleaved[:2, :2])
    torch.testing.assert_close(gm(windows[1]), _no_view_form(windows[1]))


@pytest.mark.parametrize(("outer", "inner"), [(0, 0), (2, 1), (3, 0), (1, 2)])
def test_the_guard_reads_each_samples_layout_through_nested_vmaps(outer, inner):
    t = torch.zeros(3, 4, 5, 6)
    seen = []

    def probe(x):
        seen.append(per_sample_geometry(x))
        return x.sum()

    vmap(vmap(probe, in_dims=inner), in_dims=outer)(t)
    dims = [d for d in range(4) if d != outer]
    dims.pop(inner)
    assert len(seen) == 1
    assert seen[0].sizes == tuple(t.shape[d] for d in dims)
    assert seen[0].strides == tuple(t.stride(d) for d in dims)
    assert per_sample_geometry(t) is None


def _reads_past_a_detached_view(x):
    return x[:2].detach().as_strided((5,), (1,)) * 1  # LINE: past


def test_fake_mode_traces_name_the_source_line_too():
    """trace/explain (make_fx in fake mode) record the user's line on as_strided nodes: the
    kept record and strict mode's error name it."""
    where = f"test_kept_nodes.py:{_line_of(_reads_past_a_detached_view, 'past')}"
    [record] = fxviews.explain(_reads_past_a_detached_view, randn(6)).records
    assert record.method == "kept" and where in record.source
    with pytest.raises(fxviews.UnsafeAsStridedError, match=where):
        fxviews.explain(_reads_past_a_detached_view, randn(6), strict=True)
