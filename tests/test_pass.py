"""The AsStridedToViews pass and fxviews.rewrite: records, variants, strictness, hygiene, cost."""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.fx.passes.infra.pass_manager import PassManager

import fxviews
from fxviews.examples import push_jvp, seed_args
from fxviews.passes import AsStridedToViews, remove_dead_pure_nodes
from fxviews.passes.geometry.concrete import Geometry
from fxviews.passes.graph_edits import copy_graph
from fxviews.passes.op_tables import METADATA_MUTATIONS
from fxviews.rewriting.steps import rewrite_in_place
from tests.reference import as_strided_nodes

aten = torch.ops.aten


def test_seed_is_rewritten_by_provenance_and_caller_graph_is_untouched() -> None:
    gm = fxviews.trace(push_jvp, *seed_args())
    code, nodes = gm.code, len(gm.graph.nodes)
    res = fxviews.rewrite(gm)
    assert gm.code == code and len(gm.graph.nodes) == nodes
    assert len(as_strided_nodes(gm)) == 1
    assert as_strided_nodes(res.graph_module) == []
    assert res.modified
    [record] = res.records
    assert record.method == "provenance"
    assert record.node == "as_strided"
    assert record.before == "as_strided(clone_1, [6], [1], 0)"
    assert record.after == "select(clone_1, 0, 0)"


def test_seed_under_vmap_with_batch_dims_not_first() -> None:
    samples = [seed_args() for _ in range(3)]
    gm = fxviews.trace(push_jvp, *samples[0])
    batched = [torch.stack([s[i] for s in samples], dim=d) for i, d in enumerate((1, 2, 2))]
    out = torch.func.vmap(fxviews.rewrite(gm).graph_module, in_dims=(1, 2, 2))(*batched)
    for b, sample in enumerate(samples):
        expected = torch.utils._pytree.tree_leaves(push_jvp(*sample))
        got = [t[b] for t in torch.utils._pytree.tree_leaves(out)]
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)
    # The plain graph is silently wrong on the same inputs: the bug this library fixes.
    plain = torch.func.vmap(gm, in_dims=(1, 2, 2))(*batched)
    tangent_view = torch.utils._pytree.tree_leaves(plain)[2]
    expected_view = torch.stack([push_jvp(*s)[1][0] for s in samples])
    assert not torch.allclose(tangent_view, expected_view)


def test_view_replay_removes_the_as_strided_at_the_source() -> None:
    # PyTorch's own view replay makes forward AD call `select` itself: nothing to rewrite.
    gm = fxviews.trace(push_jvp, *seed_args(), view_replay=True)
    assert as_strided_nodes(gm) == []
    assert aten.select.int in [n.target for n in gm.graph.nodes]
    assert fxviews.rewrite(gm).records == []


def test_identity_becomes_alias() -> None:
    gm = fxviews.trace(lambda x: torch.as_strided(x, (2, 3), (3, 1), 0) * 2, torch.randn(2, 3))
    res = fxviews.rewrite(gm)
    assert [r.method for r in res.records] == ["identity"]
    x = torch.randn(3, 2).t()
    torch.testing.assert_close(res.graph_module(x), x * 2)


def test_synthesized_user_as_strided_on_non_contiguous_input() -> None:
    def windows(x):
        return torch.as_strided(x, (3, 4), (2, 1), 1).sum(-1)

    gm = fxviews.trace(windows, torch.randn(10))
    res = fxviews.rewrite(gm)
    assert [r.method for r in res.records] == ["synthesized"]
    base = torch.randn(10, 3)[:, 1]  # non-contiguous: stride 3
    expected = torch.stack([base[1 + 2 * i : 1 + 2 * i + 4] for i in range(3)]).sum(-1)
    torch.testing.assert_close(res.graph_module(base), expected)


