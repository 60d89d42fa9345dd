"""The core-ATen opset: chains edge compilers accept, windows by copies, verified by their reads.

Needs no ExecuTorch: ``tests/test_executorch.py`` runs the programs on it. Here every claim is
checked against eager PyTorch (``unfold``, ``as_strided``) on real tensors.
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxviews
from fxviews.passes.chains.chain import ViewStep, apply_chain, eager
from fxviews.passes.chains.copied_windows import MAX_PIECES, WindowsByCopies
from fxviews.passes.chains.opsets import Opset, chain_in_opset
from fxviews.passes.chains.verification import verify_chain_reads
from fxviews.passes.compat.torch_internals import FakeTensorMode
from fxviews.passes.geometry.concrete import Geometry
from fxviews.passes.rewrites.as_strided_to_views import engine_made_nodes

aten = torch.ops.aten

# (input sizes, dim, size, step): blocks of gcd(size, step), a last dim, a gathered form.
WINDOWS = [
    ((8,), 0, 4, 2),
    ((3, 10, 2), 1, 3, 2),
    ((5, 7), 1, 7, 1),
    ((2, 9), 1, 2, 3),
    ((4, 6), 0, 2, 2),
    ((3, 30, 2), 1, MAX_PIECES + 4, 1),
    ((40,), 0, MAX_PIECES + 1, 3),
]


@pytest.mark.parametrize("sizes, dim, size, step", WINDOWS)
def test_windows_by_copies_equal_unfold(sizes, dim, size, step):
    x = torch.randn(sizes)
    windows = WindowsByCopies(aten.unfold.default, (dim, size, step), tuple(sizes))
    torch.testing.assert_close(windows.apply(x, eager), x.unfold(dim, size, step), rtol=0, atol=0)
    # and on a non-contiguous tensor of the same sizes: copies read values, not memory
    y = torch.randn(tuple(reversed(sizes))).permute(*reversed(range(len(sizes))))
    torch.testing.assert_close(windows.apply(y, eager), y.unfold(dim, size, step), rtol=0, atol=0)


@pytest.mark.parametrize("then", [(0, 2, 1), (2, 0, 1)])
def test_windows_fold_the_next_permute(then):
    step = ViewStep(aten.unfold.default, (1, 3, 1))
    chain = (step, ViewStep(aten.permute.default, (list(then),)))
    source = Geometry((2, 5), (5, 1), 0)
    written = chain_in_opset(chain, source, Opset.CORE_ATEN, static=True)
    assert written is not None and len(written) == 1
    x = torch.randn(2, 5)
    torch.testing.assert_close(apply_chain(written, x), x.unfold(1, 3, 1).permute(*then))


def test_verification_by_reads_accepts_exact_and_refuses_others():
    source, target = Geometry((8,), (1,), 0), Geometry((3, 4), (2, 1), 0)
    windows = WindowsByCopies(aten.unfold.default, (0, 4, 2), (8,))
    assert verify_chain_reads((windows,), source, target)
    longer = Geometry((9,), (1,), 0)
    from_one = WindowsByCopies(aten.unfold.default, (0, 4, 2), (9,))
    assert verify_chain_reads((from_one,), longer, target)
    assert not verify_chain_reads((from_one,), longer, Geometry((3, 4), (2, 1), 1))
    # a value-changing op is no move, even where the numbers would happen to agree
    doubled = (windows, ViewStep(aten.mul.Tensor, (1,)))
    assert not verify_chain_reads(doubled, source, target)


def _windows_of_transposed(x):
    return x.t().as_strided((6, 3), (1, 1)) * 2


def _core_rewrite(fn, *args, **options):
    gm = make_fx(fn)(*args)
    return fxviews.rewrite(gm, opset="core_aten", **options)


def test_core_aten_rewrite_emits_core_ops_only_and_reads_right():
    x = torch.randn(8, 4)
    res = _core_rewrite(_windows_of_transposed, x)
    assert [r.method for r in res.records] == ["synthesized"]
    made = engine_made_nodes(res.graph_module.graph)
    targets = [n.target for n in res.graph_module.graph.nodes if n.name in made]
    outside = [t for t in targets if t is not operator.getitem and torch.Tag.core not in t.tags]
    assert not outside, outside
    assert aten.cat.default in targets and aten.unfold.default not in targets
    y = torch.randn(8, 4)
    torch.testing.assert_close(res.graph_module(y), _windows_of_transposed(y))


def test_long_windows_are_gathered():
    x = torch.randn(40)

    def windows(x):
        return x.as_strided((24, MAX_PIECES + 1), (1, 1)) + 0

    res = _core_rewrite(windows, x)
    targets = {n.target for n in res.graph_module.graph.nodes}
    assert aten.index_select.default in targets and aten.cat.default not in targets
    torch.testing.assert_close(res.graph_module(x), windows(x))


def test_gathered_windows_index_on_the_input_device():
    """The indices a gather reads are made where its input lives, not on the default device:
    here a graph traced on a fake CUDA input (any build makes one), exported for a GPU."""
    with FakeTensorMode():
        x = torch.empty(40, device="cuda")

    def windows(x):
        return x.as_strided((24, MAX_PIECES + 1), (1, 1)) + 0

    res = _core_rewrite(windows, x)
    indices = [n for n in res.graph_module.graph.nodes if n.target is aten.arange.start_step]
    assert len(indices) == 2 and all(n.kwargs["device"] == x.device for n in indices), indices
    gathered = next(
        n for n in res.graph_module.graph.nodes if n.target is aten.index_select.default
    )
    assert gathered.meta["val"].device == x.device


def test_select_and_strided_slice_become_delegable_views():
    def pick(x):  # a row, then every other element of it
        return x.as_strided((3,), (2,), 5) + 0

    x = torch.randn(2, 6)
    res = _core_rewrite(pick, x)
    targets = {n.target for n in res.graph_module.graph.nodes if n.op == "call_function"}
    assert aten.select.int not in targets
    assert all(
        len(n.args) < 5 or n.args[4] == 1
        for n in res.graph_module.graph.nodes
        if n.target is aten.slice.Tensor
    )
    torch.testing.assert_close(res.graph_module(x), pick(x))


def _windows_then_write(x):
    w = x.as_strided((6, 3), (1, 1))
    x.add_(1)  # a view sees the write, a copy would not
    return w * 1


def test_windows_are_not_copied_in_a_graph_that_writes_in_place():
    res = _core_rewrite(_windows_then_write, torch.randn(8))
    (record,) = res.records
    assert record.method == "kept"
    assert "core_aten opset" in record.reason and "in place" in record.reason


def test_copied_windows_that_an_as_strided_reads_are_kept():
    def nested(x):
        w = x.as_strided((6, 3), (1, 1))
        return w.as_strided((2, 2), (1, 1)) + 0

    res = _core_rewrite(nested, torch.randn(8))
    first = next(r for r in res.records if r.node == "as_strided")
    assert first.method == "kept" and "later as_strided" in first.reason


def test_layout_steps_are_refused_for_core_aten():
    gm = make_fx(_windows_of_transposed)(torch.randn(8, 4))
    with pytest.raises(ValueError, match="reshape_views=True emits ops outside"):
        fxviews.rewrite(gm, opset="core_aten", reshape_views=True)
    with pytest.raises(ValueError, match="opset must be one of 'aten', 'core_aten'"):
        fxviews.rewrite(gm, opset="edge")


def test_aten_opset_still_emits_unfold():
    res = fxviews.rewrite(make_fx(_windows_of_transposed)(torch.randn(8, 4)))
    assert aten.unfold.default in {n.target for n in res.graph_module.graph.nodes}
