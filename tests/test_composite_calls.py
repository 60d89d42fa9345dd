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
from fxviews.passes.compat.torch_internals import FakeTensorMode
from fxviews.tracing.capture import capture
from fxviews.tracing.composite_calls import CompositeCalls
from fxviews.tracing.recording import OpRecorder
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


DROPOUT = torch.nn.Dropout(0.4)
NORMED = torch.nn.Sequential(
    torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6, track_running_stats=False), torch.nn.Dropout()
).double()

DROPOUTS = {
    "F.dropout": lambda x: F.dropout(x, 0.3, training=True) * x,
    "nn.Dropout": lambda x: DROPOUT(x.sin()),
    "F.alpha_dropout": lambda x: F.alpha_dropout(x, 0.5, training=True),
    "eval F.dropout": lambda x: F.dropout(x, 0.5, training=False) + 1,
    "p=0": lambda x: F.dropout(x, 0.0) * 2,
    "inplace": lambda x: F.dropout(x * 1, 0.5, inplace=True),
    "batch norm, then dropout": lambda x: NORMED(x),
}


def _drawn(f, *args):
    """``f(*args)`` from seed 0, and the stream's next draw after it."""
    torch.manual_seed(0)
    return f(*args), torch.rand(3)


@pytest.mark.parametrize("batch_dim", [0, 1, -1])
@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_dropout_under_vmap_draws_eager_vmaps_masks(name, batch_dim) -> None:
    # Recorded op by op, dropout's in-place bernoulli_ filled a batch in memory order, and eager
    # vmap draws in logical order: with the batch dim anywhere but first in memory the masks
    # differed. Kept whole, the graph's dropout draws as eager's does.
    if name == "inplace" and batch_dim != 0:
        pytest.skip("in-place dropout is recorded op by op: docs/limitations.md, Randomness")
    fn = DROPOUTS[name]
    shape = (4, 5) if "batch norm" in name else (5,)
    batch = make_samples([shape], 4, seed=3)
    stacked = torch.stack([x for (x,) in batch], dim=batch_dim).contiguous()
    in_dims = batch_dim if batch_dim >= 0 else len(shape)
    tf = fxviews.transform(fn, strict=True)
    for _ in range(2):  # the first call traces, the second runs the cached graph
        got = _drawn(torch.func.vmap(tf, in_dims=in_dims, randomness="different"), stacked)
        want = _drawn(torch.func.vmap(fn, in_dims=in_dims, randomness="different"), stacked)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    (x,) = batch[0]
    for _ in range(2):  # called directly: the same draws and stream as eager's
        torch.testing.assert_close(_drawn(tf, x), _drawn(fn, x), rtol=0, atol=0)
    grads = [_drawn(torch.func.grad(lambda x, f=f: f(x).sum()), x) for f in (tf, fn)]
    torch.testing.assert_close(*grads, rtol=0, atol=0)


@pytest.mark.parametrize(
    "name, kept",
    [("F.dropout", 1), ("nn.Dropout", 1), ("F.alpha_dropout", 1), ("eval F.dropout", 0)]
    + [("p=0", 0), ("inplace", 0)],
)
def test_a_training_dropout_making_new_memory_is_one_node(name, kept) -> None:
    fn, (x,) = DROPOUTS[name], make_samples([(5,)], 1, seed=0)[0]
    gm = capture(fn, [x], fresh=True, caller="test", name=name)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(op in (aten.dropout.default, aten.alpha_dropout.default) for op in ops) == kept
    assert (aten.bernoulli_.float in ops) == (kept == 0 and name == "inplace")