def test_as_strided_of_an_as_strided_reads_relative_to_the_rewritten_input() -> None:
    def f(x):
        rows = x.as_strided((3, 4), (4, 1), 2)
        return rows.as_strided((3,), (5,), 2) * 1, rows.as_strided((2, 2), (1, 4), 3) * 1

    res = fxviews.rewrite(fxviews.trace(f, torch.randn(20)))
    assert [r.method for r in res.records] == ["synthesized"] * 3
    samples = [torch.randn(20) for _ in range(3)]
    out = torch.func.vmap(res.graph_module, in_dims=1)(torch.stack(samples, dim=1))
    for b, sample in enumerate(samples):
        for got, want in zip(out, f(sample), strict=True):
            torch.testing.assert_close(got[b], want)


def test_unsafe_as_strided_is_kept_with_a_witness_and_strict_raises() -> None:
    # Reads column 2 of a 3x5 block through an input that only exposes columns 0-1 (a view
    # made inside the graph would be read from its base instead: tests/test_kept_nodes.py).
    def peek(x):
        return torch.as_strided(x, (3,), (5,), 2)

    gm = fxviews.trace(peek, torch.randn(3, 5)[:, :2])
    res = fxviews.rewrite(gm)
    [record] = res.records
    assert record.method == "kept" and record.reason.startswith("unsafe")
    assert "address 2" in record.reason
    assert len(as_strided_nodes(res.graph_module)) == 1
    with pytest.raises(fxviews.UnsafeAsStridedError) as info:
        fxviews.rewrite(gm, strict=True)
    assert info.value.node == record.node and "[3]" in str(info.value)
    assert isinstance(info.value, fxviews.FxViewsError)
    assert len(as_strided_nodes(gm)) == 1  # still untouched


def test_trace_records_storage_offsets_of_views_and_inputs() -> None:
    # x starts at offset 1: reading offset 0 from it is unsafe, not an identity.
    x = torch.arange(4.0)[1:]
    gm = fxviews.trace(lambda x: x.as_strided((3,), (1,), 0) * 1, x)
    [record] = fxviews.rewrite(gm).records
    assert record.method == "kept" and "address 0" in record.reason
    # An input that is itself an offset view: its offset is part of the traced layout.
    big = torch.arange(10.0)[2:8]
    res = fxviews.rewrite(fxviews.trace(lambda x: torch.as_strided(x, (2,), (2,), 3), big))
    assert [r.method for r in res.records] == ["synthesized"]
    torch.testing.assert_close(res.graph_module(big), torch.as_strided(big, (2,), (2,), 3))


def test_safe_but_viewless_target_is_kept_with_reason() -> None:
    gm = fxviews.trace(lambda x: torch.as_strided(x, (2,), (3,), 1), torch.randn(4, 4)[:2, :2])
    [record] = fxviews.rewrite(gm).records
    assert record.method == "kept" and "no view form" in record.reason


def test_backward_buffer_pattern_is_rewritten_relative_to_the_base_view() -> None:
    def f(x, y):
        x = x.clone()
        view = x[0]
        x.mul_(y)
        return (view * 2 + x).sum()

    grad_f = torch.func.grad(f, argnums=1)
    x, y = torch.randn(2, 6), torch.randn(2, 6)
    res = fxviews.rewrite(fxviews.trace(grad_f, x, y))
    assert [r.method for r in res.records] == ["scatter", "scatter"]
    assert res.records[0].after == "select(view(new_zeros, [2, 6]), 0, 0)"
    xs, ys = torch.randn(3, 2, 6), torch.randn(2, 6, 3)
    out = torch.func.vmap(res.graph_module, in_dims=(0, 2))(xs, ys)
    for b in range(3):
        torch.testing.assert_close(out[b], grad_f(xs[b], ys[..., b]))


def test_as_strided_copy_and_scatter_variants() -> None:
    def f(x, s):
        a = aten.as_strided_copy.default(x, [3], [4], 0)
        b = aten.as_strided_scatter.default(x, s, [3], [1], 3)
        return a, b

    x, s = torch.randn(3, 3), torch.randn(3)
    gm = fxviews.trace(f, x, s)
    res = fxviews.rewrite(gm)
    assert [r.method for r in res.records] == ["synthesized", "synthesized"]
    assert as_strided_nodes(res.graph_module) == []
    xt = torch.randn(3, 3).t()  # non-contiguous: the rewrite reads it by logical dims
    a, b = res.graph_module(xt, s)
    torch.testing.assert_close(a, xt.diagonal())
    expected = xt.clone()
    expected[1] = s
    torch.testing.assert_close(b, expected)


