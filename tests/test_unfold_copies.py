"""``copy_unfolds=True``: a model's own ``unfold`` written as verified copies (opt in).

Every rewritten program is run against eager PyTorch on inputs other than the example; where
the pass keeps an ``unfold``, its record says why. The runtimes that need this (TVM Relax,
LiteRT, ExecuTorch's ``to_edge``) run it in ``tests/test_runtimes.py`` and
``tests/test_executorch.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import fxviews
from fxviews.passes import RecordKind, UnfoldCopies
from fxviews.rewriting.printouts import format_summary
from tests.strided_programs import NhwcPatches, built, sample

aten = torch.ops.aten


class Unfold(torch.nn.Module):
    """``unfold`` of a transposed input: windows of ``size``, ``step`` apart, along dim 0."""

    def __init__(self, size: int, step: int) -> None:
        super().__init__()
        self.size, self.step = size, step

    def forward(self, x):
        return x.t().unfold(0, self.size, self.step) * 2


def _targets(ep: torch.export.ExportedProgram) -> set[object]:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def _copied(module: torch.nn.Module, shapes, **export_options) -> fxviews.RewriteResult:
    ep = torch.export.export(module, sample(shapes, 0), **export_options)
    return fxviews.rewrite(ep, opset="core_aten", copy_unfolds=True)


def _assert_runs_like_eager(res, module: torch.nn.Module, shapes) -> None:
    for seed in (1, 2):
        args = sample(shapes, seed)
        torch.testing.assert_close(res.exported_program.module()(*args), module(*args))


@pytest.mark.parametrize(
    ("size", "step", "ops"),
    [
        (4, 2, {aten.cat.default}),  # overlapping: two blocks of 2 per window, joined by cat
        (3, 3, set()),  # side by side: slices and views only
        (17, 1, {aten.index_select.default}),  # 17 pieces of 1: one gather instead
    ],
)
def test_unfold_becomes_verified_copies(size, step, ops):
    module, shapes = Unfold(size, step), ((3, 20),)
    res = _copied(module, shapes)
    [record] = res.unfold_records
    assert (record.kind, record.method) == (RecordKind.UNFOLD, "copied"), record
    targets = _targets(res.exported_program)
    assert aten.unfold.default not in targets and ops <= targets, targets
    # The model's own ``t`` stays: core-ATen consumers decompose it themselves.
    emitted = targets - _targets(torch.export.export(module, sample(shapes, 0)))
    assert all(fxviews.passes.Opset.CORE_ATEN.has(t) for t in emitted), emitted
    _assert_runs_like_eager(res, module, shapes)


def test_patches_of_an_nhwc_image():
    module, shapes = built(NhwcPatches), ((1, 3, 8, 8),)
    res = _copied(module, shapes)
    assert [r.method for r in res.unfold_records] == ["copied", "copied"]
    assert "unfold 2 rewritten (copied 2), 0 kept" in format_summary(res)
    assert aten.unfold.default not in _targets(res.exported_program)
    _assert_runs_like_eager(res, module, shapes)


def test_without_the_option_the_unfold_stays():
    module = Unfold(4, 2)
    ep = torch.export.export(module, sample(((3, 20),), 0))
    res = fxviews.rewrite(ep, opset="core_aten")
    assert res.unfold_records == [] and aten.unfold.default in _targets(res.exported_program)


def test_asked_of_an_opset_with_unfold_is_refused():
    ep = torch.export.export(Unfold(4, 2), sample(((3, 20),), 0))
    with pytest.raises(ValueError, match="copy_unfolds=True is for an opset without unfold"):
        fxviews.rewrite(ep, copy_unfolds=True)


def test_dynamic_sizes_keep_the_unfold():
    res = _copied(Unfold(4, 2), ((3, 20),), dynamic_shapes=({1: Dim("n", min=8, max=64)},))
    [record] = res.unfold_records
    assert record.method == "kept" and "static sizes only" in record.reason


def _written_then_unfolded(x):
    y = x.clone()
    y.add_(1)  # make_fx keeps the in-place write: a copy could be told from the view
    return y.unfold(0, 4, 2)


def _unfolded_then_strided(x):
    return x.unfold(0, 4, 2).as_strided((2, 2), (1, 1))


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (_written_then_unfolded, "writes tensors in place ('add_')"),
        (_unfolded_then_strided, "a later as_strided reads its memory"),
    ],
)
def test_an_unfold_a_copy_could_be_told_from_is_kept(fn, reason):
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(10))
    result = UnfoldCopies()(gm)
    [record] = result.records
    assert record.method == "kept" and reason in record.reason, record
    assert not result.modified
