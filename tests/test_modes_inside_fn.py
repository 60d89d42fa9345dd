"""Modes a function enters inside its body, against eager (Note [Modes inside fn] in
``fxviews/tracing/modes.py``).

Autocast regions (nested, another dtype inside, ``enabled=False`` inside, mixed with
``no_grad``, around composite calls and a ``custom_fwd`` Function) are in the graph as the casts
eager makes, called directly, under the caller's own autocast, under ``vmap``, ``grad`` and
``jvp``, and through the backend; a default dtype or a process setting changed inside ``fn``
is kept where no op reads it and refused (eager, with the construct and line named) where one
does.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
from torch.func import grad, jvp, vmap

import fxviews
from tests.parity import assert_as_eager, assert_routes_match, float_total
from tests.reference import TEST_DEVICE, assert_tree_close, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

#: Autocast on the test device (tests/on_device.sh runs this file on CUDA), its usual dtype there
#: and another one for a region nested in it.
DEVICE = TEST_DEVICE.type
AMP, INNER = (
    (torch.float16, torch.bfloat16) if DEVICE == "cuda" else (torch.bfloat16, torch.float16)
)
torch.manual_seed(0)
W = randn(5, 4)
B = randn(5)


class Doubled(torch.autograd.Function):
    """A Function whose forward autocast casts (``custom_fwd``), as mixed-precision kernels are."""

    @staticmethod
    @torch.amp.custom_fwd(device_type=DEVICE, cast_inputs=AMP)
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        return a * 2

    @staticmethod
    @torch.amp.custom_bwd(device_type=DEVICE)
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def bf16_region(x):
    with torch.autocast(DEVICE, dtype=AMP):
        return x @ W.t()


def disabled_inside(x):
    with torch.autocast(DEVICE, dtype=AMP):
        y = x @ W.t()
        with torch.autocast(DEVICE, enabled=False):
            z = y.float() @ W
    return y.float().sum(-1) + z.sum(-1)


def other_dtype_inside(x):
    with torch.autocast(DEVICE, dtype=AMP):
        y = F.linear(x, W, B)
        with torch.autocast(DEVICE, dtype=INNER):
            z = y.float() @ W
    return y, z


def with_no_grad(x):
    with torch.no_grad(), torch.autocast(DEVICE, dtype=AMP):
        a = x @ W.t()
    with torch.autocast(DEVICE, dtype=AMP):
        b = torch.matmul(x, W.t()) * a
    return b.float() * x.sum()


def custom_fwd_inside(x):
    with torch.autocast(DEVICE, dtype=AMP):
        return Doubled.apply(x) @ W.t()


def composite_calls(x):
    with torch.autocast(DEVICE, dtype=AMP):
        return F.linear(torch.tanh(x), W, B), torch.matmul(x, W.t())


AUTOCAST = [
    bf16_region,
    disabled_inside,
    other_dtype_inside,
    with_no_grad,
    custom_fwd_inside,
    composite_calls,
]


@contextlib.contextmanager
def _caller_autocast(on: bool) -> Iterator[None]:
    with torch.autocast(DEVICE, dtype=AMP, enabled=on):
        yield


def _per_sample(fn: Callable[..., Any], samples: list[torch.Tensor]) -> Any:
    outputs = [fn(sample) for sample in samples]
    return outputs if isinstance(outputs[0], tuple) else [(out,) for out in outputs]


@pytest.mark.parametrize("caller_autocast", [False, True], ids=["plain_caller", "caller_autocast"])
@pytest.mark.parametrize("fn", AUTOCAST, ids=lambda f: f.__name__)
def test_autocast_regions_are_eagers(fn, caller_autocast):
    tf = fxviews.transform(fn, strict=True)
    x = randn(3, 4)
    samples = [randn(3, 4) for _ in range(2)]
    batch = torch.stack(samples, dim=1)  # the batch dim at 1
    with _caller_autocast(caller_autocast):
        for _ in range(2):  # the trace's call, then the cached graph's
            assert_tree_close(tf(x), fn(x))
        # Against the loop over samples: eager vmap of F.linear with a bias returns float32
        # under autocast (its batching rule adds the float32 bias to the bfloat16 product,
        # where a sample's call casts it, as the graph does).
        try:
            batched = vmap(tf, in_dims=1)(batch)
            eager_loop = _per_sample(fn, samples)
            batched = batched if isinstance(batched, tuple) else (batched,)
        except RuntimeError:  # the Function has no vmap rule: eager's refusal too
            with pytest.raises(RuntimeError):
                vmap(fn, in_dims=1)(batch)
            eager_loop = None
    for position, leaf in enumerate(batched if eager_loop else ()):
        # A batched product rounds its terms in another order than a sample's: at bfloat16's
        # 8 significant bits a term moves by 2**-8 of its size, so where terms of the output's
        # scale cancel, an element near zero keeps their rounding (seen up to 2**-7 of it).
        expected = torch.stack([outs[position] for outs in eager_loop])
        scale = float(expected.abs().max().clamp(min=1))
        torch.testing.assert_close(leaf, expected, rtol=3e-2, atol=2**-6 * scale)
    assert_as_eager(lambda: grad(float_total(tf))(x), lambda: grad(float_total(fn))(x))
    tangent = randn(3, 4)
    assert_as_eager(lambda: jvp(tf, (x,), (tangent,)), lambda: jvp(fn, (x,), (tangent,)))
    assert tf.cache_info().eager == 0


@pytest.mark.parametrize("fn", AUTOCAST, ids=lambda f: f.__name__)
def test_autocast_regions_through_the_backend(fn):
    x = randn(3, 4)
    assert_tree_close(torch.compile(fn, backend="fxviews")(x), fn(x))


def test_an_enabled_false_region_is_not_cast_by_the_callers_autocast():
    """The graph holds the casts, so it runs with the caller's autocast off: the region fn
    turned autocast off in stays float32 (cast by the caller's autocast, it was bfloat16)."""

    def region(x):
        with torch.autocast(DEVICE, enabled=False):
            return x @ W.t()

    tf = fxviews.transform(region)
    with torch.autocast(DEVICE, dtype=AMP):
        tf(randn(3, 4))
        assert tf(randn(3, 4)).dtype == torch.float32


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def dtype_sets_a_factory(x):
    with _default_dtype(torch.float64):
        return x + torch.ones(4, device=x.device)


def dtype_promotes_a_python_float(x):
    with _default_dtype(torch.float64):
        return torch.arange(4, device=x.device) * 0.5 + x


def dtype_reads_nothing(x):
    with _default_dtype(torch.float64):
        return (x @ x.t()).sum() * x


def dtype_autocast_and_no_grad(x):
    """Regions nested and mixed: a default dtype no op reads, no_grad, autocast."""
    with _default_dtype(torch.float64), torch.no_grad(), torch.autocast(DEVICE, dtype=AMP):
        scale = (x @ x.t()).float().mean()
    return x * scale


def deterministic_inside(x):
    torch.use_deterministic_algorithms(True)
    try:
        return x.index_add(0, torch.tensor([0, 2, 0], device=x.device), x)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    ("fn", "traced"),
    [
        (dtype_sets_a_factory, False),
        (dtype_promotes_a_python_float, False),
        (dtype_reads_nothing, True),
        (dtype_autocast_and_no_grad, True),
        (deterministic_inside, False),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_settings_changed_inside_fn(fn, traced, caplog):
    x = randn(3, 4)
    with caplog.at_level(logging.ERROR, logger="fxviews"):
        assert_routes_match(fn, [x])  # directly, under vmap and grad, and the backend
    tf = fxviews.transform(fn)
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        caplog.clear()
        assert_tree_close(tf(x), fn(x))
    assert tf.cache_info().eager == (0 if traced else 1)
    if not traced:
        (message,) = {r.getMessage() for r in caplog.records}
        assert "changed to" in message and "test_modes_inside_fn.py" in message
        with pytest.raises(fxviews.TracingError) as err:
            fxviews.transform(fn, strict=True)(x)
        assert err.value.cause == "mode"
    assert torch.get_default_dtype() == torch.float32
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_default_dtype_fn_leaves_set_is_refused_then_traced_in_it():
    """The graph would not set it: the call that sets it runs eagerly, the next (in the state it
    left) is traced."""

    def sets(x):
        torch.set_default_dtype(torch.float64)
        return x * 2

    tf = fxviews.transform(sets)
    try:
        x = randn(3)
        tf(x)
        assert torch.get_default_dtype() == torch.float64
        torch.testing.assert_close(tf(x), x * 2)
        assert tf.cache_info().eager == 1 and tf.cache_info().currsize == 2
    finally:
        torch.set_default_dtype(torch.float32)


def project_then_factory_in_float64(x, w):
    """Work in the caller's settings, then a factory under a default dtype set inside."""
    h = torch.tanh(x @ w)
    with _default_dtype(torch.float64):
        offsets = torch.linspace(0, 1, h.shape[-1], device=x.device)
    return h.sum(0) + offsets


def sets_and_leaves_it_set_after_work(x, w):
    """Work, then a default dtype set and never undone."""
    h = torch.tanh(x @ w)
    torch.set_default_dtype(torch.float64)
    return h + torch.ones(h.shape[-1], device=x.device)


def test_the_backend_compiles_a_graph_up_to_a_setting_changed_inside(caplog):
    """AOTAutograd would make the factory in the caller's default dtype. The graph is compiled
    up to the node that sets it (the projection reaches the inner compiler, forward and
    backward) and runs as eager PyTorch from there: eager's dtype, values and gradients."""
    from tests.test_backend import Recorder

    x, w = randn(5, 3), randn(3, 4)

    def run(fn):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xs, ws)
        out.sum().backward()
        return out, xs.grad, ws.grad

    expected = run(project_then_factory_in_float64)
    recorder = Recorder()
    compiled = torch.compile(
        project_then_factory_in_float64, backend=fxviews.backend(inner=recorder)
    )
    with caplog.at_level(logging.INFO, logger="fxviews"):
        got = run(compiled)
    assert got[0].dtype == expected[0].dtype == torch.float64
    assert_tree_close(got, expected)
    assert "compiles this graph up to 'set_default_dtype'" in caplog.text
    assert "runs this graph as eager" not in caplog.text
    forward_ops = {getattr(n.target, "__name__", "") for n in recorder.graphs[-2].graph.nodes}
    assert "mm.default" in forward_ops and "linspace.default" not in forward_ops
    assert torch.get_default_dtype() == torch.float32


def test_a_setting_left_changed_runs_the_graph_eagerly(caplog):
    """A setting the graph does not restore: compiling part of it again would happen in the
    setting its lowering left, so the whole graph runs as eager PyTorch, as eager's."""
    x, w = randn(5, 3), randn(3, 4)
    try:
        expected = sets_and_leaves_it_set_after_work(x, w)
    finally:
        torch.set_default_dtype(torch.float32)
    try:
        with caplog.at_level(logging.INFO, logger="fxviews"):
            got = torch.compile(sets_and_leaves_it_set_after_work, backend="fxviews")(x, w)
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert_tree_close(got, expected)
    assert got.dtype == torch.float64
    assert "runs this graph as eager" in caplog.text
