"""The torch.compile backend: results equal eager, inner compilers get as_strided-free graphs.

Every case is compiled three ways and compared with eager PyTorch: ``backend="fxviews"`` (inner
eager), a recording inner callable (which must see no as_strided where plain AOTAutograd
produced some) and, for a few cases, inner Inductor (slow on CPU, so kept to a minimum).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import fxviews
from fxviews.consumers.compile.backend import fxviews_backend
from fxviews.examples import push_jvp
from fxviews.passes.compat.torch_internals import (
    BackendCompilerFailed,
    aot_autograd,
    list_backends,
    lookup_backend,
    min_cut_rematerialization_partition,
    reset_dynamo,
)
from tests.reference import as_strided_nodes

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- the functions under test -------------------------------------------------------------


def jvp_loss(x, y, yt):
    """Training through forward AD: both the forward and the backward graph get as_strided."""
    (view, base), (view_t, base_t) = push_jvp(x, y, yt)
    return (view * view_t).sum() + (base * base_t).sum()


def sliding_windows(x):
    """User code calling as_strided itself: overlapping windows of 3 over a 1-D signal."""
    return x.as_strided((x.numel() - 2, 3), (1, 1)).sum(-1)


def transposed_window_loss(a):
    """as_strided on a transposed input, trained: AsStridedBackward's scatter in the backward."""
    return a.t().as_strided((2, 3), (1, 2), 1).exp().sum()


@dataclass
class Case:
    fn: Callable[..., Any]
    make_args: Callable[[], tuple[torch.Tensor, ...]]
    training: bool = False


CASES = {
    "forward_jvp": Case(push_jvp, lambda: tuple(torch.randn(2, 6) for _ in range(3))),
    "forward_user_as_strided": Case(sliding_windows, lambda: (torch.randn(10),)),
    "training_jvp": Case(
        jvp_loss, lambda: tuple(torch.randn(2, 6, requires_grad=True) for _ in range(3)), True
    ),
    "training_user_as_strided": Case(
        transposed_window_loss, lambda: (torch.randn(4, 3, requires_grad=True),), True
    ),
}


# --- helpers ---------------------------------------------------------------------------------


class Recorder:
    """An inner compiler that keeps every graph it is given and runs it unchanged."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def as_strided_counts(self) -> list[int]:
        return [len(as_strided_nodes(gm)) for gm in self.graphs]


def plain_aot(recorder: Recorder):
    """AOTAutograd lowered as the fxviews eager backend lowers, without the engine."""
    return aot_autograd(
        fw_compiler=recorder,
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )


def run(fn, args, training):
    """Outputs of ``fn(*args)`` and, when training, the gradients of its inputs."""
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*args)
    if not training:
        return out
    out.backward()
    return out, [a.grad for a in args]


def assert_matches_eager(compiled, case: Case, args) -> None:
    expected = run(case.fn, args, case.training)
    torch.testing.assert_close(run(compiled, args, case.training), expected)


# --- results equal eager; inner compilers see no as_strided -----------------------------------


@pytest.mark.parametrize("name", CASES)
def test_default_backend_matches_eager(name):
    case = CASES[name]
    assert_matches_eager(torch.compile(case.fn, backend="fxviews"), case, case.make_args())


@pytest.mark.parametrize("name", CASES)
def test_inner_callable_receives_rewritten_graphs(name):
    case = CASES[name]
    args = case.make_args()
    plain = Recorder()
    run(torch.compile(case.fn, backend=plain_aot(plain)), args, case.training)
    reset_dynamo()
    rewritten = Recorder()
    compiled = torch.compile(case.fn, backend=fxviews.backend(inner=rewritten))
    assert_matches_eager(compiled, case, args)

    # One graph for inference, forward + backward when training, in both lowerings.
    assert len(rewritten.graphs) == len(plain.graphs) == (2 if case.training else 1)
    assert all(plain.as_strided_counts()), plain.as_strided_counts()
    assert rewritten.as_strided_counts() == [0] * len(rewritten.graphs), [
        gm.code for gm in rewritten.graphs
    ]


def test_vmap_of_jvp_with_batch_dims_not_first():
    """The README's push_jvp, compiled: batch dims physically at 1 and 2, per-sample check."""
    in_dims, batch = (1, 2, 2), 3
    samples = [tuple(torch.randn(2, 6) for _ in range(3)) for _ in range(batch)]
    batched = [torch.stack([s[i] for s in samples], dim=d) for i, d in enumerate(in_dims)]
    plain = Recorder()
    torch.compile(torch.vmap(push_jvp, in_dims=in_dims), backend=plain_aot(plain))(*batched)
    reset_dynamo()
    recorder = Recorder()
    compiled = torch.compile(
        torch.vmap(push_jvp, in_dims=in_dims), backend=fxviews.backend(inner=recorder)
    )
    (view, base), (view_t, base_t) = compiled(*batched)
    for b, sample in enumerate(samples):
        torch.testing.assert_close(((view[b], base[b]), (view_t[b], base_t[b])), push_jvp(*sample))
    assert plain.as_strided_counts() == [1]
    assert recorder.as_strided_counts() == [0]

    expected = torch.vmap(push_jvp, in_dims=in_dims)(*batched)
    for options in ({}, {"inner": "inductor"}):
        reset_dynamo()
        vmapped = torch.vmap(push_jvp, in_dims=in_dims)
        compiled = torch.compile(vmapped, backend="fxviews", options=options)
        torch.testing.assert_close(compiled(*batched), expected)


