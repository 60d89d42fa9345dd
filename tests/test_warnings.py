"""fxviews' own calls into PyTorch leave users no warnings about PyTorch's internals."""

from __future__ import annotations

import warnings

import pytest
import torch

import fxviews


def _window_of_first(xs: list[torch.Tensor]) -> torch.Tensor:
    return xs[0].t().as_strided((2, 3), (1, 2), 1) + xs[1].sum()


class Window(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t().as_strided((2, 3), (1, 2), 1)


def test_rewriting_a_graph_over_nested_inputs_warns_of_nothing():
    # Its calling convention holds pytree specs, which torch warns about when copied.
    gm = fxviews.trace(_window_of_first, [torch.randn(3, 4), torch.randn(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lax, strict = fxviews.rewrite(gm), fxviews.rewrite(gm, strict=True)
    assert [r.method for r in lax.records] == [r.method for r in strict.records] == ["synthesized"]


def test_rewriting_an_exported_program_warns_of_nothing():
    program = torch.export.export(Window(), (torch.randn(3, 4),))  # training dialect
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fxviews.rewrite(program)
    x = torch.randn(3, 4)
    torch.testing.assert_close(result.exported_program.module()(x), Window()(x))


def test_exporting_to_onnx_warns_of_nothing():
    pytest.importorskip("onnxscript")
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the pytree spec deprecation
        program = fxviews.export_onnx(Window(), (x,))
    assert program.model_proto.graph.node  # a model, not just no warning
