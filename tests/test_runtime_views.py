"""fxviews.as_strided on plain tensors and a tensor subclass, against eager PyTorch.

References: ``torch.as_strided`` where it is right (a tensor that is what it reports, outside any
transform), the per-sample loop under vmap, autograd of ``torch.as_strided`` on a contiguous
input for grad, and the request applied to the tangent for jvp (as_strided is linear).
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, jvp, vmap
from torch.testing._internal.two_tensor import TwoTensor

import fxviews
from fxviews.passes.runtime.runtime_views import _cached_chain


@pytest.fixture(autouse=True)
def uncached_chains():
    """Each test finds its chains first under its own transforms (grad, jvp, vmap): one an
    earlier test left in the process-wide cache would hide how they are found there."""
    _cached_chain.__wrapped__.cache_clear()  # under torch.compiler.disable


def row_windows(t: torch.Tensor) -> torch.Tensor:
    """Windows of 3 consecutive elements along the first dim, written from t's own strides."""
    n = t.shape[0]
    return fxviews.as_strided(t, (n - 2, 3, *t.shape[1:]), (t.stride(0), *t.stride()))


def column_windows(t: torch.Tensor) -> torch.Tensor:
    rows, cols = t.shape
    return fxviews.as_strided(t, (rows, cols - 1, 2), (t.stride(0), t.stride(1), t.stride(1)))


def diagonal(t: torch.Tensor) -> torch.Tensor:
    return fxviews.as_strided(t, (min(t.shape),), (t.stride(0) + t.stride(1),))


def last_rows(t: torch.Tensor) -> torch.Tensor:
    """t[1:] through the offset argument."""
    return fxviews.as_strided(
        t, (t.shape[0] - 1, *t.shape[1:]), t.stride(), t.storage_offset() + t.stride(0)
    )


def broadcast_rows(t: torch.Tensor) -> torch.Tensor:
    """Row 0 repeated 4 times: a stride-0 dim."""
    return fxviews.as_strided(t, (4, t.shape[1]), (0, t.stride(1)))


FUNCTIONS = [row_windows, column_windows, diagonal, last_rows, broadcast_rows]


def _inputs() -> dict[str, torch.Tensor]:
    base = torch.randn(7, 12)
    return {
        "contiguous": base[:, :5].contiguous(),
        "transposed": base[:5, :7].t(),
        "stepped": base[:, ::2][:, 1:],  # strides (12, 2), offset 2
        "offset": base[2:, 3:8],
    }


INPUTS = _inputs()


@pytest.mark.parametrize("layout", INPUTS)
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_equals_torch_as_strided_on_plain_tensors(fn, layout, monkeypatch):
    x = INPUTS[layout]
    out = fn(x)
    monkeypatch.setattr(fxviews, "as_strided", _eager_as_strided)
    expected = fn(x)
    assert out.shape == expected.shape
    assert out.stride() == expected.stride()
    assert out.storage_offset() == expected.storage_offset()
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def _eager_as_strided(t, size, stride, storage_offset=None):
    return torch.as_strided(t, size, stride, storage_offset)


@pytest.mark.parametrize("bd", [0, 1, -1])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_vmap_equals_the_per_sample_loop(fn, bd):
    samples = [torch.randn(5, 6) for _ in range(3)]
    batched = torch.stack(samples, dim=bd)  # the batch dim is physically at bd
    out = vmap(fn, in_dims=bd)(batched)
    expected = torch.stack([fn(s) for s in samples])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_strides_written_for_contiguous_samples_are_refused_not_misread_under_vmap():
    # Strides written as literals for a contiguous sample: per sample they mean column windows;
    # under vmap with the batch dim last they walk across samples. torch.as_strided reads that
    # memory silently (the control: the differential test above can fail); fxviews refuses it,
    # because the sample does not expose it.
    samples = [torch.randn(5, 6) for _ in range(3)]
    batched = torch.stack(samples, dim=-1)
    expected = torch.stack([column_windows(s) for s in samples])

    def literal(as_strided):
        return lambda t: as_strided(t, (5, 5, 2), (6, 1, 1))

    assert not torch.equal(vmap(literal(torch.as_strided), in_dims=-1)(batched), expected)
    with pytest.raises(fxviews.AsStridedRequestError, match="does not expose"):
        vmap(literal(fxviews.as_strided), in_dims=-1)(batched)


@pytest.mark.parametrize("layout", INPUTS)
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_grad_equals_autograd_of_torch_as_strided(fn, layout, monkeypatch):
    x = INPUTS[layout].clone()  # contiguous: torch.as_strided's gradient is right there
    weights = torch.randn(fn(x).shape)

    def loss(t):
        return (fn(t) * weights).sum()

    got = grad(loss)(x)
    monkeypatch.setattr(fxviews, "as_strided", _eager_as_strided)
    leaf = x.clone().requires_grad_()
    loss(leaf).backward()
    torch.testing.assert_close(got, leaf.grad)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_jvp_pushes_the_tangent_through_the_same_views(fn):
    x, tangent = torch.randn(5, 6), torch.randn(6, 5).t()  # a non-contiguous tangent
    primal_out, tangent_out = jvp(fn, (x,), (tangent,))
    torch.testing.assert_close(primal_out, fn(x), rtol=0, atol=0)
    torch.testing.assert_close(tangent_out, fn(tangent.contiguous()), rtol=0, atol=0)


def test_a_tensor_subclass_gets_the_views_on_each_component():
    a, b = torch.randn(5, 6), torch.randn(5, 6)
    out = column_windows(TwoTensor(a, b))
    assert isinstance(out, TwoTensor)
    torch.testing.assert_close(out.a, a.unfold(1, 2, 1), rtol=0, atol=0)
    torch.testing.assert_close(out.b, b.unfold(1, 2, 1), rtol=0, atol=0)


def test_the_tensors_own_geometry_is_a_new_view_of_it():
    x = torch.randn(3, 4)
    out = fxviews.as_strided(x, x.shape, x.stride())
    assert out is not x
    assert out.data_ptr() == x.data_ptr() and out.stride() == x.stride()


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (((3,), (2,), None), "element 4 past the tensor's offset"),
        (((4,), (1,), 1), "offset is 1 below the tensor's own"),
    ],
    ids=["past-the-end", "before-the-start"],
)
def test_a_request_outside_the_tensor_is_refused_naming_both_geometries(request_, words):
    x = torch.zeros(8)[2:6]
    with pytest.raises(fxviews.AsStridedRequestError) as caught:
        fxviews.as_strided(x, *request_)
    message = str(caught.value)
    assert words in message
    assert "sizes=[4] strides=[1] offset=2" in message  # the tensor's geometry
    assert isinstance(caught.value, fxviews.FxViewsError)
    assert isinstance(caught.value, ValueError)


def test_safe_memory_without_a_view_form_is_refused_as_such():
    block = torch.arange(6.0).view(2, 3)[:, :2]  # addresses {0, 1, 3, 4}
    with pytest.raises(fxviews.AsStridedRequestError, match="no view form"):
        fxviews.as_strided(block, (2,), (2,), 1)  # the anti-diagonal {1, 3}


def test_under_compile_the_chain_is_computed_between_graphs_for_the_sizes_at_hand():
    # The engine runs as Python at a graph break (it verifies on meta tensors, which a traced
    # graph would record); the views it returns are traced.
    compiled = torch.compile(column_windows, backend="aot_eager", dynamic=True)
    for rows in (4, 6):
        x = torch.randn(rows, 5)
        torch.testing.assert_close(compiled(x), x.unfold(1, 2, 1), rtol=0, atol=0)
