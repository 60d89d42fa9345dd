"""Layouts read in Python under torch.compile (Note [Layouts read in Python]).

Dynamo answers ``y.stride()`` and ``y.is_contiguous()`` from ``y``'s fake value and compiles
the answer in as a constant. ``roll`` of a channels_last tensor is the case where the fake
kernel's layout is not eager's (contiguous against channels_last, on every supported release):
any compile, Dynamo's ``eager`` backend included, then computes other numbers than eager. With
``backend="fxviews"`` the compile raises, naming the read and the user's line; a read eager's
layout agrees with compiles and gives eager's numbers.
"""

from __future__ import annotations

import logging

import pytest
import torch

import fxviews
from fxviews.passes.compat.torch_internals import BackendCompilerFailed

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def scaled_by_a_stride(x):
    y = torch.roll(x, 1, 0)
    return y * y.stride(1)


def branching_on_contiguity(x):
    y = torch.roll(x, 1, 0)
    return y + 1 if y.is_contiguous() else y - 1


def sized_by_strides(x):
    y = torch.roll(x, 1, 0)
    strides = y.stride()
    return x.reshape(-1)[: strides[1]] * 2  # the read node itself is not an output


def scaled_by_an_agreeing_stride(x):
    y = x * 2  # elementwise kernels keep channels_last, fake and eager alike
    return y * y.stride(1) + x.transpose(0, 1).contiguous().stride(0)


LAYOUT_BOUND = [scaled_by_a_stride, branching_on_contiguity, sized_by_strides]


def channels_last(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 4, 5, generator=generator).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("fn", LAYOUT_BOUND, ids=lambda fn: fn.__name__)
def test_dynamo_alone_computes_with_the_fake_layout(fn):
    """What the backend guards against: any compile computes other numbers than eager."""
    x = channels_last()
    out = torch.compile(fn, backend="eager")(x)
    assert out.shape != fn(x).shape or not torch.allclose(out, fn(x))


@pytest.mark.parametrize("inner", ["eager", "inductor"])
@pytest.mark.parametrize("fn", LAYOUT_BOUND, ids=lambda fn: fn.__name__)
def test_a_layout_read_from_a_wrong_fake_layout_raises(fn, inner):
    compiled = torch.compile(fn, backend="fxviews", options={"inner": inner})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(channels_last())
    err = info.value.inner_exception
    assert isinstance(err, fxviews.FxViewsError)
    message = str(err)
    read = "is_contiguous()" if fn is branching_on_contiguity else "stride()"
    assert f"y.{read} at " in message and "test_backend_layout_reads.py" in message
    assert "roll" in message and "[60, 1, 15, 3]" in message  # eager's channels_last strides


@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_a_layout_read_eager_agrees_with_compiles_to_eagers_numbers(inner):
    compiled = torch.compile(
        scaled_by_an_agreeing_stride, backend="fxviews", options={"inner": inner}
    )
    for seed in (0, 1):
        x = channels_last(seed)
        torch.testing.assert_close(compiled(x), scaled_by_an_agreeing_stride(x))


def test_a_layout_read_on_a_contiguous_input_compiles():
    """roll of a contiguous tensor is contiguous in fake and eager alike: nothing to refuse."""
    x = torch.randn(2, 3, 4, 5)
    compiled = torch.compile(scaled_by_a_stride, backend="fxviews")
    torch.testing.assert_close(compiled(x), scaled_by_a_stride(x))


@torch.library.custom_op("fxviews_tests::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@doubled.register_fake
def _(x):
    return torch.empty_like(x)


def scaled_by_a_custom_ops_stride(x):
    y = doubled(x)
    return y * y.stride(1)


def test_a_layout_read_that_cannot_be_checked_compiles_and_says_so(caplog):
    caplog.set_level(logging.WARNING, logger="fxviews")
    x = channels_last()
    compiled = torch.compile(scaled_by_a_custom_ops_stride, backend="fxviews")
    torch.testing.assert_close(compiled(x), scaled_by_a_custom_ops_stride(x))
    warnings = [r.getMessage() for r in caplog.records if "cannot check" in r.getMessage()]
    assert warnings and "y.stride() at " in warnings[0] and "doubled" in warnings[0]