def test_inner_inductor_through_options_matches_eager(monkeypatch, capsys):
    case = CASES["forward_user_as_strided"]
    args = case.make_args()
    # Plain Inductor first: its AOTAutograd cache entry must not stand in for the rewrite.
    torch.compile(case.fn, backend="inductor")(*args)
    reset_dynamo()
    monkeypatch.setenv("FXVIEWS_DEBUG", "1")
    compiled = torch.compile(case.fn, backend="fxviews", options={"inner": "inductor"})
    assert_matches_eager(compiled, case, args)
    assert "unfold" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["forward_jvp", "training_jvp", "training_user_as_strided"])
def test_inner_inductor_matches_eager(name):
    # forward_user_as_strided runs under Inductor in the options test above.
    case = CASES[name]
    compiled = torch.compile(case.fn, backend=fxviews.backend(inner="inductor"))
    assert_matches_eager(compiled, case, case.make_args())


# --- options, strictness, dynamic shapes, debug printout --------------------------------------


def unsafe_window(x):
    """Reads past the end of ``x[:2]``: no view op of ``x[:2]`` can express it, and a same-dtype
    view.dtype hides x from the engine (through plain views it is read from x instead)."""
    return x[:2].view(x.dtype).as_strided((4,), (1,)) * 2  # LINE: unsafe_window


def test_unsafe_as_strided_is_left_to_inner_compiler():
    recorder = Recorder()
    x = torch.randn(4)
    compiled = torch.compile(unsafe_window, backend=fxviews.backend(inner=recorder))
    torch.testing.assert_close(compiled(x), unsafe_window(x))
    assert recorder.as_strided_counts() == [1]


def test_strict_option_raises_on_unsafe_as_strided():
    compiled = torch.compile(unsafe_window, backend="fxviews", options={"strict": True})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(4))
    error = info.value.inner_exception
    assert isinstance(error, fxviews.UnsafeAsStridedError)
    # Dynamo records each node's stack: the error names the user's line.
    lines, start = inspect.getsourcelines(unsafe_window)
    line = start + next(i for i, text in enumerate(lines) if "LINE: unsafe_window" in text)
    assert f"test_backend.py:{line}" in str(error)


# --- where PyTorch's AOT lowering fails ---------------------------------------------------------

WEIGHT = torch.randn(3, generator=torch.Generator().manual_seed(0), requires_grad=True)


def unrolled_in_place(x):
    """Each step reads the previous row of ``h`` and writes the next one in place. Autograd saved
    the row it multiplied, so AOTAutograd's joint trace trips the version counter check (eager
    PyTorch only would, at a backward nobody calls)."""
    h = x.new_zeros(3, 3)
    previous = h[:1]
    for t in range(3):
        h[t] = torch.tanh(previous[0] * WEIGHT + x[t])
        previous = h[t : t + 1]
    return h


def test_aot_lowering_failure_runs_the_graph_as_eager_pytorch(caplog):
    x = torch.randn(3, 3)
    with pytest.raises(BackendCompilerFailed, match="modified by an inplace operation"):
        torch.compile(unrolled_in_place, backend="aot_eager")(x)  # PyTorch's own AOT backend
    reset_dynamo()
    with caplog.at_level("WARNING", logger="fxviews"):
        actual = torch.compile(unrolled_in_place, backend="fxviews")(x)
    torch.testing.assert_close(actual, unrolled_in_place(x))
    assert "runs this graph as eager PyTorch" in caplog.text
    assert "modified by an inplace operation" in caplog.text


def test_aot_lowering_failure_raises_under_strict():
    compiled = torch.compile(unrolled_in_place, backend=fxviews.backend(strict=True))
    with pytest.raises(BackendCompilerFailed, match="modified by an inplace operation"):
        compiled(torch.randn(3, 3))


def test_inner_compiler_errors_are_not_swallowed():
    def failing_inner(gm, example_inputs):
        raise RuntimeError("inner compiler refuses")

    compiled = torch.compile(sliding_windows, backend=fxviews.backend(inner=failing_inner))
    with pytest.raises(BackendCompilerFailed, match="inner compiler refuses"):
        compiled(torch.randn(6))