def test_scatter_into_a_flat_buffer_next_to_its_base_view() -> None:
    def f(g, s):
        buf = g.new_zeros([12])
        scattered = aten.as_strided_scatter.default(buf, s, [6], [1], 6)
        return aten.as_strided.default(scattered, [2, 6], [6, 1], 0), aten.as_strided.default(
            buf, [2, 6], [6, 1], 0
        )

    g, s = torch.randn(3), torch.randn(6)
    res = fxviews.rewrite(fxviews.trace(f, g, s))
    assert all(r.method != "kept" for r in res.records) and len(res.records) == 3
    out, base = res.graph_module(g, s)
    torch.testing.assert_close(out, torch.cat([torch.zeros(6), s]).view(2, 6))
    torch.testing.assert_close(base, torch.zeros(2, 6))


def test_in_place_as_strided_becomes_views_when_its_input_is_not_used_later() -> None:
    def f(x):
        y = x.clone()
        y.as_strided_((3,), (4,))
        return y * 2

    res = fxviews.rewrite(fxviews.trace(f, torch.randn(3, 3)))
    assert [r.method for r in res.records] == ["synthesized"]
    assert as_strided_nodes(res.graph_module) == []
    x = torch.randn(3, 3).t()
    torch.testing.assert_close(res.graph_module(x), x.diagonal() * 2)


def test_in_place_as_strided_of_an_argument_stays_and_restrides_it_as_eager() -> None:
    """``as_strided_`` on an argument (or a closed-over tensor) restrides the caller's tensor:
    a view would compute the same values but leave the caller's layout as it was."""
    closed_over = torch.arange(6.0)

    def restride_argument(x):
        x.as_strided_((2, 2), (2, 1), 1)
        return x * 2

    def restride_constant(x):
        closed_over.as_strided_((2, 2), (1, 2), 2)
        return closed_over + x

    res = fxviews.rewrite(fxviews.trace(restride_argument, torch.arange(6.0)))
    assert [r.method for r in res.records] == ["kept"], res.records
    assert "outside the graph" in res.records[0].reason

    def layout(tensor: torch.Tensor) -> tuple[Any, ...]:
        return tensor.shape, tensor.stride(), tensor.storage_offset()

    for fn, make_args, restrided in [
        (restride_argument, lambda: (torch.arange(6.0),), lambda args: args[0]),
        (restride_constant, lambda: (torch.ones(2, 2),), lambda args: closed_over),
    ]:
        transformed = fxviews.transform(fn)
        for _ in range(2):  # the first call (recorded) and a cached one
            closed_over.as_strided_((6,), (1,), 0)
            eager_args = make_args()
            want, want_layout = fn(*eager_args), layout(restrided(eager_args))
            closed_over.as_strided_((6,), (1,), 0)
            args = make_args()
            torch.testing.assert_close(transformed(*args), want)
            assert layout(restrided(args)) == want_layout, fn.__name__


