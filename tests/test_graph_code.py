"""The code fxviews writes for a graph it only runs (Note [The code of a graph only run]).

Every graph is run through that code and through FX's own code for the same graph, directly and
under ``vmap`` (batch dims physically at 0, 1 and last), and compared with eager PyTorch on each
sample; the graphs hold what the code must not render as source (``inf``, ``nan``, dtypes,
memory formats, slices, tuples, lists a call may keep) and every kind of node the transform's
graphs have. What FX's code does besides computing (freeing each value after its last use,
tracebacks that show the line) is checked too, and the graphs it is not written for run FX's.
"""

from __future__ import annotations

import gc
import linecache
import operator
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fxviews
from fxviews.calls.graph_code import run_only_forward
from fxviews.passes.runtime.bound_calls import bind_calls, bind_constants
from fxviews.passes.runtime.constant_folding import fold_input_free_results
from tests.reference import assert_tree_close, assert_vmap_matches_per_sample, make_samples


def special_values(x, y):
    masked = x.masked_fill(x > 0.5, float("-inf")).softmax(-1)
    widened = (x.to(torch.float64) * float("nan")).nan_to_num(1.5).to(torch.float32)
    return masked + widened, torch.clamp(y, max=float("inf")).contiguous(
        memory_format=torch.contiguous_format
    )


def indexing(x, y):
    parts = x.split(2, -1)  # a getitem of a tuple of results
    window = x[1:, ::2][:, :2]  # slices spelled as indexing: a tuple of slices
    return parts[0] * window.sum(), y[None].expand(2, -1, -1), x.unbind(0)[1]


def writes_and_methods(x, y):
    base = x.clone()
    base[:, 0].copy_(y[0])  # select + copy_ in place, a method call
    base.mul_(2.0).add_(y, alpha=-0.5)
    return base.transpose(0, 1).reshape(-1), base.new_zeros(3, dtype=torch.int64) + 1


def closes_over_a_parameter(x, y):
    return torch.nn.functional.linear(x, _WEIGHT, bias=_BIAS).tanh() @ y.T


_WEIGHT = torch.nn.Parameter(torch.randn(4, 4))
_BIAS = torch.randn(4)
PROGRAMS = [special_values, indexing, writes_and_methods, closes_over_a_parameter]


def _cached_graph(fn: Callable[..., Any], *args: torch.Tensor) -> torch.fx.GraphModule:
    """The graph a transform of ``fn`` caches for ``args`` (bound calls, folded constants)."""
    result = fxviews.rewrite(fxviews.trace(fn, *args))
    gm = result.graph_module
    fold_input_free_results(gm)
    bind_calls(gm)
    bind_constants(gm)
    gm.recompile()
    return gm


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_written_code_computes_what_fx_code_and_eager_compute(fn) -> None:
    samples = make_samples([(4, 4), (4, 4)], 3, seed=len(fn.__name__), dtype=torch.float32)
    gm = _cached_graph(fn, *samples[0])
    forward = run_only_forward(gm)
    assert forward.__func__.__code__.co_filename.startswith("<fxviews graph")
    for sample in samples:
        written = _leaves(forward(*(t.clone() for t in sample)))
        assert_tree_close(written, _leaves(gm(*(t.clone() for t in sample))))
        assert_tree_close(written, _leaves(fn(*sample)))
    assert_vmap_matches_per_sample(
        lambda *a: _leaves(forward(*a)), lambda *a: _leaves(fn(*a)), samples
    )


def _leaves(tree: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(tree)


def test_the_transform_runs_written_code_and_matches_eager_under_vmap_and_grad() -> None:
    tf = fxviews.transform(indexing)
    samples = make_samples([(4, 4), (4, 4)], 3, seed=3, dtype=torch.float32)
    assert_vmap_matches_per_sample(tf, indexing, samples)
    grads = torch.func.grad(lambda x, y: tf(x, y)[0].sum())(*samples[0])
    expected = torch.func.grad(lambda x, y: indexing(x, y)[0].sum())(*samples[0])
    assert_tree_close(grads, expected)


class _Watch:
    """Holds a weak reference to the value a graph made (a graph argument by reference)."""

    ref: weakref.ref[torch.Tensor] | None = None

    def keep(self, value: torch.Tensor) -> torch.Tensor:
        self.ref = weakref.ref(value)
        return value

    def freed(self, value: torch.Tensor) -> torch.Tensor:
        gc.collect()
        return value + (1.0 if self.ref is not None and self.ref() is None else 0.0)


def test_each_value_is_freed_after_its_last_use() -> None:
    watch = _Watch()

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    big = graph.call_function(watch.keep, (graph.call_function(torch.mul, (x, 2.0)),))
    total = graph.call_function(torch.sum, (big,))
    graph.output([graph.call_function(watch.freed, (total,))])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    # 6 + 1: `big`, read last by the sum, was already gone when `freed` ran.
    assert run_only_forward(gm)(torch.ones(3))[0].item() == 7.0
    assert gm(torch.ones(3))[0].item() == 7.0  # FX's code frees it too


def test_a_result_nothing_reads_is_freed_at_once() -> None:
    watch = _Watch()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(watch.keep, (graph.call_function(torch.mul, (x, 2.0)),))  # unread
    total = graph.call_function(torch.sum, (x,))
    graph.output([graph.call_function(watch.freed, (total,))])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert run_only_forward(gm)(torch.ones(3))[0].item() == 4.0


def test_a_traceback_shows_the_line_that_raised_for_as_long_as_the_code_lives() -> None:
    gm = _cached_graph(lambda x, y: (x @ y).sum(), torch.ones(2, 3), torch.ones(3, 2))
    forward = run_only_forward(gm)
    with pytest.raises(RuntimeError) as raised:
        forward(torch.ones(2, 3), torch.ones(2, 3))
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert frame.filename.startswith("<fxviews graph") and "_mm_" in frame.line
    filename = frame.filename
    del forward, raised, frame
    gc.collect()
    assert linecache.getline(filename, 2) == ""


def test_a_graph_with_a_module_call_or_a_pytree_convention_runs_fx_code() -> None:
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    assert any(node.op == "call_module" for node in traced.graph.nodes)
    assert run_only_forward(traced) == traced.forward
    nested = torch.fx.experimental.proxy_tensor.make_fx(lambda xs: xs[0] + xs[1])(
        [torch.ones(2), torch.ones(2)]
    )
    assert run_only_forward(nested) == nested.forward


def test_getitem_spelled_as_subscript_reads_what_operator_getitem_reads() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    index = (slice(None), slice(1, None, 2), None)
    graph.output([graph.call_function(operator.getitem, (x, index))])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    value = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(run_only_forward(gm)(value)[0], value[:, 1::2, None])


def test_a_source_compiles_once_and_keeps_its_lines_while_any_function_of_it_lives() -> None:
    # Two traces of one program (as for a new batch size) write the same text over other objects.
    first = run_only_forward(_cached_graph(lambda x: x.sin() * 2, torch.ones(3)))
    second = run_only_forward(_cached_graph(lambda x: x.sin() * 2, torch.ones(5)))
    assert first.__func__.__code__ is second.__func__.__code__
    assert torch.equal(_leaves(second(torch.ones(5)))[0], torch.ones(5).sin() * 2)
    filename = first.__func__.__code__.co_filename
    del first
    gc.collect()
    assert linecache.getline(filename, 2).strip().startswith("v")
    del second
    gc.collect()
    assert linecache.getline(filename, 2) == ""
