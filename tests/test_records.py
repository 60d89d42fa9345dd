"""Records: each pass returns them in its result, each carries the kind of node it is about."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fxviews
from fxviews.examples import push_jvp, seed_args
from fxviews.passes import (
    AsStridedToViews,
    LayoutPinning,
    Record,
    RecordedPassResult,
    RecordKind,
    ViewToReshape,
)
from fxviews.passes.compat.torch_internals import PassResult
from fxviews.rewriting.printouts import format_summary

aten = torch.ops.aten


def _written_then_read(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    base = x.clone()
    flat = base.view(-1)  # a merging view whose base is written afterwards: layout-bound
    base.mul_(y)
    return flat


def _targets(gm: torch.fx.GraphModule) -> dict[str, object]:
    return {n.name: n.target for n in gm.graph.nodes}


def test_each_pass_returns_records_of_its_kind_of_node():
    traced = fxviews.trace(push_jvp, *seed_args())
    as_strided = _targets(traced)
    result = AsStridedToViews()(traced)
    assert isinstance(result, RecordedPassResult) and result.records
    for record in result.records:
        assert record.kind is RecordKind.AS_STRIDED
        assert as_strided[record.node] is aten.as_strided.default

    viewed = fxviews.trace(
        lambda x: (x.clone().view(-1), torch.view_as_complex(x)), torch.randn(3, 2)
    )
    views = _targets(viewed)
    records = ViewToReshape()(viewed).records
    assert {views[r.node] for r in records} == {aten.view.default, aten.view_as_complex.default}
    assert {r.kind for r in records} == {RecordKind.VIEW}

    bound = fxviews.trace(_written_then_read, torch.randn(2, 3), torch.randn(2, 3))
    (record,) = LayoutPinning()(bound).records
    assert record.kind is RecordKind.LAYOUT_BOUND and record.method == "pinned"


def test_a_pass_keeps_no_records_between_calls():
    engine = AsStridedToViews()
    first = engine(fxviews.trace(push_jvp, *seed_args()))
    second = engine(fxviews.trace(lambda x: x.sin(), torch.randn(3)))
    assert len(first.records) == 1 and second.records == []
    assert not hasattr(engine, "records")


def test_the_result_is_a_pass_result():
    gm = fxviews.trace(push_jvp, *seed_args())
    result = AsStridedToViews()(gm)
    graph_module, modified = result  # unpacks as torch.fx's PassResult does
    assert isinstance(result, PassResult) and graph_module is gm and modified


def test_rewrite_sorts_records_by_kind():
    res = fxviews.rewrite(
        fxviews.trace(_written_then_read, torch.randn(2, 3), torch.randn(2, 3)),
        pin_layouts=True,
    )
    assert {r.kind for r in res.view_records} == {RecordKind.VIEW}
    assert {r.kind for r in res.pin_records} == {RecordKind.LAYOUT_BOUND}


def test_a_record_states_its_kind():
    with pytest.raises(TypeError):
        Record("n", "view(x, [6])", "", "kept", "why")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="RecordKind"):
        Record("n", "view(x, [6])", "", "kept", "why", kind="view")  # type: ignore[arg-type]


def test_the_summary_counts_by_kind_not_by_description():
    record = Record("n", "anything(x)", "", "kept", "why", kind=RecordKind.VIEW)

    @dataclasses.dataclass
    class Result:
        records: list[Record]
        view_records: list[Record]
        pin_records: list[Record]
        clone_records: list[Record]
        unfold_records: list[Record] = dataclasses.field(default_factory=list)
        modified: bool = False
        seconds: float = 0.0
        traced_with: str | None = None
        code_before: str = ""
        code_after: str = ""

    summary = format_summary(Result([], [record], [], []))
    assert summary == "fxviews: view 0 rewritten, 1 kept; in 0.0 ms"
