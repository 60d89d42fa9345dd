"""The tracing path shared by ``trace``, ``explain`` and ``transform``.

Fake mode first, real mode where PyTorch's fake mode falls short, never real mode for what
depends on tensor values, closures over real tensors everywhere, and a process left exactly as
it was after any failure. References are eager PyTorch.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap

import fxviews
import fxviews.tracing.trace_guard
from fxviews.passes.schema import TRACED_WITH
from tests.reference import (
    assert_tree_close,
    assert_vmap_matches_per_sample,
    make_samples,
)

WEIGHT, BIAS = torch.randn(3), torch.randn(3)


def layer_norm_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (3,), WEIGHT, BIAS))


def jvp_layer_norm(x: torch.Tensor, t: torch.Tensor):
    return jvp(layer_norm_gelu, (x,), (t,))


def branchy(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if x.sum() > 0 else -x


def data_dependent_length(x: torch.Tensor) -> torch.Tensor:
    return x[: int(x.sum())]


def _eager_still_works() -> None:
    """The checks a broken process fails: eager vmap of jvp and grad, against closed forms."""
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    primal, tangent = vmap(lambda a, b: jvp(torch.sin, (a,), (b,)))(x, t)
    torch.testing.assert_close(primal, x.sin())
    torch.testing.assert_close(tangent, x.cos() * t)
    torch.testing.assert_close(vmap(grad(lambda a: a.pow(2).sum()))(x), 2 * x)


@pytest.fixture
def pytorch_zero_tangents(monkeypatch):
    """Fake mode with PyTorch's own zero tangents (Note [Zero tangents in fake mode] undone).

    PyTorch's fake mode then fails on forward AD through LayerNorm, as it does without
    fxviews: the fake-mode failure the real-mode fallback is for, on a program that needs it.
    """
    monkeypatch.setattr(fxviews.tracing.trace_guard, "efficient_zero_tensor", None)


def test_forward_ad_through_layer_norm_traces_in_fake_mode():
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    gm = fxviews.trace(jvp_layer_norm, x, t)
    assert gm.meta[TRACED_WITH] == "fake mode"
    assert_tree_close(gm(x, t), jvp_layer_norm(x, t))


def test_real_mode_takes_over_from_a_known_fake_mode_limitation(pytorch_zero_tangents):
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    gm = fxviews.trace(jvp_layer_norm, x, t)
    assert gm.meta[TRACED_WITH].startswith("real mode (fake mode failed:")
    assert_tree_close(gm(x, t), jvp_layer_norm(x, t))
    result = fxviews.rewrite(gm)
    assert result.traced_with == gm.meta[TRACED_WITH]
    assert "traced in real mode" in str(result)


def _norm_layers() -> dict[str, nn.Module]:
    """Each normalization layer with random affine parameters and running statistics."""
    torch.manual_seed(0)
    layers = {
        "layer_norm": nn.LayerNorm(4),
        "batch_norm_eval": nn.BatchNorm2d(4).eval(),
        "batch_norm_train": nn.BatchNorm2d(4, track_running_stats=False),
        "group_norm": nn.GroupNorm(2, 4),
        "instance_norm": nn.InstanceNorm2d(4, affine=True),
        "rms_norm": nn.RMSNorm(4),
    }
    with torch.no_grad():
        for layer in layers.values():
            for tensor in [*layer.parameters(), *layer.buffers()]:
                if tensor.is_floating_point():
                    tensor.uniform_(0.5, 1.5)
    return layers


NORM_LAYERS = _norm_layers()


def _norm_program(layer: nn.Module, derivative: str):
    """``derivative`` of GELU after ``layer``, over a (2, 4, 2, 2) sample (channels moved
    last for the layers that normalize the last dim)."""

    def block(x):
        if isinstance(layer, (nn.LayerNorm, nn.RMSNorm)):
            return F.gelu(layer(x.movedim(1, -1)).movedim(-1, 1))
        return F.gelu(layer(x))

    if derivative == "jvp":
        return lambda x, t: jvp(block, (x,), (t,))
    if derivative == "jacfwd":
        return lambda x, t: jacfwd(lambda y: block(y).sum((0, 2)))(x) * t.sum()
    return lambda x, t: hessian(lambda y: (block(y) * t).sum())(x)


@pytest.mark.parametrize("derivative", ["jvp", "jacfwd", "hessian"])
@pytest.mark.parametrize("name", list(NORM_LAYERS))
def test_forward_ad_through_norm_layers_traces_once_in_fake_mode(name, derivative):
    """No failed fake attempt, no real trace; vmap of the transformed program at batch dims 0,
    1 and last equals the program run eagerly one sample at a time."""
    fn = _norm_program(NORM_LAYERS[name], derivative)
    samples = make_samples([(2, 4, 2, 2)] * 2, batch=3, seed=len(name), dtype=torch.float32)
    assert fxviews.trace(fn, *samples[0]).meta[TRACED_WITH] == "fake mode"
    tf = fxviews.transform(fn, strict=True)
    assert_vmap_matches_per_sample(tf, fn, samples, atol=1e-4, rtol=1e-4)
    assert tf.cache_info().eager == 0


def _two_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sin(), x[::2] * x[1::2]


#: Jacobians whose standard basis spans two tensors: before torch 2.13, PyTorch places each
#: tensor's block with int() of a tensor (torch_internals.traceable_jacobian_basis).
JACOBIANS = {
    "jacrev, two outputs": (lambda x: jacrev(_two_outputs)(x), 1),
    "jacrev, two outputs, chunks of 3": (lambda x: jacrev(_two_outputs, chunk_size=3)(x), 1),
    "jacfwd, two inputs": (lambda x, y: jacfwd(torch.mul, argnums=(0, 1))(x, y), 2),
    "hessian, two inputs": (
        lambda x, y: hessian(lambda a, b: (a * b).sin().sum(), (0, 1))(x, y),
        2,
    ),
}


@pytest.mark.parametrize("name", list(JACOBIANS))
def test_jacobians_over_several_tensors_trace_in_fake_mode(name):
    fn, n_args = JACOBIANS[name]
    samples = make_samples([(6,)] * n_args, batch=3, seed=len(name), dtype=torch.float64)
    gm = fxviews.trace(fn, *samples[0])
    assert gm.meta[TRACED_WITH] == "fake mode"
    assert_tree_close(gm(*samples[1]), fn(*samples[1]))
    assert_vmap_matches_per_sample(fxviews.transform(fn, strict=True), fn, samples)


def test_plain_functions_trace_in_fake_mode():
    gm = fxviews.trace(lambda x: x.t().contiguous(), torch.randn(2, 3))
    assert gm.meta[TRACED_WITH] == "fake mode"


def test_real_mode_trace_keeps_exact_layouts(pytorch_zero_tangents):
    """Real mode records views at offset 0; the recomputed metadata has the true offset."""
    x = torch.randn(6, 3)[1:]  # storage offset 3

    def f(x):
        y = x[1:]
        return jvp(layer_norm_gelu, (y,), (y,))

    gm = fxviews.trace(f, x)
    assert gm.meta[TRACED_WITH].startswith("real mode")
    slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert slices and slices[0].meta["val"].storage_offset() == 6


def test_real_mode_trace_leaves_the_random_stream_alone(pytorch_zero_tangents):
    def noisy_jvp(x, t):
        return jvp(lambda a: layer_norm_gelu(a) + torch.rand(3), (x,), (t,))

    x, t = torch.randn(2, 3), torch.randn(2, 3)
    torch.manual_seed(0)
    fxviews.trace(noisy_jvp, x, t)
    after_trace = torch.rand(5)
    torch.manual_seed(0)
    assert torch.equal(after_trace, torch.rand(5))


def test_real_mode_trace_does_not_write_closed_over_buffers(pytorch_zero_tangents):
    """The graph writes the buffer when it runs; tracing it must not write it too."""
    counter = torch.zeros(3)

    def counts(x, t):
        counter.add_(1)
        return jvp(layer_norm_gelu, (x,), (t,))

    x, t = torch.randn(2, 3), torch.randn(2, 3)
    gm = fxviews.trace(counts, x, t)
    assert gm.meta[TRACED_WITH].startswith("real mode")
    assert torch.equal(counter, torch.zeros(3))
    gm(x, t)
    assert torch.equal(counter, torch.ones(3))


def test_real_mode_refuses_data_dependent_ops(pytorch_zero_tangents):
    """A real trace would bake the example's nonzero count into the graph."""

    def f(x, t):
        primal, tangent = jvp(layer_norm_gelu, (x,), (t,))
        return primal[primal > 0]

    with pytest.raises(fxviews.TracingError) as info:
        fxviews.trace(f, torch.randn(2, 3), torch.randn(2, 3))
    assert info.value.cause == "data-dependent shape"
    _eager_still_works()


