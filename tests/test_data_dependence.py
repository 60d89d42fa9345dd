"""Data dependence decided precisely: only what one graph cannot capture runs eagerly.

Integer indexing (Swin's relative-position-bias lookup), gathers and ``.item()`` numbers used
only as tensor values are one graph for every value: ``transform`` traces them (fake mode) and
``vmap`` of the result equals the program run eagerly one sample at a time, at batch dims 0, 1
and last. A value that reaches Python control flow or a size cannot be one graph: that
signature runs eagerly, with the warning.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, jvp, vmap

import fxviews
from fxviews.passes.schema import TRACED_WITH
from fxviews.tracing.scalar_values import keep_item_values_as_tensors
from tests.reference import (
    assert_tree_close,
    assert_vmap_matches_per_sample,
    make_samples,
    per_sample_reference,
    stack_batched,
)

WINDOW, HEADS, DIM = 3, 2, 8
TOKENS = WINDOW * WINDOW


class WindowAttention(nn.Module):
    """Swin's pre-norm window attention: a learned bias table read through an integer index
    buffer (under jvp, LayerNorm once sent this to a real-mode trace, which refused the
    lookup's ``aten.index.Tensor``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.bias_table = nn.Parameter(torch.randn((2 * WINDOW - 1) ** 2, HEADS))
        coords = torch.stack(
            torch.meshgrid(torch.arange(WINDOW), torch.arange(WINDOW), indexing="ij")
        ).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + WINDOW - 1
        self.register_buffer("index", relative[..., 0] * (2 * WINDOW - 1) + relative[..., 1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).view(TOKENS, 3, HEADS, -1).permute(1, 2, 0, 3)
        bias = self.bias_table[self.index.view(-1)].view(TOKENS, TOKENS, HEADS)
        scores = q @ k.transpose(-2, -1) + bias.permute(2, 0, 1)
        return (scores.softmax(-1) @ v).transpose(0, 1).reshape(TOKENS, DIM)


ATTENTION = WindowAttention()
GATHER_INDEX = torch.tensor([[2, 0], [1, 1], [0, 2]])


def window_attention(x, t):
    return ATTENTION(x) * t


def window_attention_jvp(x, t):
    return jvp(ATTENTION, (x,), (t,))


def gathers(x, t):
    return torch.gather(x[:3, :3], 1, GATHER_INDEX) * t[:3, :2]


def normalized_by_item(x, t):
    return x / x.abs().max().item() + t * x.sum().item()


def jvp_normalized_by_item(x, t):
    return jvp(lambda y: F.gelu(y / y.abs().max().item()), (x,), (t,))


def grad_normalized_by_item(x, t):
    return grad(lambda y: (y / y.abs().max().item() * t).sum())(x)


TRACED = [
    window_attention,
    window_attention_jvp,
    gathers,
    normalized_by_item,
    jvp_normalized_by_item,
    grad_normalized_by_item,
]


@pytest.mark.parametrize("fn", TRACED, ids=lambda fn: fn.__name__)
def test_value_reads_that_shape_nothing_are_traced_and_right_under_vmap(fn):
    samples = make_samples([(TOKENS, DIM)] * 2, batch=3, seed=7, dtype=torch.float32)
    assert fxviews.trace(fn, *samples[0]).meta[TRACED_WITH] == "fake mode"
    tf = fxviews.transform(fn, strict=True)
    assert_vmap_matches_per_sample(tf, fn, samples, atol=1e-5, rtol=1e-4)
    assert tf.cache_info().eager == 0


def test_gradients_outside_transform_treat_item_as_a_constant_like_eager():
    """``.item()`` cuts autograd: its stand-in tensor is detached, so no gradient flows
    through the number under an outer ``grad``."""

    def f(x):
        return (x / x.abs().max().item()).sum()

    samples = make_samples([(5,)], batch=3, seed=4, dtype=torch.float32)
    expected = per_sample_reference(grad(f), samples)
    (batched,) = stack_batched(samples, (-1,))
    assert_tree_close(vmap(grad(fxviews.transform(f)), in_dims=-1)(batched), expected)


def test_item_stays_a_number_where_a_tensor_would_promote_differently():
    """int tensor * float64 number is float32 (a number's category default); with a 0-dim
    float64 tensor it would be float64: that number stays, and the result is eager's."""

    def scaled(x, scale):
        return x * scale.item()

    x, scale = torch.arange(4), torch.tensor(0.5, dtype=torch.float64)
    gm = fxviews.trace(scaled, x, scale)
    assert keep_item_values_as_tensors(gm) == 0
    assert torch.ops.aten._local_scalar_dense.default in {n.target for n in gm.graph.nodes}
    out = fxviews.transform(scaled)(x, scale)
    assert out.dtype == scaled(x, scale).dtype == torch.float32
    assert torch.equal(out, scaled(x, scale))


def test_item_used_as_a_python_number_stays_a_number():
    def f(x):
        s = x.sum().item()
        return x * (s * 2.0 + 1.0)

    gm = fxviews.trace(f, torch.randn(4))
    assert keep_item_values_as_tensors(gm) == 0
    x = torch.randn(4)
    torch.testing.assert_close(fxviews.transform(f)(x), f(x))


def item_decides_a_branch(x):
    return x * 2 if x.sum().item() > 0 else -x


def equal_decides_a_branch(x):
    return x if torch.equal(x, x.abs()) else x.abs()


def item_sets_a_size(x):
    return x.repeat(int(x.abs().sum().item()) + 1)


@pytest.mark.parametrize(
    "fn",
    [item_decides_a_branch, equal_decides_a_branch, item_sets_a_size],
    ids=lambda fn: fn.__name__,
)
def test_values_reaching_branches_or_sizes_run_eagerly_with_the_warning(fn, caplog):
    tf = fxviews.transform(fn)
    x = torch.tensor([1.0, -3.0, 0.5])
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        for value in (x, -x, 2 * x):
            assert torch.equal(tf(value), fn(value))
    assert tf.cache_info().eager == 1
    warnings = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(warnings) == 1 and fn.__name__ in warnings[0]
