"""Random as_strided graphs through the whole pass, against eager PyTorch, under vmap too.

The geometry properties (``test_geometry.py``) check synthesis on its own. Here each example is
a graph ``op(x, S, T, O)`` for ``op`` in the as_strided family, with ``x`` of a random layout
(contiguous, permuted, step-sliced, offset, expanded, unfolded) and a random target, rewritten
by :func:`fxviews.rewrite` with that layout as the trace-time one. Then:

1. on the trace-time layout, the rewritten graph equals eager ``op`` on the real tensor;
2. a node is rewritten only if its target reads memory its input exposes;
3. when rewritten, ``vmap`` of the graph on samples stacked with the batch dim physically at a
   random position equals eager ``op`` applied one sample at a time, each sample laid out in
   the trace-time layout (the pass's promise: "relative to the layout it was traced with").

``FXVIEWS_EXAMPLES`` sets how many examples each property draws (``make fuzz`` draws many); the
samples live on :data:`tests.reference.TEST_DEVICE` (``FXVIEWS_TEST_DEVICE``, CPU by default).
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st

import fxviews
from fxviews.passes.geometry.concrete import Geometry
from tests.device_checks import raise_if_test_device_failed
from tests.reference import TEST_DEVICE, as_strided_nodes
from tests.test_geometry import SETTINGS, random_target_cases, sources, storage_for

aten = torch.ops.aten
BATCH = 3


def single_node_graph(
    op: Any, target: Geometry, scatter: bool, reread: Geometry | None = None
) -> torch.fx.GraphModule:
    """``op(x[, src], S, T, O) * 1``: one as_strided-family node in a hand-built graph.

    With ``reread``, the graph also returns ``as_strided(result, reread) * 1``: a later node
    that reads the result relative to its trace-time layout.
    """
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    src = (graph.placeholder("src"),) if scatter else ()
    node = graph.call_function(op, (x, *src, *_arguments(target)))
    outputs = [graph.call_function(aten.mul.Tensor, (node, 1))]
    if reread is not None:
        again = graph.call_function(aten.as_strided.default, (node, *_arguments(reread)))
        outputs.append(graph.call_function(aten.mul.Tensor, (again, 1)))
    graph.output(tuple(outputs))
    return torch.fx.GraphModule({}, graph)


def _arguments(geometry: Geometry) -> tuple[list[int], list[int], int]:
    return list(geometry.sizes), list(geometry.strides), geometry.offset


def laid_out(source: Geometry, storage: torch.Tensor) -> torch.Tensor:
    """``storage`` read through ``source``: a sample in the trace-time layout."""
    return storage.as_strided(source.sizes, source.strides, source.offset)


def _randn(sizes: tuple[int, ...]) -> torch.Tensor:
    """Values drawn on CPU (the same on every device), on the test device."""
    return torch.randn(sizes, dtype=torch.float64).to(TEST_DEVICE)


def check_rewrite(
    op: Any, source: torch.Tensor, target: Geometry, batch_dim: int, scatter: bool
) -> None:
    geometry = Geometry.of(source)
    extent = geometry.storage_extent()
    args = _arguments(target)
    srcs = [_randn(target.sizes) for _ in range(BATCH)]

    def eager(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return op(x, src, *args) if scatter else op(x, *args)

    storages = [_randn((extent,)) for _ in range(BATCH)]
    samples = [laid_out(geometry, s) for s in storages]
    try:
        results = [eager(x, src) for x, src in zip(samples, srcs, strict=True)]
    except RuntimeError as err:  # eager refuses it (a scatter region outside the output)
        raise_if_test_device_failed(err, f"eager {op}")
        assume(False)
    # A scatter's result is read again through its own layout, as later graph nodes read it.
    reread = Geometry.of(results[0]) if scatter else None
    expected = [(r, r) if scatter else (r,) for r in results]
    extra = (srcs[0],) if scatter else ()
    res = fxviews.rewrite(
        single_node_graph(op, target, scatter, reread), example_inputs=[samples[0], *extra]
    )
    record = res.records[0]
    event(f"{record.method}")  # the share of each method shows in --hypothesis-show-statistics
    graph = res.graph_module
    torch.testing.assert_close(graph(samples[0], *extra), expected[0])
    if record.method == "kept":
        return
    assert not as_strided_nodes(graph), res.records
    exposed = set(geometry.addresses())
    if not scatter:
        assert set(target.addresses()) <= exposed, f"rewrote an unsafe {target} of {geometry}"
    # Logical values of every sample, batched with the batch dim physically at `batch_dim`.
    batched = torch.stack([s.clone() for s in samples], dim=batch_dim)
    in_dims: tuple[int, ...] = (batch_dim, 0) if scatter else (batch_dim,)
    batched_args = (batched, torch.stack(srcs)) if scatter else (batched,)
    out = torch.func.vmap(graph, in_dims=in_dims)(*batched_args)
    for b in range(BATCH):
        got = tuple(o[b] for o in out)
        torch.testing.assert_close(got, expected[b], msg=lambda m, b=b: f"{record} sample {b}: {m}")


@SETTINGS
@given(random_target_cases(), st.data())
def test_as_strided_and_copy_match_eager_per_sample(case, data: st.DataObject) -> None:
    source, target = case
    op = data.draw(st.sampled_from([aten.as_strided.default, aten.as_strided_copy.default]))
    batch_dim = data.draw(st.integers(0, source.ndim))
    check_rewrite(op, source, target, batch_dim, scatter=False)


@st.composite
def region_cases(draw: st.DrawFn) -> tuple[torch.Tensor, Geometry]:
    """A source without overlap and a region of it made by slicing: scatter targets."""
    source = draw(sources())
    region = source
    for _ in range(draw(st.integers(1, 3))):
        dim = draw(st.integers(0, max(region.ndim - 1, 0)))
        if region.ndim == 0 or region.shape[dim] == 0:
            break
        kind = draw(st.sampled_from(["select", "slice", "diagonal", "permute"]))
        size = region.shape[dim]
        if kind == "select":
            region = region.select(dim, draw(st.integers(0, size - 1)))
        elif kind == "slice":
            start = draw(st.integers(0, size - 1))
            region = region.narrow(dim, start, size - start)[
                (slice(None),) * dim + (slice(None, None, draw(st.integers(1, 3))),)
            ]
        elif kind == "diagonal" and region.ndim >= 2:
            region = region.diagonal(0, dim, (dim + 1) % region.ndim)
        elif kind == "permute":
            region = region.permute(draw(st.permutations(range(region.ndim))))
    assume(region.numel() > 0)
    return source, Geometry.of(region)


@SETTINGS
@given(st.one_of(region_cases(), random_target_cases()), st.data())
def test_as_strided_scatter_matches_eager_per_sample(case, data: st.DataObject) -> None:
    source, target = case
    batch_dim = data.draw(st.integers(0, source.ndim))
    check_rewrite(aten.as_strided_scatter.default, source, target, batch_dim, scatter=True)


def test_region_cases_are_rewritten() -> None:
    """The scatter property is not vacuous: a plain region of a plain source is rewritten."""
    source = storage_for(Geometry((3, 4), (4, 1), 0)).to(TEST_DEVICE)
    graph = single_node_graph(aten.as_strided_scatter.default, Geometry((4,), (1,), 4), True)
    res = fxviews.rewrite(graph, example_inputs=[source, _randn((4,))])
    assert [r.method for r in res.records] == ["synthesized"]