@pytest.mark.parametrize(
    "fn, cause",
    [(branchy, "control flow"), (data_dependent_length, "data-dependent shape")],
    ids=["control_flow", "data_dependent_shape"],
)
def test_errors_name_the_cause_and_the_function(fn, cause):
    with pytest.raises(fxviews.TracingError, match=fn.__name__) as info:
        fxviews.trace(fn, torch.ones(4))
    assert info.value.cause == cause
    _eager_still_works()


def test_a_failed_trace_inside_jvp_leaves_pytorch_working():
    """Fake mode fails deep inside forward AD here; every later eager call must still work."""

    def fails(x, t):
        primal, tangent = jvp(layer_norm_gelu, (x,), (t,))
        return primal if primal.sum() > 0 else tangent

    with pytest.raises(fxviews.TracingError):
        fxviews.trace(fails, torch.randn(2, 3), torch.randn(2, 3))
    _eager_still_works()
    with pytest.raises(fxviews.TracingError):
        fxviews.transform(fails, strict=True)(torch.randn(2, 3), torch.randn(2, 3))
    _eager_still_works()


def test_closures_over_parameters_trace_and_explain():
    w = torch.randn(3, 3)
    x = torch.randn(4, 3)
    for fn in (
        lambda x: jvp(lambda a: (a @ w).tanh(), (x,), (x,)),
        lambda x: grad(lambda a: (a @ w).tanh().sum())(x),
    ):
        gm = fxviews.trace(fn, x)
        assert_tree_close(gm(x), fn(x))
        assert_tree_close(fxviews.explain(fn, x).graph_module(x), fn(x))