def _hand_built_in_place_as_strided(read_input_again: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(aten.clone.default, (x,))
    z = graph.call_function(aten.as_strided_.default, (y, [3], [4]))
    doubled = graph.call_function(aten.mul.Tensor, (z, 2))
    if read_input_again:  # `y` is read after it was restrided
        graph.output((doubled, graph.call_function(aten.add.Tensor, (y, 0))))
    else:
        graph.output((doubled,))
    return torch.fx.GraphModule({}, graph)


def test_in_place_as_strided_of_a_hand_built_graph() -> None:
    x = torch.randn(3, 3)
    gm = _hand_built_in_place_as_strided(read_input_again=False)
    res = fxviews.rewrite(gm, example_inputs=[x])
    assert [r.method for r in res.records] == ["synthesized"]
    torch.testing.assert_close(res.graph_module(x.clone()), gm(x.clone()))


def test_in_place_as_strided_is_kept_when_its_input_is_read_afterwards() -> None:
    x = torch.randn(3, 3)
    gm = _hand_built_in_place_as_strided(read_input_again=True)
    res = fxviews.rewrite(gm, example_inputs=[x])
    [record] = res.records
    assert record.method == "kept" and "afterwards" in record.reason
    for got, want in zip(res.graph_module(x.clone()), gm(x.clone()), strict=True):
        torch.testing.assert_close(got, want)


def test_in_place_as_strided_is_kept_when_metadata_shows_only_the_new_layout() -> None:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = _hand_built_in_place_as_strided(read_input_again=False)
    FakeTensorProp(gm).propagate(torch.randn(3, 3))
    restrided = next(n for n in gm.graph.nodes if n.target is aten.as_strided_.default)
    # A recorder that stores the restrided tensor itself on its input, not a snapshot.
    restrided.args[0].meta["val"] = restrided.meta["val"]
    [record] = fxviews.rewrite(gm).records
    assert record.method == "kept" and "only the layout after it" in record.reason


def test_graph_without_metadata_needs_example_inputs() -> None:
    def f(x):
        return torch.ops.aten.as_strided.default(x, [3], [4], 0)

    gm = torch.fx.symbolic_trace(f)
    with pytest.raises(fxviews.FxViewsError, match="meta"):
        fxviews.rewrite(gm)
    res = fxviews.rewrite(gm, example_inputs=[torch.randn(3, 3)])
    assert [r.method for r in res.records] == ["synthesized"]
    x = torch.randn(3, 3)
    torch.testing.assert_close(res.graph_module(x), x.diagonal())
    with pytest.raises(fxviews.FxViewsError, match="example_inputs"):
        fxviews.rewrite(gm, example_inputs=[])  # inputs that do not fit the graph


def test_symbolic_trace_module_with_parameter_and_torch_level_as_strided() -> None:
    class Diagonal(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))

        def forward(self, x):
            return torch.as_strided(self.w * x, (3,), (4,), 0) + (x * 2).as_strided((3,), (1,), 3)

    gm = torch.fx.symbolic_trace(Diagonal())
    res = fxviews.rewrite(gm, example_inputs=[torch.randn(3, 3)])
    assert [r.method for r in res.records] == ["synthesized", "synthesized"]
    assert res.graph_module.w is gm.w  # shared, so gradients reach the caller's parameter
    x = torch.randn(3, 3).t()
    out = res.graph_module(x)
    torch.testing.assert_close(out, (gm.w * x).diagonal() + (x * 2)[1])
    out.sum().backward()
    assert gm.w.grad is not None


def test_rewrite_inside_another_trace_records_nothing_of_its_own() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    inner = fxviews.trace(push_jvp, *seed_args())

    def outer(x, y, yt):
        return fxviews.rewrite(inner).graph_module(x, y, yt)

    outer_gm = make_fx(outer)(*seed_args())
    targets = {n.target for n in outer_gm.graph.nodes if n.op == "call_function"}
    assert aten.as_strided.default not in targets and aten.empty.memory_format not in targets
    assert not [n for n in outer_gm.graph.nodes if n.op == "get_attr"]


