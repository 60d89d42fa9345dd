"""The emitted views' fake values: built without a FakeTensorMode dispatch, equal to one.

The engine fills ``meta["val"]`` of the view nodes it emits by running the view op's own kernel
on the input's fake storage (``fake_view_value``). Each check here compares that value with
what the FakeTensorMode dispatch of the same op returns (the independent reference): sizes,
strides, offset, dtype, device, requires_grad, storage identity and fake mode.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch

import fxviews
from fxviews.passes import AsStridedToViews
from fxviews.passes.chains.emission import fake_view_value
from fxviews.passes.compat.torch_internals import FakeTensorMode, make_fx, pytree, storage_identity
from fxviews.passes.op_tables import LAYOUT_VIEWS
from fxviews.passes.schema import MADE_FOR
from tests.test_engine_differential import CASE_IDS, prepared

aten = torch.ops.aten

#: Arguments for every layout view, applied to a 4x6 tensor at offset 3 with strides (7, 1).
VIEW_ARGS = {
    aten.alias.default: (),
    aten.detach.default: (),
    aten.select.int: (1, -2),
    aten.slice.Tensor: (1, 1, 5, 2),
    aten.narrow.default: (0, 1, 2),
    aten.diagonal.default: (0, 1, 0),
    aten.unfold.default: (1, 2, 2),
    aten.expand.default: ([3, 4, 6],),
    aten.permute.default: ([1, 0],),
    aten.t.default: (),
    aten.transpose.int: (0, 1),
    aten.swapdims.default: (0, 1),
    aten.swapaxes.default: (0, 1),
    aten.movedim.int: (0, 1),
    aten.movedim.intlist: ([0], [1]),
    aten.squeeze.default: (),
    aten.squeeze.dim: (0,),
    aten.squeeze.dims: ([0],),
    aten.unsqueeze.default: (1,),
    aten.view.default: ([4, 2, 3],),
    aten.split.Tensor: (2, 1),
    aten.split_with_sizes.default: ([1, 3], 0),
    aten.tensor_split.sections: (3, 1),
    aten.tensor_split.indices: ([1, 4], 1),
    aten.chunk.default: (2, 1),
    aten.unbind.int: (0,),
}


def assert_same_fake(actual: object, expected: object, where: str) -> None:
    """Every property a later pass or compiler reads of a node's fake value is equal."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_fake(a, e, f"{where}[{i}]")
        return
    assert type(actual) is type(expected), where
    got = (actual.shape, actual.stride(), actual.storage_offset(), actual.dtype, actual.device)
    want = (expected.shape, expected.stride(), expected.storage_offset(), expected.dtype,
            expected.device)  # fmt: skip
    assert got == want, where
    assert actual.requires_grad == expected.requires_grad, where
    assert storage_identity(actual) == storage_identity(expected), where
    assert getattr(actual, "fake_mode", None) is getattr(expected, "fake_mode", None), where


def base_in(
    mode: FakeTensorMode, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> torch.Tensor:
    with mode:
        return torch.empty(40, dtype=dtype, device=device).as_strided((4, 6), (7, 1), 3)


def test_every_layout_view_has_arguments_here() -> None:
    assert set(VIEW_ARGS) == LAYOUT_VIEWS - {operator.getitem}


@pytest.mark.parametrize("op", sorted(VIEW_ARGS, key=str), ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64], ids=str)
def test_fake_view_value_equals_the_dispatched_value(op, dtype) -> None:
    mode = FakeTensorMode()
    mode.cache_enabled = False
    x = base_in(mode, dtype)
    args = VIEW_ARGS[op]
    assert_same_fake(fake_view_value(op, x, *args), op(x, *args), str(op))


@pytest.mark.parametrize("op", sorted(VIEW_ARGS, key=str), ids=str)
def test_fake_view_value_of_a_fake_cuda_tensor(op) -> None:
    """A graph traced on fake CUDA tensors, rewritten on any build (a CPU-only one too, whose
    CUDA backend has no kernels): the dispatched value, device included."""
    mode = FakeTensorMode()
    mode.cache_enabled = False
    x = base_in(mode, device="cuda")
    args = VIEW_ARGS[op]
    assert_same_fake(fake_view_value(op, x, *args), op(x, *args), str(op))


@pytest.mark.parametrize(
    "shape", [[4, 2, 3], [24], [-1], [2, 2, 6]], ids=["split", "flat", "inferred", "regroup"]
)
def test_reshape_takes_the_view_value_where_the_layout_admits_it(shape) -> None:
    """Rows 7 apart: splitting a dim is a view; flattening the rows together is not, and is
    left to the dispatch (reshape copies there)."""
    mode = FakeTensorMode()
    mode.cache_enabled = False
    x = base_in(mode)
    value = fake_view_value(aten.reshape.default, x, shape)
    if shape in ([4, 2, 3], [2, 2, 6]):
        assert_same_fake(value, aten.reshape.default(x, shape), "reshape")
    else:
        assert value is None
    contiguous = base_in(mode).contiguous()
    assert_same_fake(
        fake_view_value(aten.reshape.default, contiguous, shape),
        aten.reshape.default(contiguous, shape),
        "reshape of a contiguous tensor",
    )


def test_values_the_dispatch_must_compute_are_left_to_it() -> None:
    mode = FakeTensorMode()
    x = base_in(mode)
    with mode:
        trained = torch.empty(4, 6, requires_grad=True)
    # The dispatch gives a view of a tensor that requires grad a grad_fn: not a wrapped leaf.
    assert fake_view_value(aten.select.int, trained, 0, 1) is None
    assert fake_view_value(aten.select.int, torch.empty(4, 6), 0, 1) is None  # a real tensor
    assert fake_view_value(aten.clone.default, x) is None  # not a layout view
    assert fake_view_value(operator.getitem, [x], 0) is None


def test_symbolic_geometry_is_left_to_the_dispatch() -> None:
    def f(x):
        return x[0]

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 6))
    x = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    assert not isinstance(x.shape[0], int)
    assert fake_view_value(aten.select.int, x, 0, 0) is None


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_emitted_nodes_carry_the_dispatched_value(case_id: str) -> None:
    """On the differential corpus, each node the engine made holds what dispatch computes.

    The engine alone: later steps (pinning) may give a made node a new input afterwards.
    """
    gm = copy.deepcopy(prepared(case_id).gm)
    AsStridedToViews(recompile=False)(gm)
    graph = gm.graph
    made = [n for n in graph.nodes if MADE_FOR in n.meta and n.op == "call_function"]
    assert made, "the engine made no node: the case no longer tests emitted metadata"
    for node in made:
        vals, kwvals = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        expected = node.target(*vals, **kwvals)
        assert_same_fake(node.meta["val"], expected, node.format_node())


def test_transformed_values_match_eager_on_a_view_dense_graph() -> None:
    """End to end: a graph where most views' metadata comes from the fast path is still right."""

    def body(x, y):
        base = x.clone()
        views = [base[i % 4] for i in range(8)] + [base.t()[1], base.diagonal()]
        base.copy_(y)
        return [v * 2 for v in views]

    def fn(x, y, yt):
        return torch.func.jvp(lambda y: body(x, y), (y,), (yt,))

    batched = [torch.randn(3, 4, 4).transpose(0, 1) for _ in range(3)]  # batch dim 1
    actual = pytree.tree_leaves(torch.func.vmap(fxviews.transform(fn), in_dims=1)(*batched))
    for i in range(3):
        expected = pytree.tree_leaves(fn(*(t[:, i] for t in batched)))
        for got, want in zip(actual, expected, strict=True):
            torch.testing.assert_close(got[i], want)
