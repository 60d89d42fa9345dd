"""Every kind of tensor eager runs, through ``transform``: a graph where a trace runs on it, eager
with a logged reason where none does (quantized, nested, sparse, oneDNN: Note [The layout of a
call] in ``fxviews/tracing/samples.py``), never an error of fxviews'. Passed in, and closed
over; called directly, under ``vmap`` and ``grad``, and through the backend, against eager
(:mod:`tests.parity`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import fxviews
from tests.parity import ROUTES, assert_routes_match

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Marked(torch.Tensor):
    """A plain Python subclass (no dispatch of its own): ops keep the class."""


def _inference() -> torch.Tensor:
    with torch.inference_mode():
        return torch.randn(3, 4)


def _quiet(make: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``make`` with PyTorch's beta-feature warnings (nested, sparse compressed) silenced."""

    def made() -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make()

    return made


#: Each kind: how to make one (3 x 4 where it has a shape), and whether a trace runs on it.
KINDS: dict[str, tuple[Callable[[], torch.Tensor], bool]] = {
    "quantized": (
        lambda: torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 0, torch.quint8),
        False,
    ),
    "quantized per channel": (
        lambda: torch.quantize_per_channel(
            torch.randn(3, 4),
            torch.full((3,), 0.1),
            torch.zeros(3, dtype=torch.long),
            0,
            torch.qint8,
        ),
        False,
    ),
    "nested jagged": (
        _quiet(
            lambda: torch.nested.nested_tensor(
                [torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged
            )
        ),
        False,
    ),
    "nested strided": (
        _quiet(lambda: torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])),
        False,
    ),
    "sparse coo": (lambda: torch.randn(3, 4).to_sparse(), False),
    "sparse csr": (_quiet(lambda: torch.randn(3, 4).to_sparse_csr()), False),
    "sparse csc": (_quiet(lambda: torch.randn(3, 4).to_sparse_csc()), False),
    "sparse bsr": (_quiet(lambda: torch.randn(4, 4).to_sparse_bsr((2, 2))), False),
    "oneDNN": (lambda: torch.randn(3, 4).to_mkldnn(), False),
    "meta": (lambda: torch.empty(3, 4, device="meta"), True),
    "inference mode": (_inference, True),
    "subclass": (lambda: torch.randn(3, 4).as_subclass(Marked), True),
    "wrapper subclass": (lambda: TwoTensor(torch.randn(3, 4), torch.randn(3, 4)), True),
    "complex": (lambda: torch.randn(3, 4, dtype=torch.cfloat), True),
    "conjugate view": (lambda: torch.randn(3, 4, dtype=torch.cfloat).conj(), False),
    "zero size": (lambda: torch.randn(0, 4), True),
    "0-dim": (lambda: torch.tensor(2.0), True),
    "bool": (lambda: torch.randn(3, 4) > 0, True),
    "uint16": (lambda: torch.arange(12).view(3, 4).to(torch.uint16), True),
    "float8": (lambda: torch.randn(3, 4).to(torch.float8_e4m3fn), True),
    "expanded": (lambda: torch.randn(1, 4).expand(3, 4), True),
    "channels last": (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), True),
    "requires grad": (lambda: torch.randn(3, 4, requires_grad=True), True),
    "parameter": (lambda: torch.nn.Parameter(torch.randn(3, 4)), True),
}

FUNCTIONS: dict[str, Callable[[torch.Tensor], Any]] = {
    "mul": lambda x: x * 2,
    "transpose and select": lambda x: x.t()[0] if x.dim() == 2 else x,
    "sum": lambda x: x.sum(),
}


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_tensor_kinds_passed_in_are_eagers(kind, function, caplog):
    make, traced = KINDS[kind]
    fn = FUNCTIONS[function]
    routes = ROUTES if function == "mul" else ("direct", "vmap", "grad")
    with caplog.at_level(logging.ERROR, logger="fxviews"):
        assert_routes_match(fn, [make()], routes)
    tf = fxviews.transform(fn)
    try:
        tf(make())
    except Exception:  # noqa: BLE001 - eager's own error, which the routes compared
        return
    assert tf.cache_info().eager == (0 if traced else 1)


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_kinds_closed_over_are_eagers(kind, caplog):
    held = KINDS[kind][0]()

    def fn(x):
        return x * 2 + (held.sum() if held.layout == torch.strided else 0).to(x.dtype)

    with caplog.at_level(logging.ERROR, logger="fxviews"):
        assert_routes_match(fn, [torch.randn(3, 4)], ("direct", "vmap", "grad"))


#: Kinds ``fn`` makes itself from a dense argument, returned or used.
MADE_INSIDE: dict[str, Callable[[torch.Tensor], Any]] = {
    "sparse returned": lambda x: x.to_sparse(),
    "sparse used": lambda x: torch.sparse.mm(x.to_sparse(), x.t()),
    "nested strided returned": lambda x: torch.nested.nested_tensor([x, x]),
    "nested strided used": lambda x: torch.nested.nested_tensor([x, x[:2]]).unbind()[1] * 2,
    "nested jagged returned": lambda x: (
        torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged) * 2
    ),
    "nested jagged padded": lambda x: (
        torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged).to_padded_tensor(0.0).sum(0)
    ),
    "quantized returned": lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
    "quantized used": lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8).dequantize(),
    "oneDNN used": lambda x: x.to_mkldnn().to_dense() * 2,
}


@pytest.mark.parametrize("name", MADE_INSIDE)
def test_tensor_kinds_made_inside_are_eagers(name, caplog):
    """A nested tensor fn makes runs it eagerly (a trace of one came back holding the trace's
    fake offsets, and under grad gave zeros where eager raises); the others get a graph."""
    with caplog.at_level(logging.ERROR, logger="fxviews"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's beta warnings for nested and sparse
        assert_routes_match(MADE_INSIDE[name], [torch.randn(3, 4)], ("direct", "vmap", "grad"))


def test_a_kind_no_trace_runs_on_says_why(caplog):
    sparse = torch.randn(3, 4).to_sparse()
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        fxviews.transform(lambda x: x * 2)(sparse)
    (message,) = {r.getMessage() for r in caplog.records}
    assert "a sparse tensor (torch.sparse_coo) argument" in message and "eagerly" in message
    with pytest.raises(fxviews.TracingError) as err:
        fxviews.transform(lambda x: x * 2, strict=True)(sparse)
    assert err.value.cause == "tensor kind"
