"""The steps for a graph fxviews only runs (the transform's cached graph): ops through their
Python bindings, input-free results computed once, views to a tensor's own shape dropped.

Each changes how a graph calls its ops, never what it computes: every graph here is compared,
after the step, with the same graph before it and with eager PyTorch, directly and under
``vmap`` (batch dims physically at 0, 1 and last) and ``grad``; the state a call leaves (a
written input, the random stream) is compared too.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fxviews
from fxviews.passes.rewrites.hygiene import drop_redundant_aliases
from fxviews.passes.runtime.bound_calls import bind_calls, bind_constants
from fxviews.passes.runtime.constant_folding import fold_input_free_results
from tests.reference import assert_tree_close, assert_vmap_matches_per_sample, make_samples, randn

aten = torch.ops.aten
WEIGHT = torch.nn.Parameter(torch.randn(4, 4))


def many_ops(x, y):
    z = x * 2.5 + y.mul(3) - torch.add(x, y, alpha=0.5)
    w = z.reshape(2, 2).sum([0]).repeat(2) + x[1:3].sum() + x.select(0, 0)
    v = torch.cat([z[:2], w[2:]]).cumsum(0, dtype=torch.float64).float()
    return v.softmax(-1) * torch.ones(4, dtype=torch.float32) + x.clone().copy_(y)


def closes_over_a_parameter(x, y):
    return (x @ WEIGHT.t()).tanh() + y


def causal_scores(q, k):
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril()
    positions = torch.arange(q.shape[0]).float()
    return (q @ k.T).masked_fill(~mask, -1e9).softmax(-1) + positions[:, None]


def _graph(fn: Callable[..., Any], *args: torch.Tensor) -> torch.fx.GraphModule:
    return fxviews.explain(fn, *args).graph_module


def _targets(gm: torch.fx.GraphModule) -> set[Any]:
    return {node.target for node in gm.graph.nodes if node.op in ("call_function", "call_method")}


@pytest.mark.parametrize(
    "fn, shapes",
    [(many_ops, [(4,), (4,)]), (closes_over_a_parameter, [(4,), (4,)]),
     (causal_scores, [(3, 4), (3, 4)])],
    ids=lambda v: getattr(v, "__name__", ""),
)  # fmt: skip
def test_bound_and_folded_graph_computes_what_the_graph_did(fn, shapes) -> None:
    samples = make_samples(shapes, 3, seed=len(fn.__name__), dtype=torch.float32)
    gm = _graph(fn, *samples[0])
    tuned = _graph(fn, *samples[0])
    fold_input_free_results(tuned)
    assert bind_calls(tuned) > 0
    bind_constants(tuned)
    tuned.recompile()
    assert_tree_close(tuned(*samples[1]), gm(*samples[1]))
    assert_vmap_matches_per_sample(tuned, fn, samples)
    grads = torch.func.grad(lambda *a: tuned(*a).sum())(*samples[2])
    expected = torch.func.grad(lambda *a: fn(*a).sum())(*samples[2])
    assert_tree_close(grads, expected)


def test_an_op_whose_binding_reaches_another_overload_keeps_it() -> None:
    def fn(x):
        whole = torch.ops.aten.slice.Tensor(x, 0, 0, 9223372036854775807)
        return torch.ops.aten.mul.Scalar(x, 2.0) + whole

    gm = _graph(fn, torch.randn(3))
    bind_calls(gm)
    # torch.mul(x, 2.0) dispatches mul.Tensor with a wrapped scalar, and x[0:] no slice at all
    # (indexing skips a slice of the whole dim): both keep their overloads.
    assert {aten.mul.Scalar, aten.slice.Tensor} <= _targets(gm)
    assert aten.add.Tensor not in _targets(gm) and torch.add in _targets(gm)


def test_a_binding_generated_code_cannot_reach_by_its_name_is_not_used() -> None:
    # The C++ split is torch._C._VariableFunctions.split; `torch.split`, the name generated code
    # would call, is a Python wrapper around it.
    gm = _graph(lambda x: x.split(2)[0] * 2, torch.randn(4))
    bind_calls(gm)
    assert aten.split.Tensor in _targets(gm) and torch.mul in _targets(gm)


def test_a_one_element_dim_list_is_passed_as_its_int_and_longer_lists_stay() -> None:
    def fn(x):
        return x.sum(-1) + x.amax([0, 1]) + x.mean([1], keepdim=True).squeeze(1)

    gm = _graph(fn, torch.randn(3, 4))
    bind_calls(gm)
    gm.recompile()
    dims = {n.target: n.args[1] for n in gm.graph.nodes if n.op == "call_function"}
    assert dims[torch.sum] == -1 and dims[torch.mean] == 1 and dims[torch.amax] == [0, 1]
    samples = make_samples([(3, 4)], 3, seed=5, dtype=torch.float32)
    assert_tree_close(gm(*samples[0]), fn(*samples[0]))
    assert_vmap_matches_per_sample(gm, fn, samples)


def test_slices_become_indexing_where_it_reaches_the_same_slice() -> None:
    gm = _graph(lambda x: x[1:, 1:3] + x[1:, ::2][:, :2], torch.randn(3, 4))
    bind_calls(gm)
    gm.recompile()
    assert aten.slice.Tensor not in _targets(gm)
    spelled = [n.args[1] for n in gm.graph.nodes if n.target is operator.getitem]
    assert (slice(None), slice(1, 3, 1)) in spelled and (
        slice(None),
        slice(0, 2**63 - 1, 2),
    ) in spelled
    x = randn(3, 4)
    assert torch.equal(gm(x), x[1:, 1:3] + x[1:, ::2][:, :2])


def test_constants_are_read_from_the_instance_and_stay_parameters() -> None:
    gm = _graph(closes_over_a_parameter, torch.randn(4), torch.randn(4))
    bind_constants(gm)
    names = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert names and all(name in gm.__dict__ for name in names)
    assert any(p is WEIGHT for p in gm.parameters())  # gradients still reach it


def test_a_written_a_returned_or_a_random_result_is_never_folded() -> None:
    def fn(x):
        scratch = torch.zeros(3)
        scratch.add_(x)  # written: computed again on every call
        fresh = torch.ones(3)  # returned: a new tensor for every call
        return scratch * torch.rand(3), fresh

    tf = fxviews.transform(fn, strict=True)
    x, y = randn(3), randn(3)
    torch.manual_seed(0)
    first = tf(x)
    first[1].add_(1)  # the caller writes what one call returned ...
    torch.manual_seed(1)
    second = tf(y)
    torch.manual_seed(1)
    assert_tree_close(second, fn(y))  # ... and the next call returns ones again


def test_nothing_read_from_memory_the_graph_writes_is_computed_once() -> None:
    def basis_then_scale(x):  # jacfwd's basis: zeros, then its diagonal filled in place
        basis = x.new_zeros(4, 4)
        basis.diagonal().fill_(1)
        return (basis - basis.mean()) * x.sum()

    gm = _graph(basis_then_scale, torch.randn(4))
    assert fold_input_free_results(gm) == 0
    tf = fxviews.transform(basis_then_scale, strict=True)
    assert_vmap_matches_per_sample(tf, basis_then_scale, make_samples([(4,)], 3, seed=4))


def count_then_variance(x):
    """torch.masked.var's own pattern: a count computed from sizes alone (input-free), read by
    ``new_zeros`` for its dtype and, after it, for its values."""
    count = torch.ones(x.shape, dtype=torch.int64).sum().float() - 1
    return (x - x.mean()).square().sum() / torch.maximum(count, count.new_zeros(()))


@pytest.mark.parametrize(
    "fn",
    [
        count_then_variance,
        lambda x: torch.masked.var(x),
        lambda x: torch.masked.std(x),
        lambda x: torch.masked.var(x, 0),
    ],
    ids=["count_then_variance", "masked_var", "masked_std", "masked_var_dim"],
)
def test_a_result_computed_once_and_read_by_new_zeros_keeps_its_value(fn) -> None:
    # new_zeros reads only its argument's dtype and device, and the folding stood in an empty
    # tensor for it: where that argument was itself computed once, its value became the empty
    # stand-in for every later reader (torch.masked.var returned tensor([])).
    samples = make_samples([(5, 5, 5)], 3, seed=6, dtype=torch.float32)
    gm = _graph(fn, *samples[0])
    assert fold_input_free_results(gm) > 0
    gm.recompile()
    assert_tree_close(gm(*samples[1]), fn(*samples[1]))
    tf = fxviews.transform(fn, strict=True)
    assert_tree_close(tf(*samples[1]), fn(*samples[1]))
    assert_vmap_matches_per_sample(tf, fn, samples)


def test_results_of_a_parameter_are_computed_on_every_call() -> None:
    tf = fxviews.transform(closes_over_a_parameter, strict=True)
    x, y = randn(4), randn(4)
    before = tf(x, y)
    with torch.no_grad():
        WEIGHT.mul_(2)
    try:
        assert_tree_close(tf(x, y), closes_over_a_parameter(x, y))
        assert not torch.allclose(tf(x, y), before)
    finally:
        with torch.no_grad():
            WEIGHT.div_(2)


def test_the_causal_mask_is_computed_once() -> None:
    gm = _graph(causal_scores, torch.randn(3, 4), torch.randn(3, 4))
    assert fold_input_free_results(gm) == 2  # the mask and the positions
    assert not {aten.tril.default, aten.ones.default, aten.arange.start_step} & _targets(gm)


@pytest.mark.parametrize(
    "view", [lambda x: x.expand(3, 4), lambda x: x.view(3, 4), lambda x: x.reshape(3, 4)]
)
def test_a_view_to_a_tensors_own_shape_is_dropped_but_not_as_an_output_of_an_input(view) -> None:
    gm = _graph(lambda x: (view(x.clone()) * 2, view(x)), torch.randn(3, 4))
    drop_redundant_aliases(gm)
    users = [n for n in gm.graph.nodes if n.target in _OWN_SHAPE_VIEWS]
    # The first went (a view of the clone, read by mul); the second is returned, of the input.
    assert len(users) == 1 and users[0].args[0].op == "placeholder"
    x = randn(3, 4)
    out = gm(x)
    assert_tree_close(out, (x * 2, x))
    assert out[1] is not x


_OWN_SHAPE_VIEWS = {aten.expand.default, aten.view.default, aten.reshape.default}