@pytest.mark.parametrize("dynamic", [True, None])
def test_dynamic_shapes_compile_and_match_eager(dynamic):
    # dynamic=None recompiles with symbolic shapes on the second size, as users meet it
    # (tests/test_symbolic.py counts what reaches the inner compiler).
    case = CASES["forward_user_as_strided"]
    compiled = torch.compile(case.fn, backend="fxviews", dynamic=dynamic)
    for n in (10, 13, 16):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), case.fn(x))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="inner must be one of"):
        fxviews.backend(inner="tvm")
    with pytest.raises(TypeError, match="only inner='inductor'"):
        fxviews.backend(inner="eager", max_autotune=True)
    with pytest.raises(BackendCompilerFailed, match="takes no mode"):
        torch.compile(sliding_windows, backend="fxviews", mode="max-autotune")(torch.randn(5))


def test_debug_env_prints_the_diff(monkeypatch, capsys):
    monkeypatch.setenv("FXVIEWS_DEBUG", "1")
    case = CASES["forward_jvp"]
    torch.compile(case.fn, backend="fxviews")(*case.make_args())
    printout = capsys.readouterr().err
    assert "fxviews rewrite: backend, inference graph" in printout
    assert "-    as_strided = torch.ops.aten.as_strided.default" in printout


def test_no_printout_without_debug_env(monkeypatch, capsys):
    monkeypatch.delenv("FXVIEWS_DEBUG", raising=False)
    case = CASES["forward_jvp"]
    torch.compile(case.fn, backend="fxviews")(*case.make_args())
    assert "fxviews" not in capsys.readouterr().err


# --- registration ------------------------------------------------------------------------------


def test_registered_name_resolves_to_the_backend():
    assert "fxviews" in list_backends()
    assert lookup_backend("fxviews") is fxviews_backend


def test_entry_point_works_without_importing_fxviews():
    script = textwrap.dedent(
        """
        import sys, torch
        def f(x):
            return x.as_strided((x.numel() - 2, 3), (1, 1)).sum(-1)
        x = torch.randn(10)
        torch.testing.assert_close(torch.compile(f, backend="fxviews")(x), f(x))
        torch._dynamo.reset()
        opts = {"inner": lambda gm, ex: print(gm.code) or gm.forward}
        torch.compile(f, backend="fxviews", options=opts)(x)
        print("loaded through entry point:", "fxviews.consumers.compile.backend" in sys.modules)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "FXVIEWS_DEBUG"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "loaded through entry point: True" in done.stdout
    assert "as_strided" not in done.stdout.split("loaded through")[0]


# --- Dynamo's own control flow reaches Dynamo -----------------------------------------------


def test_dynamo_restart_under_dynamic_shapes_reaches_dynamo(caplog):
    """nn.LayerNorm under dynamic=True: AOTAutograd's scalar pass raises
    TensorifyScalarRestartAnalysis to have Dynamo trace again (eps as a tensor). That is
    Dynamo's control flow, not a lowering failure: the graph compiles, nothing runs eagerly."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    recorder = Recorder()
    compiled = torch.compile(norm, backend=fxviews.backend(inner=recorder), dynamic=True)
    with caplog.at_level("WARNING", logger="fxviews"):
        for tokens in (8, 12, 20):
            x = torch.randn(2, tokens, 16, requires_grad=True)
            out = compiled(x)
            out.square().sum().backward()
            x_eager = x.detach().requires_grad_()
            expected = norm(x_eager)
            expected.square().sum().backward()
            torch.testing.assert_close(out, expected)
            torch.testing.assert_close(x.grad, x_eager.grad)
    assert "eager PyTorch" not in caplog.text
    # One forward and one backward graph, over symbolic sizes, serve every size.
    assert len(recorder.graphs) == 2
    forward_inputs = [n.meta["val"] for n in recorder.graphs[0].graph.find_nodes(op="placeholder")]
    assert any(isinstance(s, torch.SymInt) for v in forward_inputs for s in getattr(v, "shape", ()))


def test_dynamo_restart_under_dynamic_shapes_with_inner_inductor(caplog):
    """The same restart with Inductor inside: fxviews+Inductor compiles as Inductor alone does,
    and both give eager's numbers at every size."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    inductor = torch.compile(norm, dynamic=True)
    fx_inductor = torch.compile(
        norm, backend="fxviews", options={"inner": "inductor"}, dynamic=True
    )
    with caplog.at_level("WARNING", logger="fxviews"), torch.no_grad():
        for tokens in (8, 12, 20):
            x = torch.randn(2, tokens, 16)
            torch.testing.assert_close(fx_inductor(x), norm(x))
            torch.testing.assert_close(fx_inductor(x), inductor(x))
    assert "eager PyTorch" not in caplog.text