def test_a_copy_with_the_right_geometry_is_never_taken_for_a_view() -> None:
    # x[[0, 1]] copies; its geometry equals that of rows 0-1 of a fresh (2, 4) base. Replaying
    # it for the as_strided would read the right values but lose the write through the view.
    def f(x, y):
        base = x * 1
        picked = base[[0, 1]]
        window = torch.as_strided(base, (2, 4), (4, 1), 0)
        window.mul_(y)
        return picked, base

    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(3, 4), torch.randn(2, 4)
    res = fxviews.rewrite(gm, example_inputs=[x, y])
    assert [r.method for r in res.records] != ["provenance"]
    for got, want in zip(res.graph_module(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want)


def test_views_that_change_values_are_never_replayed() -> None:
    # base[0].conj() has the geometry of row 0; replaying select + conj for the as_strided of
    # row 0 would give conjugated values.
    def f(x, y):
        base = x * 1
        conjugated_row = base[0].conj()
        row = torch.as_strided(base, (3,), (1,), 0)
        return conjugated_row * 1, row * y

    x, y = torch.randn(2, 3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)
    res = fxviews.rewrite(fxviews.trace(f, x, y))
    assert [r.after for r in res.records] == ["select(mul, 0, 0)"]
    for got, want in zip(res.graph_module(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want)


def test_rewrite_rejects_non_graph_modules() -> None:
    with pytest.raises(TypeError, match="GraphModule"):
        fxviews.rewrite(lambda x: x)


def test_pass_runs_in_torch_fx_pass_manager_and_mutates_in_place() -> None:
    gm = fxviews.trace(push_jvp, *seed_args())
    result = PassManager(passes=[AsStridedToViews()])(gm)
    assert result.modified and as_strided_nodes(gm) == []


def test_hygiene_drops_dead_metadata_checks_only() -> None:
    gm = fxviews.trace(push_jvp, *seed_args())
    targets = {n.target for n in gm.graph.nodes}
    assert aten.is_same_size.default in targets
    assert remove_dead_pure_nodes(gm)
    targets = {n.target for n in gm.graph.nodes}
    assert aten.is_same_size.default not in targets
    assert aten._has_same_storage_numel.default not in targets
    assert aten.copy_.default in targets  # side effects stay
    x, y, yt = seed_args()
    for got, want in zip(
        torch.utils._pytree.tree_leaves(gm(x, y, yt)),
        torch.utils._pytree.tree_leaves(push_jvp(x, y, yt)),
        strict=True,
    ):
        torch.testing.assert_close(got, want)


def test_dead_code_step_erases_only_provably_pure_nodes() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    doubled = graph.call_function(aten.mul.Tensor, (x, 2))  # dead pure chain: goes
    graph.call_function(aten.sum.default, (doubled,))
    graph.call_function(aten.rand.default, ([3],))  # random: stays
    dropout = graph.call_function(aten.native_dropout.default, (x, 0.5, True))
    graph.call_function(operator.getitem, (dropout, 1))  # the pick goes, the dropout stays
    buffer = graph.call_function(aten.clone.default, (x,))
    graph.call_function(aten.add_.Tensor, (buffer, 1))  # in place: stays, with its input
    graph.call_method("add", (x, 1))  # a method we cannot prove pure: stays
    graph.output(x)
    gm = torch.fx.GraphModule({}, graph)
    assert remove_dead_pure_nodes(gm)
    left = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert left == [
        aten.rand.default,
        aten.native_dropout.default,
        aten.clone.default,
        aten.add_.Tensor,
        "add",
    ]


def _safe_then_unsafe(x, columns):
    rows = torch.as_strided(x, (5,), (1,), 5)  # row 1: rewritable
    column = torch.as_strided(columns, (3,), (5,), 2)  # column 2 through columns 0-1: unsafe
    return rows * 1, column * 1


def test_strict_mode_is_atomic_and_names_the_geometry() -> None:
    gm = fxviews.trace(_safe_then_unsafe, torch.randn(3, 5), torch.randn(3, 5)[:, :2])
    code, nodes = gm.code, [n.format_node() for n in gm.graph.nodes]
    with pytest.raises(Exception) as info:  # PassManager wraps what a pass raises
        PassManager(passes=[AsStridedToViews(strict=True)])(gm)
    error = info.value.__cause__
    assert isinstance(error, fxviews.UnsafeAsStridedError)
    assert error.node == "as_strided_1" and error.geometry == ((3,), (5,), 2)
    # Nothing was rewritten, not even the safe node before the unsafe one, and the module's
    # code still matches its graph.
    assert [n.format_node() for n in gm.graph.nodes] == nodes
    assert gm.code == code == gm.graph.python_code("self").src
    assert len(as_strided_nodes(gm)) == 2
    x, columns = torch.randn(3, 5), torch.randn(3, 5)[:, :2]
    for got, want in zip(gm(x, columns), _safe_then_unsafe(x, columns), strict=True):
        torch.testing.assert_close(got, want)


def test_strict_mode_installs_the_rewrite_when_every_node_is_proven() -> None:
    gm = fxviews.trace(lambda x: torch.as_strided(x, (5,), (1,), 5) * 1, torch.randn(3, 5))
    result = PassManager(passes=[AsStridedToViews(strict=True)])(gm)
    assert result.modified and as_strided_nodes(gm) == []
    assert gm.code == gm.graph.python_code("self").src
    x = torch.randn(5, 3).t()
    torch.testing.assert_close(gm(x), x[1])


def test_strict_rewrite_in_place_generates_code_once(monkeypatch) -> None:
    gm = fxviews.trace(lambda x: torch.as_strided(x, (5,), (1,), 5) * 1, torch.randn(3, 5))
    generated: list[torch.fx.Graph] = []
    python_code = torch.fx.Graph.python_code

    def counting(graph: torch.fx.Graph, *args: Any, **kwargs: Any) -> Any:
        generated.append(graph)
        return python_code(graph, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counting)
    result = rewrite_in_place(gm, strict=True)
    assert result.modified and len(generated) == 1 and generated[0] is gm.graph
    monkeypatch.undo()
    assert gm.code == gm.graph.python_code("self").src
    x = torch.randn(5, 3).t()
    torch.testing.assert_close(gm(x), x[1])


def test_large_scatter_is_proven_not_assumed() -> None:
    # An expanded self has internal overlap, so as_strided_scatter writes through a contiguous
    # clone: offset 0, stride 1 means (0, 0), (0, 1), (1, 0). The same numbers read on the
    # expanded layout would mean column 0. No size may skip the proof.
    def scatter(x, s):
        return aten.as_strided_scatter.default(x.unsqueeze(1).expand(-1, 2), s, [3], [1], 0)

    for n in (12, 100_010):
        x, s = torch.randn(n), torch.randn(3)
        res = fxviews.rewrite(fxviews.trace(scatter, x, s))
        torch.testing.assert_close(res.graph_module(x, s), scatter(x, s))
    # A self without overlap is written through its own layout, offset included: rewritten.
    offset = fxviews.rewrite(
        fxviews.trace(
            lambda x, s: aten.as_strided_scatter.default(x[1:], s, [3], [1], 2),
            torch.randn(100_010),
            torch.randn(3),
        )
    )
    assert [r.method for r in offset.records] == ["synthesized"]
    x, s = torch.randn(100_010), torch.randn(3)
    expected = x[1:].clone()
    expected[1:4] = s
    torch.testing.assert_close(offset.graph_module(x, s), expected)


def test_scatter_result_keeps_the_layout_later_nodes_read_it_with() -> None:
    # The scatter's result starts at offset 1, as its input x[1:] does; the as_strided after it
    # reads offset 2, i.e. from element 1. A replacement starting at offset 0 would shift it.
    def f(x, s):
        out = aten.as_strided_scatter.default(x[1:], s, [5], [1], 1)
        return aten.as_strided.default(out, [2], [1], 2) * 1

    x, s = torch.randn(6), torch.randn(5)
    res = fxviews.rewrite(fxviews.trace(f, x, s))
    torch.testing.assert_close(res.graph_module(x, s), f(x, s))


def test_rewrite_drops_dead_pure_nodes_and_keeps_dead_random_ones() -> None:
    def f(x, y, t):
        def inner(y):
            base = x.clone()
            view = base[1]
            base.mul_(y)
            torch.rand(3)  # unused, but it advances the generator
            return view * torch.rand(5)

        return torch.func.jvp(inner, (y,), (t,))

    args = [torch.randn(2, 5) for _ in range(3)]
    gm = fxviews.trace(f, *args)
    graph = fxviews.rewrite(gm).graph_module.graph
    dead = [n for n in graph.nodes if n.op == "call_function" and not n.users]
    assert {n.target for n in dead} <= {aten.rand.default, aten.mul_.Tensor}
    assert len([n for n in graph.nodes if n.target is aten.rand.default]) == 2
    assert not any(str(n.target).startswith("prims.") for n in graph.nodes)


def test_transform_keeps_the_random_stream_of_eager_pytorch_inside_a_compile() -> None:
    from torch._guards import TracingContext, tracing

    def f(x):
        torch.rand(3)  # unused
        return x + torch.rand(3)

    x = torch.randn(3)
    torch.manual_seed(0)
    expected = f(x)
    tf = fxviews.transform(f)
    # torch.compile's tracing context makes FX's own dead-code pass treat random ops as pure.
    with tracing(TracingContext(None)):
        torch.manual_seed(0)
        got = tf(x)
    torch.testing.assert_close(got, expected)


def test_example_inputs_are_validated_before_use() -> None:
    gm = torch.fx.symbolic_trace(lambda x, y: torch.as_strided(x, (3,), (4,), 0) + y)
    code = gm.code
    with pytest.raises(TypeError, match="list or tuple.*Tensor"):
        fxviews.rewrite(gm, example_inputs=torch.randn(3, 3))
    with pytest.raises(fxviews.FxViewsError, match="1 values but the graph takes 2 inputs"):
        fxviews.rewrite(gm, example_inputs=[torch.randn(3, 3)])
    with pytest.raises(fxviews.FxViewsError, match="3 values"):
        fxviews.rewrite(gm, example_inputs=[torch.randn(3, 3)] * 3)
    with pytest.raises(fxviews.FxViewsError, match="1 values"):
        AsStridedToViews(example_inputs=[torch.randn(3, 3)])(gm)
    assert gm.code == code
    x, y = torch.randn(3, 3), torch.randn(3)
    res = fxviews.rewrite(gm, example_inputs=(x, y))
    torch.testing.assert_close(res.graph_module(x, y), x.diagonal() + y)


def test_example_inputs_of_a_graph_over_nested_inputs_are_its_arguments() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(pair):
        a, b = pair
        return torch.as_strided(a, (3,), (4,), 0) + b

    pair = (torch.randn(3, 3), torch.randn(3))
    gm = make_fx(f)(pair)  # two placeholders, one argument
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    with pytest.raises(fxviews.FxViewsError, match="2 values but the graph takes 1 inputs"):
        fxviews.rewrite(gm, example_inputs=list(pair))
    res = fxviews.rewrite(gm, example_inputs=[pair])
    assert [r.method for r in res.records] == ["synthesized"]
    torch.testing.assert_close(res.graph_module(pair), f(pair))


def many_views(n: int):
    """torch.func code with ``n`` views of a base that is then mutated by a dual operand."""

    def f(x, y):
        x = x.clone()
        views = [x[i % 4, i % 3 :] for i in range(n)]
        x.mul_(y)
        return [v * 1 for v in views]

    def g(x, y, yt):
        return torch.func.jvp(functools.partial(f, x), (y,), (yt,))

    return g


@pytest.mark.parametrize(
    "where",
    [
        "fxviews.passes.chains.verification.apply_chain",
        "fxviews.passes.rewrites.as_strided_to_views._build",
    ],
)
def test_a_bug_in_a_candidate_surfaces_instead_of_becoming_a_kept_record(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    def bug(*args, **kwargs):
        raise TypeError("a bug, not a candidate that does not fit")

    monkeypatch.setattr(where, bug)
    gm = fxviews.trace(lambda x: torch.as_strided(x, (3,), (4,), 0) * 1, torch.randn(3, 3))
    with pytest.raises(TypeError, match="a bug"):
        fxviews.rewrite(gm)


def test_views_the_pass_made_are_never_reported_as_the_users() -> None:
    def f(x):
        return torch.as_strided(x * 2, (3, 4), (4, 1), 0)

    gm = torch.fx.symbolic_trace(f)
    users_nodes = {n.name for n in gm.graph.nodes}
    res = fxviews.rewrite(gm, example_inputs=[torch.randn(12)])
    [record] = res.records
    assert record.after == "view(mul, [3, 4])"
    made = [r for r in res.view_records if r.node not in users_nodes]
    assert made, "the reshape step saw the pass's own view"
    assert all(r.reason.startswith("made by fxviews for 'as_strided'") for r in made), made
    x = torch.randn(12)
    torch.testing.assert_close(res.graph_module(x), f(x))


#: The geometry algebra's entry points: every geometry made, compared or materialised.
GEOMETRY_WORK = ("__post_init__", "key", "meta_tensor")


def count_geometry_work(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Spy on :data:`GEOMETRY_WORK`; the returned dict counts calls (key ``"calls"``)."""
    counts = {"calls": 0}
    for name in GEOMETRY_WORK:
        real = getattr(Geometry, name)

        def spy(*args, _real=real, **kwargs):
            counts["calls"] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(Geometry, name, spy)
    return counts


def count_layout_mutation_checks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the engine's "does this user change its input's layout in place" tests."""
    counts = {"calls": 0}

    class CountingSet(frozenset):
        def __contains__(self, item: object) -> bool:
            counts["calls"] += 1
            return super().__contains__(item)

    monkeypatch.setattr(
        "fxviews.passes.rewrites.as_strided_to_views.METADATA_MUTATIONS",
        CountingSet(METADATA_MUTATIONS),
    )
    return counts


def test_pass_work_is_linear_in_graph_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Geometry work and the scan of users of a base that all views share (its users looked at
    once, not once per as_strided: quadratic) stay flat per node as the graph grows."""
    spies = {
        "geometry": count_geometry_work(monkeypatch),
        "user scan": count_layout_mutation_checks(monkeypatch),
    }
    per_node: dict[str, list[float]] = {name: [] for name in spies}
    for size in (40, 160):
        args = (torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6))
        gm = fxviews.trace(many_views(size), *args)
        for counts in spies.values():
            counts["calls"] = 0
        res = fxviews.rewrite(gm)
        assert as_strided_nodes(res.graph_module) == [] and len(res.records) >= size
        nodes = len(gm.graph.nodes)
        for name, counts in spies.items():
            per_node[name].append(counts["calls"] / nodes)
    assert nodes > 1000
    for name, (small, big) in per_node.items():
        assert small > 0, name
        # Work per node stays flat as the graph grows four-fold: linear, not quadratic.
        assert big <= 1.25 * small, (name, per_node[name])


@contextlib.contextmanager
def collections_started() -> Iterator[list[int]]:
    """The generations of the cyclic collections that start in the block, in order; the
    allocations made before it are collected first, so they do not add up to one in it."""
    starts: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            starts.append(info["generation"])

    gc.collect()
    gc.callbacks.append(record)
    try:
        yield starts
    finally:
        gc.callbacks.remove(record)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_graph_copy_and_passes_run_without_cyclic_collections(enabled_before: bool) -> None:
    """Each full collection scans the whole heap (the traced graph and its fake tensors), so
    collections during the copy and the passes made the pass superlinear on large graphs.
    They are paused: at most the one collection the allocations made pending runs, as the
    collector is re-enabled, and none if it was disabled to begin with."""
    args = (torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6))
    gm = fxviews.trace(many_views(40), *args)
    (gc.enable if enabled_before else gc.disable)()
    try:
        with collections_started() as starts:
            copied = copy_graph(gm.graph)
            assert gc.isenabled() is enabled_before
            work = torch.fx.GraphModule(gm, copied)  # code generation: torch's, not a pass
            during_copy, starts[:] = list(starts), []
            result = AsStridedToViews(recompile=False)(work)
            assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
    most = 1 if enabled_before else 0
    assert len(during_copy) <= most and len(starts) <= most, (during_copy, starts)
    assert result.modified and as_strided_nodes(work) == []


def test_rewrite_runs_without_cyclic_collections_code_generation_included() -> None:
    """The whole of ``fxviews.rewrite`` (copy, steps, dead code and FX's one code generation)
    runs with the collector paused: at most the collection pending at its end runs."""
    args = (torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6))
    gm = fxviews.trace(many_views(40), *args)
    with collections_started() as starts:
        result = fxviews.rewrite(gm)
    assert gc.isenabled()
    assert len(starts) <= 1, starts
    assert result.modified and as_strided_nodes(result.graph_module) == []
