"""``linear`` and ``matmul`` recorded as the one call eager code makes (Note [Composite calls in
a recording]): one node each, which decomposes when the graph runs for the shapes and batch it
meets then. Every program is checked under ``vmap`` (batch dims physically at 0, 1 and last),
``grad`` and ``jvp`` around the transformed function against eager PyTorch per sample; where
the function itself runs a transform or a backward, the call is recorded op by op.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
from torch.autograd import forward_ad

import fxviews
from fxviews.composite_calls import CompositeCalls
from fxviews.passes.torch_internals import FakeTensorMode
from fxviews.recording import OpRecorder
from fxviews.tracing import capture
from tests.reference import assert_tree_close, assert_vmap_matches_per_sample, make_samples

torch.manual_seed(0)
LAYER = torch.nn.Linear(6, 5)
MATRIX = torch.randn(6, 4, dtype=torch.float64)
BATCHED = torch.randn(3, 6, 2, dtype=torch.float64)

aten = torch.ops.aten


def linear_layers(x):
    return LAYER(torch.tanh(LAYER.weight.T @ LAYER(x)))


def matmuls(x):  # vector, matrix and batched-matrix products: each decomposes its own way
    return (x @ MATRIX, torch.matmul(MATRIX.T, x), x.matmul(BATCHED).sum(0), F.linear(x, MATRIX.T))


def grad_inside(x):  # a transform inside fn: the products are recorded op by op
    return torch.func.grad(lambda w: (x @ w).tanh().sum())(MATRIX)


def backward_inside(x):  # a backward inside fn reads what the decomposition saved
    y = x.detach().requires_grad_()
    (gx,) = torch.autograd.grad((y @ MATRIX).sin().sum(), y)
    return gx


def dual_inside(x):
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        return forward_ad.unpack_dual(dual @ MATRIX).tangent


PROGRAMS = [linear_layers, matmuls, grad_inside, backward_inside, dual_inside]


def _samples(fn):
    dtype = torch.float32 if fn is linear_layers else torch.float64
    return make_samples([(6,)], 3, seed=len(fn.__name__), dtype=dtype)


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda fn: fn.__name__)
def test_vmap_grad_and_jvp_around_the_transform_match_eager(fn) -> None:
    samples = _samples(fn)
    tf = fxviews.transform(fn, strict=True)
    if fn is backward_inside:  # requires_grad_ under vmap: the graph refuses it as eager does
        for (x,) in samples:
            assert_tree_close(tf(x), fn(x))
        batch = torch.stack([x for (x,) in samples])
        for batched in (fn, tf):
            with pytest.raises(RuntimeError, match="requires_grad_"):
                torch.func.vmap(batched)(batch)
    else:
        assert_vmap_matches_per_sample(tf, fn, samples)
    assert tf.cache_info().eager == 0
    if fn in (backward_inside, dual_inside):
        return  # eager refuses grad around a backward, and jvp around forward AD, inside fn
    x, t = samples[0][0], samples[1][0]

    def total(f):
        return lambda x: sum(out.sum() for out in torch.utils._pytree.tree_leaves(f(x)))

    assert_tree_close(torch.func.grad(total(tf))(x), torch.func.grad(total(fn))(x))
    assert_tree_close(torch.func.jvp(tf, (x,), (t,)), torch.func.jvp(fn, (x,), (t,)))


@pytest.mark.parametrize(
    "fn, whole",
    [
        (linear_layers, [aten.linear.default] * 2 + [aten.matmul.default]),
        (matmuls, [aten.matmul.default] * 3 + [aten.linear.default]),
        (grad_inside, []),
        (dual_inside, []),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_recording_keeps_the_calls_outside_transforms_whole(fn, whole) -> None:
    gm = capture(fn, list(_samples(fn)[0]), fresh=True, caller="test", name=fn.__name__)
    recorded = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    kept = [t for t in recorded if t in (aten.linear.default, aten.matmul.default)]
    assert sorted(map(str, kept)) == sorted(map(str, whole))


def test_a_call_run_unrecorded_is_not_recorded() -> None:
    # As inside a custom autograd.Function's forward, kept as one node: its linear, on a tensor
    # the forward made, is part of that node, never a node of its own.
    x, w = torch.randn(6), torch.randn(5, 6)
    recorder = OpRecorder([x], FakeTensorMode())
    with CompositeCalls(recorder), recorder, recorder.unrecorded():
        out = F.linear(x * 2, w)
    assert_tree_close(out, F.linear(x * 2, w))
    assert [n.op for n in recorder.graph.nodes] == ["placeholder"]
