"""Modules the export and ONNX tests share: each hides or writes an ``as_strided``.

Each :class:`Case` names a module factory, the per-sample input shapes, how many as_strided-family
nodes fxviews keeps in its decomposed program, and the error vmap raises at some batch positions
if any. Both are measured facts of the engine, checked by the tests, so a change either way
shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from fxviews.examples import push_jvp
from fxviews.passes.compat.torch_internals import TORCH_RELEASE

#: torch.export traces a program that calls ``torch.func.jvp`` from torch 2.13 on
#: (pytorch/pytorch#179686); on 2.11 and 2.12 export itself fails ("Expected FakeTensor, got
#: <class 'torch.Tensor'>") before fxviews sees a program.
EXPORTS_JVP = TORCH_RELEASE >= (2, 13)
needs_jvp_export = pytest.mark.skipif(
    not EXPORTS_JVP,
    reason="torch.export cannot trace torch.func.jvp before torch 2.13 (pytorch/pytorch#179686)",
)


class JvpModule(torch.nn.Module):
    """The README's push_jvp example: forward AD over an in-place write to a viewed base."""

    def forward(self, x, y, yt):
        return push_jvp(x, y, yt)


class TransposedWindow(torch.nn.Module):
    """A user window on a transposed input (ONNX's lowering reads it as if contiguous)."""

    def forward(self, x):
        return x.t().as_strided((2, 3), (1, 2), 1)


class ScaledTransposedWindow(torch.nn.Module):
    """A window covering all of a transposed intermediate."""

    def forward(self, x):
        return (x * 2).t().as_strided((3, 4), (1, 3))


class SlicedWindow(torch.nn.Module):
    """A window on a column slice: storage offset 1, row stride 4."""

    def forward(self, x):
        return x[:, 1:].as_strided((3, 2), (4, 1), 1)


class OverlappingWindows(torch.nn.Module):
    """Overlapping windows of 3 over a contiguous intermediate."""

    def forward(self, x):
        return (x + 1).as_strided((6, 3), (1, 1))


class Stateful(torch.nn.Module):
    """A parameter, a buffer mutated in place, and a window on a transposed product."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=gen, dtype=torch.float64))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls.add_(1)
        return (x * self.weight.to(x.dtype)).t().as_strided((3, 2), (1, 3), 3)


class BackwardScatter(torch.nn.Module):
    """AsStridedBackward's pattern written out: zeros, the view's region filled, the base back."""

    def forward(self, grad):
        flat = grad.new_zeros(12)
        flat.as_strided((3, 2), (4, 1), 1).copy_(grad)
        return flat.as_strided((3, 4), (4, 1), 0)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], torch.nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    kept: int = 0
    #: vmap's error at some batch positions, where no view chain exists on a batched layout.
    vmap_error: str = ""

    @property
    def exports(self) -> bool:
        """Whether torch.export can trace the module on this torch release."""
        return self.make is not JvpModule or EXPORTS_JVP


CASES = [
    Case("jvp", JvpModule, ((2, 6), (2, 6), (2, 6))),
    # The window crosses a row: the chain flattens, and the output aliases the input, so the
    # flatten stays a view, which vmap refuses when the batch dim sits inside.
    Case("transposed_window", TransposedWindow, ((4, 2),), vmap_error="view size is not"),
    Case("scaled_transposed_window", ScaledTransposedWindow, ((4, 3),)),
    Case("sliced_window", SlicedWindow, ((3, 4),)),
    Case("overlapping_windows", OverlappingWindows, ((8,),)),
    Case("stateful", Stateful, ((4, 3),)),
    # The functionalized scatter (as_strided_scatter of an unfold region) has no exact scatter
    # form in the engine: kept.
    Case(
        "backward_scatter",
        BackwardScatter,
        ((3, 2),),
        kept=1,
        vmap_error="as_strided_scatter requires special handling",
    ),
]

#: CASES as pytest parameters, each named, the ones this release cannot export skipped.
CASE_PARAMS = [
    pytest.param(case, id=case.name, marks=() if case.exports else needs_jvp_export)
    for case in CASES
]

#: The three cases where ONNX's as_strided lowering is wrong or fails.
ONNX_WRONG = ["transposed_window", "scaled_transposed_window", "sliced_window"]
