"""The backend's first stage: a user's as_strided under vmap, compiled, equals the per-sample loop.

``torch.compile(vmap(f), backend="fxviews")`` is compared with ``torch.stack([f(s) for s in
samples])`` for research programs that write their own as_strided (im2col, log-mel framing,
Hankel and Takens embeddings, windows), alone and under ``grad`` and ``jvp``, at every batch dim
(the batched input built by ``torch.stack(samples, dim=bd)``, so the batch dim is physically
there), with the default inner compiler and Inductor, static and dynamic shapes. Eager vmap and
the backend before its first stage read each sample's physical layout: wrong at every batch dim
but the first.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.func import grad, jvp, vmap

import fxviews
from fxviews.bench.compiled_models import sliding_chunk_scores
from fxviews.bench.research_programs import PROGRAMS, squared_sum, windows
from fxviews.passes.compat.torch_internals import BackendCompilerFailed, reset_dynamo

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _samples(shape, count=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _ in range(count)]


def _case(kind, fn, samples, tangents, batch_dim):
    """(the vmapped function, its batched arguments, the per-sample loop's result)."""
    xs, ts = torch.stack(samples, dim=batch_dim), torch.stack(tangents, dim=batch_dim)
    if kind == "vmap":
        return vmap(fn, in_dims=batch_dim), (xs,), torch.stack([fn(s) for s in samples])
    if kind == "vmap_grad":
        per_sample = grad(squared_sum(fn))
        expected = torch.stack([per_sample(s) for s in samples])
        return vmap(per_sample, in_dims=batch_dim), (xs,), expected
    tangent_out = lambda x, t: jvp(fn, (x,), (t,))[1]  # noqa: E731
    expected = torch.stack([tangent_out(s, t) for s, t in zip(samples, tangents, strict=True)])
    return vmap(tangent_out, in_dims=batch_dim), (xs, ts), expected


#: Compositions Dynamo itself cannot trace with dynamic shapes on torch 2.13 (any backend, eager
#: included: "Cannot call storage_offset() on tensor with symbolic sizes/strides" in einsum and
#: rfft under jvp), so no backend sees a graph.
_DYNAMO_FAILS = {("im2col", "vmap_jvp"), ("log_mel", "vmap_jvp")}


def _matrix():
    for name, (_, shape) in PROGRAMS.items():
        for kind in ("vmap", "vmap_grad", "vmap_jvp"):
            for batch_dim in range(len(shape) + 1):
                for dynamic in (False, True):
                    if dynamic and (name, kind) in _DYNAMO_FAILS:
                        continue
                    yield pytest.param(
                        name,
                        kind,
                        batch_dim,
                        dynamic,
                        id=f"{name}-{kind}-bd{batch_dim}-" + ("dynamic" if dynamic else "static"),
                    )


@pytest.mark.parametrize(("name", "kind", "batch_dim", "dynamic"), list(_matrix()))
def test_compiled_vmap_equals_the_per_sample_loop(name, kind, batch_dim, dynamic):
    fn, shape = PROGRAMS[name]
    fn_vmapped, args, expected = _case(
        kind, fn, _samples(shape), _samples(shape, seed=1), batch_dim
    )
    compiled = torch.compile(fn_vmapped, backend="fxviews", dynamic=dynamic)
    torch.testing.assert_close(compiled(*args), expected)


#: Inductor itself fails on the view-op form of im2col under vmap with dynamic shapes and the
#: batch dim last ("ValueRangeError: Invalid ranges [0:-1]"; backend="inductor" on the program
#: written with unfold fails the same way).
_INDUCTOR_FAILS = {("im2col", 3, True)}


@pytest.mark.parametrize(
    ("name", "kind", "batch_dim", "dynamic"),
    [
        pytest.param(n, k, bd, dyn, id=f"{n}-{k}-bd{bd}-{'dynamic' if dyn else 'static'}")
        for n in ("windows", "im2col")
        for k in ("vmap", "vmap_grad")
        for bd in range(len(PROGRAMS[n][1]) + 1)
        for dyn in (False, True)
        if (n, bd, dyn) not in _INDUCTOR_FAILS and (bd > 0 or not dyn)
    ],
)
def test_compiled_vmap_with_inductor_equals_the_per_sample_loop(name, kind, batch_dim, dynamic):
    fn, shape = PROGRAMS[name]
    fn_vmapped, args, expected = _case(
        kind, fn, _samples(shape), _samples(shape, seed=1), batch_dim
    )
    compiled = torch.compile(
        fn_vmapped, backend="fxviews", options={"inner": "inductor"}, dynamic=dynamic
    )
    torch.testing.assert_close(compiled(*args), expected)


def test_the_readme_windows_compiled_under_vmap():
    """The README's windows, batch dim last: eager vmap is wrong; compiled, it is the loop."""
    samples = _samples((8,), count=4)
    xs = torch.stack(samples, dim=1)
    expected = torch.stack([windows(s) for s in samples])
    assert not torch.allclose(vmap(windows, in_dims=1)(xs), expected)  # eager vmap
    compiled = torch.compile(vmap(windows, in_dims=1), backend="fxviews")
    torch.testing.assert_close(compiled(xs), expected)
    torch.testing.assert_close(vmap(fxviews.transform(windows), in_dims=1)(xs), expected)


def library_windows(x):
    """Windows with strides read from the tensor, as library code writes them: inside vmap
    Dynamo bakes in the strides vmap gives each sample."""
    step = x.stride(0)
    return x.as_strided((x.shape[0] - 2, 3), (step, step), x.storage_offset())


@pytest.mark.parametrize("batch_dim", [0, 1])
@pytest.mark.parametrize("dynamic", [False, True])
def test_strides_read_inside_vmap_are_read_in_vmaps_layout(batch_dim, dynamic):
    samples = _samples((8,))
    xs = torch.stack(samples, dim=batch_dim)
    expected = torch.stack([library_windows(s) for s in samples])
    compiled = torch.compile(
        vmap(library_windows, in_dims=batch_dim), backend="fxviews", dynamic=dynamic
    )
    torch.testing.assert_close(compiled(xs), expected)


@pytest.mark.parametrize("batch_dim", [0, 1, 3])
def test_longformer_chunks_under_vmap_read_strides_in_vmaps_layout(batch_dim):
    """HF Longformer's _chunk per sample: a view of the input, then ``as_strided`` with the
    strides ``.stride()`` reports (under vmap, the layout vmap gives each sample). Compiled it
    equals ``vmap(transform(f))`` and the per-sample loop wherever the batch dim lies, with
    the default inner compiler; it raised where the batch dim was not first."""
    queries, keys = _samples((2, 8, 3)), _samples((2, 8, 3), seed=1)
    scores = functools.partial(sliding_chunk_scores, window=2)
    expected = torch.stack([scores(q, k) for q, k in zip(queries, keys, strict=True)])
    args = torch.stack(queries, dim=batch_dim), torch.stack(keys, dim=batch_dim)
    compiled = torch.compile(vmap(scores, in_dims=batch_dim), backend="fxviews")
    torch.testing.assert_close(compiled(*args), expected)
    transformed = vmap(fxviews.transform(scores), in_dims=batch_dim)
    torch.testing.assert_close(transformed(*args), expected)
    if batch_dim == 1:  # with Inductor inside too, once (its compiles are slow on CPU)
        reset_dynamo()
        inner = {"inner": "inductor"}
        compiled = torch.compile(vmap(scores, in_dims=1), backend="fxviews", options=inner)
        torch.testing.assert_close(compiled(*args), expected)


def test_nested_vmap_is_the_loop_of_loops():
    """Each vmap level reads its samples as the loop over fresh contiguous samples does."""
    rows = lambda r: r.as_strided((2, 2), (1, 1))  # noqa: E731
    inner = [[torch.randn(4) for _ in range(5)] for _ in range(3)]
    expected = torch.stack([torch.stack([rows(r) for r in row]) for row in inner])
    per_sample = [torch.stack(row, dim=1) for row in inner]  # (4, 5): inner samples on dim 1
    for batch_dim in range(3):
        reset_dynamo()
        fn = vmap(vmap(rows, in_dims=1), in_dims=batch_dim)
        compiled = torch.compile(fn, backend="fxviews")
        torch.testing.assert_close(compiled(torch.stack(per_sample, dim=batch_dim)), expected)


def as_strided_of_a_gradient(x):
    g = grad(lambda y: (y**3).sum())(x)
    return g.as_strided((g.numel() - 2, 3), (1, 1))


def test_as_strided_of_a_gradient_under_vmap():
    """A gradient's layout is the backward kernels', which no eager run checks: kept, read by
    vmap where that reads what the loop reads (batch dim first), refused elsewhere."""
    samples = _samples((8,))
    expected = torch.stack([as_strided_of_a_gradient(s) for s in samples])
    compiled = torch.compile(vmap(as_strided_of_a_gradient), backend="fxviews")
    torch.testing.assert_close(compiled(torch.stack(samples)), expected)
    reset_dynamo()
    compiled = torch.compile(vmap(as_strided_of_a_gradient, in_dims=1), backend="fxviews")
    with pytest.raises(BackendCompilerFailed, match="under torch.func.vmap is kept") as info:
        compiled(torch.stack(samples, dim=1))
    assert isinstance(info.value.inner_exception, fxviews.FxViewsError)
    assert "as_strided_of_a_gradient" in str(info.value)  # the user's line


def test_the_printout_names_the_dynamo_stage(monkeypatch, capsys):
    monkeypatch.setenv("FXVIEWS_DEBUG", "1")
    torch.compile(vmap(windows, in_dims=1), backend="fxviews")(torch.randn(8, 3))
    err = capsys.readouterr().err
    assert "backend, Dynamo graph of compile" in err
    assert "unfold(_add_batch_dim, 0, 3, 1)" in err


@pytest.mark.parametrize("batch_dim", [0, 1])
def test_windows_under_vmap_grad_keep_a_batched_backward(batch_dim):
    """unfold's backward has no batching rule: AOTAutograd would trace it once per sample. The
    windows stay an as_strided over the input pinned per sample, whose backward vmap batches."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    samples = _samples((8,), count=4)
    per_sample = grad(squared_sum(windows))
    expected = torch.stack([per_sample(s) for s in samples])
    compiled = torch.compile(
        vmap(per_sample, in_dims=batch_dim), backend=fxviews.backend(inner=record)
    )
    torch.testing.assert_close(compiled(torch.stack(samples, dim=batch_dim)), expected)
    unrolled = [
        n
        for gm in graphs
        for n in gm.graph.nodes
        if n.target is torch.ops.aten.unfold_backward.default
    ]
    assert not unrolled, graphs[0].code


def _indexed_windows(x):
    y = x[None, :] * 2  # tensor indexing in Dynamo's graph, a kernel run per sample
    return y.as_strided((x.numel() - 2, 3), (1, 1))


def _transposed_rows(x):  # x: (3, 4); x.t() in the loop has strides (1, 4): x[:, 1:]
    return x.t().as_strided((3, 3), (4, 1), 1) + 0


@pytest.mark.parametrize("fn", [_indexed_windows, _transposed_rows])
@pytest.mark.parametrize("batch_dim", [0, 1])
def test_as_strided_of_a_computed_value_under_vmap(fn, batch_dim):
    """The per-sample layout of a value computed inside vmap is the loop's: fake kernels run
    per sample, layout truth checks them on eager kernels."""
    shape = (8,) if fn is _indexed_windows else (3, 4)
    samples = _samples(shape)
    expected = torch.stack([fn(s) for s in samples])
    compiled = torch.compile(vmap(fn, in_dims=batch_dim), backend="fxviews")
    torch.testing.assert_close(compiled(torch.stack(samples, dim=batch_dim)), expected)
