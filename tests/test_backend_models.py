"""Whole models in the style of real ones, compiled with the backend: eager's values, gradients
and layouts, and every graph reaches the inner compiler (none runs as eager PyTorch for one
node it cannot hand on).

The models are the bench's (:mod:`fxviews.bench.compiled_models`): HF Longformer's
sliding-chunk attention (``query /= sqrt(d)`` in place, ``_chunk``'s ``as_strided`` with the
strides ``.stride()`` reports, chunk counts computed by ``torch.div``), among others. Each
is compared with eager PyTorch; a recording inner compiler says which graphs reached it;
Inductor compiles are kept to a few (slow on CPU).
"""

from __future__ import annotations

import pytest
import torch

import fxviews
from fxviews.bench.compiled_models import build
from tests.test_backend import Recorder

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _trained(model, x):
    """The output, the input's gradient and every parameter's, after one backward."""
    model.zero_grad()
    x = x.detach().requires_grad_()
    out = model(x)
    out.square().mean().backward()
    return out, x.grad, [p.grad.clone() for p in model.parameters()]


def _trained_through_a_recorder(name, caplog, level):
    """Model ``name`` compiled with a recording inner compiler, trained one step beside eager
    (values and gradients compared), the fxviews logger captured at ``level``."""
    model, make_input = build(name)
    x = make_input(batch=2)
    recorder = Recorder()
    compiled = torch.compile(model, backend=fxviews.backend(inner=recorder))
    with caplog.at_level(level, logger="fxviews"):
        torch.testing.assert_close(_trained(compiled, x), _trained(model, x))
    return recorder


def test_longformer_reaches_the_inner_compiler_whole(caplog):
    """Longformer's as_strided nodes are rewritten in Dynamo's graph, before AOTAutograd
    functionalizes ``query /= sqrt(d)``: the model is one graph for the inner compiler, forward
    and backward, with no as_strided left. Before, one kept chunk reading the written query ran
    the whole graph as eager PyTorch."""
    recorder = _trained_through_a_recorder("longformer", caplog, "WARNING")
    assert "fxviews" not in caplog.text, caplog.text  # no eager fallback, no unchecked layout
    assert len(recorder.graphs) == 2  # forward and backward
    assert recorder.as_strided_counts() == [0, 0], [gm.code for gm in recorder.graphs]


def test_longformer_with_inner_inductor_matches_eager_and_inductor_alone(caplog):
    model, make_input = build("longformer")
    x = make_input(batch=2)
    with torch.no_grad(), caplog.at_level("WARNING", logger="fxviews"):
        expected = model(x)
        inductor = torch.compile(model)(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="fxviews", options={"inner": "inductor"})(x)
    torch.testing.assert_close(compiled, expected)
    torch.testing.assert_close(compiled, inductor)
    assert compiled.stride() == expected.stride()
    assert "fxviews" not in caplog.text


def test_a_graph_is_split_before_a_kept_read_of_written_memory(caplog):
    """The cache's chunks stay an as_strided in Dynamo's graph (the last reaches into the
    padding, past the filled rows it is taken of) over memory written in place just before:
    AOTAutograd would hand it the written tensor's updated copy. The graph is split before it,
    as a graph break would split it: both parts reach the inner compiler, forward and backward,
    and in the second the cache is an input, of which the engine makes the chunks views.
    Before, the whole graph ran as eager PyTorch."""
    recorder = _trained_through_a_recorder("chunked_cache", caplog, "INFO")
    assert "eager PyTorch" not in caplog.text
    assert "splits this graph" in caplog.text and "'chunks'" in caplog.text
    assert len(recorder.graphs) == 4, [gm.code for gm in recorder.graphs]  # 2 parts, fw and bw
    assert recorder.as_strided_counts() == [0] * 4
    first, second = ({n.target for n in gm.graph.nodes} for gm in recorder.graphs[:2])
    assert torch.ops.aten.slice_scatter.default in first  # the cache written
    assert torch.ops.aten.unfold.default in second  # its chunks, read in the next part


def test_a_split_graph_with_inner_inductor_gives_eagers_numbers():
    """With Inductor inside, each part is Inductor's, and the numbers are eager's. (Inductor
    alone reads stray memory for the last chunk here: values that change from run to run.)"""
    model, make_input = build("chunked_cache")
    compiled = torch.compile(model, backend="fxviews", options={"inner": "inductor"})
    with torch.no_grad():
        for seed in (0, 1):
            x = make_input(batch=2, seed=seed)
            torch.testing.assert_close(compiled(x), model(x))


def test_each_part_of_a_split_graph_compiles_its_backward_with_its_own_metadata():
    """AOTAutograd keeps a graph's metadata in the tracing context, and its lazy backward
    compile reads it back there (Inductor's donated buffers). Each part of a split graph is
    lowered in a context of its own: each backward sees its own forward's metadata, not the
    last part's."""
    seen = []

    def record(gm, example_inputs):
        context = torch._guards.TracingContext.try_get()
        seen.append(id(context.fw_metadata))
        return gm.forward

    model, make_input = build("chunked_cache")
    x = make_input(batch=2)
    _trained(torch.compile(model, backend=fxviews.backend(inner=record)), x)
    forward_first, forward_second, backward_second, backward_first = seen
    assert forward_first != forward_second
    assert (backward_first, backward_second) == (forward_first, forward_second)


def test_a_write_functionalization_inverts_wrongly_runs_alone(caplog):
    """The gain is multiplied in place into gapped windows (``unfold``), whose inverse in
    functionalization zeroes the features between them. The graph is split around that write,
    which alone runs as eager PyTorch: the layers before and after it reach the inner
    compiler, forward and backward. Before, the whole graph ran as eager PyTorch."""
    recorder = _trained_through_a_recorder("windowed_gain", caplog, "INFO")
    assert "runs this graph as eager" not in caplog.text
    assert "every part but those of 'mul_'" in caplog.text
    assert len(recorder.graphs) == 4, [gm.code for gm in recorder.graphs]  # 2 parts, fw and bw
    first, second = ({n.target for n in gm.graph.nodes} for gm in recorder.graphs[:2])
    assert torch.ops.aten.addmm.default in first and torch.ops.aten.tanh.default in second
    assert torch.ops.aten.mul.Tensor not in first | second  # the write, eager's alone


def test_a_write_run_alone_between_inductor_parts_gives_eagers_numbers():
    model, make_input = build("windowed_gain")
    x = make_input(batch=2)
    compiled = torch.compile(model, backend="fxviews", options={"inner": "inductor"})
    torch.testing.assert_close(_trained(compiled, x), _trained(model, x))