def test_modules_trace_and_gradients_reach_their_parameters():
    module = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.ReLU(inplace=True))
    x = torch.randn(5, 3)
    gm = fxviews.trace(module, x)
    gm(x).sum().backward()
    expected = [p.grad.clone() for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    module(x).sum().backward()
    for got, want in zip(expected, (p.grad for p in module.parameters()), strict=True):
        torch.testing.assert_close(got, want)


def test_in_place_updates_reach_buffers():
    bn = nn.BatchNorm1d(3).train()
    x = torch.randn(5, 3)
    gm = fxviews.trace(bn, x)
    assert torch.equal(bn.running_mean, torch.zeros(3))  # tracing does not update it
    gm(x)
    reference = nn.BatchNorm1d(3).train()
    reference(x)
    torch.testing.assert_close(bn.running_mean, reference.running_mean)


def test_explain_of_jacfwd_with_default_arguments():
    def scaled(x, scale=2.0):
        return (x * scale).sin().sum()

    x = torch.randn(3)
    result = fxviews.explain(jacfwd(scaled), x)
    torch.testing.assert_close(result.graph_module(x), jacfwd(scaled)(x))


def test_trace_keeps_partial_and_module_names_in_errors():
    with pytest.raises(fxviews.TracingError, match=r"partial\(branchy\)"):
        fxviews.trace(functools.partial(branchy), torch.ones(2))

    class Branchy(nn.Module):
        def forward(self, x):
            return branchy(x)

    with pytest.raises(fxviews.TracingError, match="Branchy"):
        fxviews.trace(Branchy(), torch.ones(2))


def test_tracing_does_not_write_closed_over_buffers_in_fake_mode():
    """make_fx runs ops on real constants for real, even in fake mode: undone after tracing."""
    counter = torch.zeros(3)

    def counts(x):
        counter.add_(1)
        return x * 2

    fxviews.trace(counts, torch.randn(3))
    assert torch.equal(counter, torch.zeros(3))
    fxviews.transform(counts)(torch.randn(3))  # traced once, run once: as eager
    assert torch.equal(counter, torch.ones(3))


def reads_values_in_numpy(x):
    return torch.from_numpy(x.numpy() * 2) + x


def test_no_real_mode_for_failures_it_would_bake_in():
    """Fake mode cannot run .numpy(); a real trace would make the example's values a constant.
    Only known fake-mode limitations go to real mode: this one is untraceable, and transform
    runs it eagerly instead, with eager's values for every input."""
    with pytest.raises(fxviews.TracingError, match="reads_values_in_numpy") as info:
        fxviews.trace(reads_values_in_numpy, torch.randn(3))
    assert info.value.cause == "untraceable"
    _eager_still_works()
    tf = fxviews.transform(reads_values_in_numpy)
    for _ in range(2):
        x = torch.randn(3)
        assert torch.equal(tf(x), reads_values_in_numpy(x))
    assert tf.cache_info().eager == 1


def test_failed_trace_undoes_metadata_changes_of_closed_over_tensors():
    weight = torch.randn(2, 3)

    def transposes(x):
        weight.t_()
        return x * 2

    with pytest.raises(fxviews.TracingError):
        fxviews.trace(transposes, torch.randn(3))
    assert weight.shape == (2, 3) and weight.stride() == (3, 1)
    _eager_still_works()


def test_every_trace_records_exact_layouts_not_cached_ones():
    """FakeTensor's dispatch cache replays select_scatter at offset 0 on a second trace; the
    real kernel keeps its input's offset, and the engine reads layouts as facts."""

    def scatter_row(x, s):
        return torch.select_scatter(x[1:], s, 0, 0)

    x, s = torch.randn(4, 3), torch.randn(3)
    expected = scatter_row(x, s).storage_offset()
    for _ in range(3):
        gm = fxviews.trace(scatter_row, x, s)
        (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.select_scatter.default]
        assert node.meta["val"].storage_offset() == expected


def test_a_traced_graph_keeps_detach_as_a_gradient_cut():
    """The graph runs again under autograd (grad around a transformed function): its detach must
    stop gradients as eager's does (make_fx turns it into alias by default since torch 2.15)."""

    def f(x):
        return (x.detach() * x).sum()

    x = torch.randn(4)
    gm = fxviews.trace(f, x)
    assert torch.ops.aten.detach.default in [n.target for n in gm.graph.nodes]
    torch.testing.assert_close(torch.func.grad(gm)(x), torch.func.grad(f)(x))
    # transform's fake-mode path (the .item() sends it there) keeps it as well.
    g = fxviews.transform(lambda x: f(x) * (x.abs().max().item() > -1))
    torch.testing.assert_close(torch.func.grad(g)(x), torch.func.grad(f)(x))
