"""Kept nodes and inner compilers that lay memory out their own way: eager's numbers or errors.

Layout truth keeps an as_strided whose input's fake layout is not eager's; Inductor would read
it in its own layout. The backend proves such a node against the layout eager produces instead
(and pins dynamic sizes to do so). An as_strided that reads past its input's storage raises as
eager's does, where Inductor would read stray memory. Each test asserts what plain Inductor does
too, so it fails without the backend's handling.
"""

from __future__ import annotations

import logging

import pytest
import torch

import fxviews
from fxviews.passes.compat.torch_internals import BackendCompilerFailed

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def copysign_rows(a, b):
    """copysign keeps a transposed ``a``'s layout in eager; its fake kernel says contiguous."""
    return torch.copysign(a, b - 1.5).as_strided((a.shape[0], a.shape[1]), (a.shape[1], 1))


def rolled_rows(x):
    """pytorch #174963: roll keeps channels_last in eager; its fake kernel says contiguous."""
    return torch.roll(x, shifts=-1, dims=0).as_strided((5, 10), (4, 1), 0)


def _copysign_args(n=5):
    generator = torch.Generator().manual_seed(n)
    return torch.rand(n + 1, n, generator=generator).mT, torch.rand(
        n, n + 1, generator=generator
    ) + 1


def test_inductor_alone_reads_the_fake_layout():
    a, b = _copysign_args()
    assert not torch.allclose(torch.compile(copysign_rows)(a, b), copysign_rows(a, b))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_node_kept_for_its_fake_layout_is_proven_against_eagers(dynamic, caplog):
    caplog.set_level(logging.DEBUG, logger="fxviews")
    compiled = torch.compile(
        copysign_rows, backend="fxviews", options={"inner": "inductor"}, dynamic=dynamic
    )
    for n in (5, 7):  # with dynamic shapes the sizes are pinned to each call's: a recompile
        a, b = _copysign_args(n)
        torch.testing.assert_close(compiled(a, b), copysign_rows(a, b))
    proofs = [
        r.getMessage()
        for r in caplog.records
        if "proven against the layout eager" in r.getMessage()
    ]
    assert proofs and "copysign" in proofs[0]


@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_the_roll_example_with_either_inner_compiler(inner):
    x = torch.arange(100.0).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)
    compiled = torch.compile(rolled_rows, backend="fxviews", options={"inner": inner})
    torch.testing.assert_close(compiled(x), rolled_rows(x))


def past_made_storage(x):
    """pytorch #195665: a view of 4480 elements of a 2-element tensor the function makes."""
    small = torch.full([1, 2], 1.0)
    return torch.cumsum(torch.as_strided(small, size=[64, 64, 3], stride=[1, 64, 192]), 1) + x


def past_input_storage(x):
    return x.as_strided((4,), (2,)) * 1


@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_reads_past_storage_raise_as_eager(inner):
    x = torch.randn(1)
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        past_made_storage(x)
    compiled = torch.compile(past_made_storage, backend="fxviews", options={"inner": inner})
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        compiled(x)
    compiled = torch.compile(past_input_storage, backend="fxviews", options={"inner": inner})
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        compiled(torch.randn(5))
    # A view of a larger tensor: the same request reads inside its storage, as in eager.
    big = torch.randn(10)
    torch.testing.assert_close(compiled(big[:5]), past_input_storage(big[:5]))


def test_inductor_alone_reads_past_storage():
    """What the previous test guards against: plain Inductor returns stray memory."""
    out = torch.compile(past_input_storage)(torch.randn(5))
    assert out.shape == (4,)


def test_strict_refuses_a_graph_that_reads_past_its_storage():
    compiled = torch.compile(past_made_storage, backend="fxviews", options={"strict": True})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(1))
    assert isinstance(info.value.inner_exception, fxviews.FxViewsError)


class SignedProjection(torch.nn.Module):
    """A layer returning ``copysign(weight.t(), x)`` transposed, as a model hands back a
    transposed view (pytorch #198364): eager keeps the transposed weight's layout, the fake
    kernel says contiguous, and Inductor lays the output out as the fake value says."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(6, 5))

    def forward(self, x):
        return torch.copysign(self.weight.mT, x - 1.5).t()


def _signed_projection_case():
    torch.manual_seed(0)
    return SignedProjection(), torch.rand(5, 6) + 1


def test_outputs_have_eagers_layout_with_inner_inductor():
    model, x = _signed_projection_case()
    expected = model(x)
    with torch.no_grad():
        inductor = torch.compile(model)(x)
        torch._dynamo.reset()
        fx_inductor = torch.compile(model, backend="fxviews", options={"inner": "inductor"})(x)
    assert inductor.stride() != expected.stride()  # Inductor alone: the fake layout
    assert fx_inductor.stride() == expected.stride()
    torch.testing.assert_close(fx_inductor, expected)
    torch.testing.assert_close(fx_inductor, inductor)


def test_outputs_have_eagers_layout_for_an_inner_callable():
    """The inner compiler gets the output's memory in eager's layout (an ``empty_strided`` the
    root's values are copied into), trained too; the default inner compiler, which runs eager
    kernels, gets the graph as it is."""
    model, x = _signed_projection_case()
    graphs = []
    record = lambda gm, example_inputs: graphs.append(gm) or gm.forward  # noqa: E731
    out = torch.compile(model, backend=fxviews.backend(inner=record))(x)
    out.square().sum().backward()
    grad, model.weight.grad = model.weight.grad, None
    expected = model(x)
    expected.square().sum().backward()
    assert out.stride() == expected.stride()
    torch.testing.assert_close((out, grad), (expected, model.weight.grad))
    assert len(graphs) == 2
    assert any(n.target is torch.ops.aten.empty_strided.default for n in graphs[0].graph.nodes)
    torch._dynamo.reset()
    graphs.clear()
    eager_inner = torch.compile(model, backend=fxviews.backend(inner="eager"))(x)
    assert eager_inner.stride() == expected.stride()
