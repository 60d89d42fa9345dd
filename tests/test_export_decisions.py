"""``fxviews.rewrite`` of ``torch.export`` programs that decided view or copy on their example's
layout (Note [Layout decisions in exported programs]): made right where the program can decide
again when it runs, refused with the node and the user's line where it cannot.

Each made-right program validates, survives ``torch.export.save``/``load``, and on contiguous,
transposed, sliced, offset and channels_last inputs gives eager's values; a write through its
result afterwards reaches the caller's tensor exactly when eager's does.
"""

from __future__ import annotations

import io

import pytest
import torch

import fxviews
from fxviews.consumers.export.decisions import LayoutBoundProgram
from tests.layout_sweep import LAYOUTS


class Calls(torch.nn.Module):
    """``forward(x) = fn(x)``: a model of one layout-deciding call."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor):
        return self.fn(x)


def _written_intermediate(x: torch.Tensor) -> torch.Tensor:
    hidden = (x * 2).flatten()
    hidden.relu_()  # through its own buffer: nobody sees the other side
    return hidden


def _written_through(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    flat.mul_(2)  # eager writes into x only where the reshape is a view
    return x * 1


#: Returned aliasing the input on some layouts (put back), or deciding unobservably.
RIGHT = {
    "reshape": lambda x: x.reshape(-1),
    "flatten": lambda x: x.flatten(1),
    "reshape_as": lambda x: x.reshape_as(torch.empty(x.shape[0], x.numel() // x.shape[0])),
    "ravel": lambda x: x.ravel(),
    "permuted contiguous": lambda x: x.permute(3, 2, 1, 0).contiguous(),
    "reshape then sin": lambda x: x.reshape(-1).sin(),
    "written intermediate": _written_intermediate,
}


def _round_trip(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


def _example() -> torch.Tensor:
    return torch.randn(2, 3, 4, 5)


@pytest.mark.parametrize("lowered", [False, True], ids=["training IR", "lowered"])
@pytest.mark.parametrize("name", list(RIGHT))
def test_a_decision_is_put_back_and_matches_eager_on_every_layout(name: str, lowered: bool) -> None:
    fn = RIGHT[name]
    program = torch.export.export(Calls(fn), (_example(),))
    if lowered:
        program = program.run_decompositions()
    result = fxviews.rewrite(program)
    rewritten = _round_trip(result.exported_program)
    rewritten.validate()
    for layout, make in LAYOUTS.items():
        base = _example()
        mine, theirs = make(base), make(base)
        got, want = rewritten.module()(mine), fn(theirs)
        torch.testing.assert_close(got, want, msg=f"{name} on {layout}")
        got.mul_(3)  # through the result: reaches the argument exactly where eager's does
        want.mul_(3)
        torch.testing.assert_close(mine, theirs, msg=f"{name} on {layout}: the argument")


def test_the_put_back_decision_is_recorded() -> None:
    program = torch.export.export(Calls(RIGHT["reshape"]), (_example(),))
    [record] = [r for r in fxviews.rewrite(program).view_records if r.method == "runtime"]
    assert record.after == "reshape(x, [120])" and record.before == "view(x, [-1])"
    assert "test_export_decisions.py" in (record.source or "")


@pytest.mark.parametrize("lowered", [False, True], ids=["training IR", "lowered"])
def test_a_write_through_a_decision_is_refused_naming_the_node(lowered: bool) -> None:
    program = torch.export.export(Calls(_written_through), (_example(),))
    if lowered:
        program = program.run_decompositions()
    with pytest.raises(LayoutBoundProgram, match="decides view or copy") as caught:
        fxviews.rewrite(program)
    assert "test_export_decisions.py" in str(caught.value)
    assert isinstance(caught.value, fxviews.FxViewsError)
    # Why: lowered on a transposed example (a copy there), the program leaves a contiguous
    # input alone where eager's reshape views it and writes into it.
    example = LAYOUTS["transposed"](_example())
    lowered_on_copy = torch.export.export(Calls(_written_through), (example,)).run_decompositions()
    mine = _example()
    theirs = mine.clone()
    lowered_on_copy.module()(mine)
    _written_through(theirs)
    assert not torch.equal(mine, theirs)


def test_an_edge_program_keeps_its_decisions() -> None:
    """Core ATen programs go to runtimes of one layout, and have no reshape to put back."""
    program = torch.export.export(Calls(_written_through), (_example(),))
    result = fxviews.rewrite(program, opset="core_aten")
    targets = {n.target for n in result.exported_program.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.reshape.default not in targets
