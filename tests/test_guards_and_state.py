"""Guards and state: a cached graph is reused only where eager would compute the same thing, and
after N calls everything a call touches equals eager's after N calls.

Every test runs the same program twice from the same random state, once through fxviews and once
eagerly on a deep copy, and compares outputs, parameters, buffers, closed-over tensors and the
random stream after each call (Note [The state a graph bakes in], ``fxviews/state/guard.py``).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
import torch.nn.utils.prune
from torch import nn
from torch.func import functional_call, vmap

import fxviews
from fxviews.bench import models
from fxviews.state.guard import StateGuard, process_state
from tests.fresh_python import run_fresh_python
from tests.real_models import require_zoo_or_skip
from tests.reference import (
    TEST_DEVICE,
    assert_tree_close,
    on_test_device,
    per_sample_reference,
    randn,
    rng_states,
    stack_batched,
)

# --------------------------------------------------------------------------------------------
# Harness: the same calls through fxviews and eagerly, from the same random state.
# --------------------------------------------------------------------------------------------


def conv_bn_stack() -> nn.Module:
    """Conv, BatchNorm, Dropout, strided conv, Linear: on the test device."""
    return on_test_device(
        nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Conv2d(4, 4, 3, stride=2),
            nn.BatchNorm2d(4, momentum=0.5),
            nn.Flatten(),
            nn.Linear(4 * 3 * 3, 5),
            nn.BatchNorm1d(5),
        )
    )


def mlp_dropout_bn() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.BatchNorm1d(8), nn.Tanh())


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, by name (num_batches_tracked included)."""
    return {name: t.detach().clone() for name, t in module.state_dict(keep_vars=True).items()}


def assert_same_state(actual: nn.Module, expected: nn.Module) -> None:
    got, want = state_of(actual), state_of(expected)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


def run_twice(
    model: nn.Module,
    through_fxviews: Callable[[nn.Module], Callable[..., Any]],
    calls: list[Callable[[nn.Module], Any]],
) -> None:
    """Run ``calls`` (each given the model and the function to call) on ``model`` through
    ``through_fxviews(model)`` and on a deep copy eagerly, from the same seed; after every call
    the outputs, the models' state and the random streams (CPU's and the test device's) must
    be equal."""
    twin = copy.deepcopy(model)
    transformed = through_fxviews(model)
    seed = torch.seed()
    outputs, states, streams = [], [], []
    torch.manual_seed(seed)
    for call in calls:
        outputs.append(call(model, transformed))
        states.append(state_of(model))
        streams.append(rng_states())
    torch.manual_seed(seed)
    for i, call in enumerate(calls):
        expected = call(twin, twin)
        assert_tree_close(outputs[i], expected)
        for name, value in state_of(twin).items():
            torch.testing.assert_close(
                states[i][name], value, msg=lambda m, n=name, i=i: f"call {i}, {n}: {m}"
            )
        for before, now in zip(streams[i], rng_states(), strict=True):
            assert torch.equal(before, now), f"random stream differs after call {i}"


def plain(model: nn.Module) -> Callable[..., Any]:
    return fxviews.transform(model)


def through_functional_call(model: nn.Module) -> Callable[..., Any]:
    inner = fxviews.transform(lambda params, x: functional_call(model, params, (x,)))
    return lambda x: inner(dict(model.named_parameters()) | dict(model.named_buffers()), x)


def compiled(model: nn.Module) -> Callable[..., Any]:
    return torch.compile(model, backend="fxviews")


def inside_compile(model: nn.Module) -> Callable[..., Any]:
    """A transformed model called by a function torch.compile compiles (a graph break)."""
    transformed = fxviews.transform(model)
    return torch.compile(lambda x: transformed(x) + 0, backend="aot_eager")


def call_with(x: torch.Tensor) -> Callable[[nn.Module, Callable[..., Any]], Any]:
    return lambda model, fn: fn(x)


def set_mode(training: bool, x: torch.Tensor) -> Callable[[nn.Module, Callable[..., Any]], Any]:
    def call(model: nn.Module, fn: Callable[..., Any]) -> Any:
        model.train(training)
        return fn(x)

    return call


# --------------------------------------------------------------------------------------------
# 1. Module modes and process state are part of the cache key.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [plain, through_functional_call, compiled, inside_compile], ids=lambda p: p.__name__
)
def test_mode_flips_follow_eager(path: Callable[[nn.Module], Callable[..., Any]]) -> None:
    """train -> eval -> train -> eval: Dropout and BatchNorm behave as eager in every phase, and
    an entry traced for a mode is found again when the mode comes back."""
    x = randn(8, 6)
    modes = [True, True, False, False, True, False]
    run_twice(on_test_device(mlp_dropout_bn()), path, [set_mode(m, x) for m in modes])


_INSIDE_COMPILE = """
import json, warnings
import torch, fxviews

def windows(x):
    y = x.clone()
    y[1:3].mul_(2)
    return y.as_strided((3, 2), (1, 2), 1) * 3

# Under vmap transform reads each sample as contiguous, where eager vmap reads the batch's
# memory: the two readings differ once the samples are not contiguous (called directly, the
# transform reads an argument as eager does).
tf = fxviews.transform(windows)
per_sample = torch.func.vmap(tf, in_dims=1)
outer = torch.compile(lambda x: per_sample(x).sin(), backend="aot_eager")
x, xt = torch.randn(4, 3, 5), torch.randn(5, 3, 4).permute(2, 1, 0)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = [outer(x), outer(x), outer(xt), outer(xt)]
want = [per_sample(t).sin() for t in (x, x, xt, xt)]
try:
    torch.compile(lambda x: tf(x[:, 0]).sin(), backend="eager", fullgraph=True)(x)
    refused = ""
except Exception as error:
    refused = f"{type(error).__name__}: {error}"
print(json.dumps({
    "same_as_transform": [torch.equal(a, b) for a, b in zip(got, want)],
    "eager_reads_otherwise": not torch.allclose(
        torch.func.vmap(windows, in_dims=1)(xt).sin(), want[2]
    ),
    "warnings": [str(w.message)[:200] for w in caught],
    "hits": tf.cache_info().hits,
    "refused": refused,
}))
"""


def test_transformed_function_inside_torch_compile_runs_its_cached_graph() -> None:
    """Dynamo calls a transformed function as opaque Python (a graph break), so it runs through
    its cache and guards with the transform's reading of as_strided, not eager's, without a
    warning, also where its first call is a compiled one (a fresh process). ``fullgraph=True``
    refuses it, saying why."""
    result = json.loads(run_fresh_python(_INSIDE_COMPILE).splitlines()[-1])
    assert result["same_as_transform"] == [True] * 4
    assert result["eager_reads_otherwise"], "the program must tell the two readings apart"
    assert result["warnings"] == []
    assert result["hits"] >= 4  # the compiled calls after the first, and the reference calls
    assert "Unsupported" in result["refused"]
    assert "fxviews.transform runs its own cached, rewritten graph" in result["refused"]


def test_mode_flip_reuses_the_entry_traced_for_that_mode() -> None:
    model = mlp_dropout_bn()
    tf = fxviews.transform(model)
    x = torch.randn(4, 6)
    tf(x)
    model.eval()
    tf(x)
    model.train()
    tf(x)
    model.eval()
    tf(x)
    info = tf.cache_info()
    assert (info.misses, info.currsize, info.hits) == (2, 2, 2), info


def test_a_submodule_flipped_alone_is_seen() -> None:
    model = mlp_dropout_bn()
    run_twice(
        model,
        plain,
        [
            call_with(torch.randn(5, 6)),
            lambda m, fn: (m[1].eval(), fn(torch.ones(5, 6)))[1],  # only the Dropout
            lambda m, fn: (m[2].eval(), fn(torch.ones(5, 6)))[1],  # then the BatchNorm too
        ],
    )


class Holder:
    """A module reached through an attribute of an object the function is a method of."""

    def __init__(self) -> None:
        self.net = mlp_dropout_bn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * 2


GLOBAL_NET = mlp_dropout_bn()


def uses_global_net(x: torch.Tensor) -> torch.Tensor:
    return GLOBAL_NET(x) + 1


def apply(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net(x).sin()


@pytest.mark.parametrize("how", ["bound method", "global", "partial", "closure"])
def test_modules_reached_every_way_are_guarded(how: str) -> None:
    holder = Holder()
    net = {"bound method": holder.net, "global": GLOBAL_NET}.get(how, mlp_dropout_bn())
    fn = {
        "bound method": holder.forward,
        "global": uses_global_net,
        "partial": functools.partial(apply, net),
        "closure": lambda x: apply(net, x),
    }[how]
    tf = fxviews.transform(fn)
    x = torch.randn(6, 6)
    tf(x)
    net.eval()
    try:
        torch.testing.assert_close(tf(x), fn(x))
    finally:
        net.train()


def test_process_state_is_guarded() -> None:
    """Grad mode, autocast and the default dtype change what fn computes: each gets its entry."""

    def fn(x: torch.Tensor) -> Any:
        scale = torch.ones(3) * (2.0 if torch.is_grad_enabled() else 3.0)
        return (x @ x.t()).sum(0), scale

    tf = fxviews.transform(fn)
    x = torch.randn(3, 4)
    assert_tree_close(tf(x), fn(x))
    with torch.no_grad():
        assert_tree_close(tf(x), fn(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, want = tf(x), fn(x)
        assert out[0].dtype == want[0].dtype == torch.bfloat16
        assert_tree_close(out, want)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert tf(x)[1].dtype == fn(x)[1].dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert tf(x)[0].dtype == tf(x)[1].dtype == torch.float32
    assert tf.cache_info().currsize == 4


def test_guards_hold_under_vmap_after_a_flip() -> None:
    """Per-sample outputs of an eval-mode model under vmap, after a first call in train mode."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.9), nn.Tanh())
    tf = fxviews.transform(model)
    x = torch.randn(3, 4)
    tf(x)
    model.eval()
    samples = [(torch.randn(4),) for _ in range(5)]
    for in_dims in [(0,), (1,)]:
        actual = vmap(tf, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, per_sample_reference(model, samples, in_dims))


def test_state_guard_reports_what_changed() -> None:
    net = nn.Dropout()
    guard = StateGuard(process_state(), [net])
    assert guard.check() and guard.failure() == ""
    net.eval()
    assert not guard.check() and "Dropout" in guard.failure()
    net.train()
    with torch.no_grad():
        assert not guard.check() and "grad_mode" in guard.failure()


# --------------------------------------------------------------------------------------------
# 2. State parity: buffers, parameters, closed-over tensors and the random stream after N calls.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [plain, through_functional_call, compiled, inside_compile], ids=lambda p: p.__name__
)
def test_train_mode_conv_bn_state_after_each_call(
    path: Callable[[nn.Module], Callable[..., Any]],
) -> None:
    """N calls of a train-mode conv+BN stack at three batch sizes (each a new signature, each
    repeated): running stats, num_batches_tracked, outputs and random stream as eager's."""
    torch.manual_seed(0)
    calls = [call_with(randn(b, 3, 8, 8)) for b in (2, 2, 3, 5, 3, 2)]
    model = conv_bn_stack()
    run_twice(model, path, calls)


@pytest.mark.parametrize("layout", ["channels_last", "sliced"])
def test_train_mode_conv_bn_state_on_layouts_eager_produces(layout: str) -> None:
    """The same calls on channels_last and strided-slice inputs (the graph was traced on
    contiguous ones): outputs, buffers and random stream after each call as eager's."""

    def laid_out(batch: int) -> torch.Tensor:
        if layout == "channels_last":
            return randn(batch, 3, 8, 8).to(memory_format=torch.channels_last)
        return randn(batch, 3, 8, 16)[..., ::2]

    torch.manual_seed(0)
    calls = [call_with(laid_out(b)) for b in (2, 3, 2)]
    run_twice(conv_bn_stack(), plain, calls)


@pytest.mark.parametrize("name", ["resnet", "mobilenet", "encoder"])
def test_train_mode_models_state_after_each_call(name: str) -> None:
    """The bench's own small models (residual conv+BN blocks; inverted residuals with
    depthwise convs and BN; attention blocks with Dropout) trained as written: N train-mode
    calls at two batch sizes, then an eval-mode call, each compared with an eager twin on
    outputs, every buffer and parameter, and the random stream."""
    model = on_test_device(models.build(name).train())
    shape = models.sample_shape(name)
    torch.manual_seed(0)
    train = [call_with(randn(b, *shape)) for b in (2, 2, 3, 2)]
    run_twice(model, plain, [*train, set_mode(False, randn(2, *shape))])


def test_conv_bn_stack_runs_as_a_graph() -> None:
    tf = fxviews.transform(conv_bn_stack())
    tf(randn(2, 3, 8, 8))
    assert tf.cache_info().eager == 0


def test_cumulative_batch_norm_reads_its_counter_every_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """BatchNorm with momentum=None computes its factor as 1 / float(num_batches_tracked) in
    Python: a graph would keep the first call's factor. It runs eagerly, with eager's state."""
    bn, twin = (on_test_device(nn.BatchNorm1d(3, momentum=None)) for _ in range(2))
    tf = fxviews.transform(bn)
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        for _ in range(3):
            x = randn(4, 3)
            torch.testing.assert_close(tf(x), twin(x))
            assert_same_state(bn, twin)
    assert tf.cache_info().eager == 1
    # The message names torch.nn's line that reads the counter (no line of the user's ran), a
    # buffer the graph takes as an input: a Python number made from a tensor value.
    assert "float(self.num_batches_tracked)" in caplog.text
    assert "turns a tensor value into a Python number" in caplog.text


def test_state_parity_under_vmap_of_per_sample_grads() -> None:
    """Per-sample gradients of an eval-mode conv+BN stack through functional_call: the graph
    reads the buffers and writes nothing, as eager does."""
    model = conv_bn_stack().eval()
    before = state_of(model)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (x.unsqueeze(0),)).square().sum()

    grads = vmap(fxviews.transform(torch.func.grad(loss)), in_dims=(None, 0))(
        params, randn(4, 3, 8, 8)
    )
    assert all(g.shape[0] == 4 for g in grads.values())
    for name, value in state_of(model).items():
        assert torch.equal(value, before[name]), name


class NormsOverClosedStats(nn.Module):
    """InstanceNorm with tracked stats, and F.batch_norm over tensors held as plain attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.instance = nn.InstanceNorm1d(4, track_running_stats=True)
        # Not buffers: closed-over plain tensors (which Module.to does not move).
        self.mean = torch.zeros(4, device=TEST_DEVICE)
        self.var = torch.ones(4, device=TEST_DEVICE)
        self.count = torch.zeros((), device=TEST_DEVICE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(x, self.mean, self.var, training=True, momentum=0.2)
        self.count.add_(1)
        return self.instance(y)

    def closed_over(self) -> list[torch.Tensor]:
        return [self.mean, self.var, self.count]


def test_instance_norm_and_closed_over_stats_after_each_call() -> None:
    model = on_test_device(NormsOverClosedStats())
    twin = copy.deepcopy(model)
    tf = fxviews.transform(model)
    for step in range(4):
        x = randn(3, 4, 6)
        torch.testing.assert_close(tf(x), twin(x))
        assert_same_state(model, twin)
        for got, want in zip(model.closed_over(), twin.closed_over(), strict=True):
            torch.testing.assert_close(got, want, msg=f"closed-over tensor after call {step}")


def data_dependent_bn(bn: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = bn(x)
        return y if y.sum() > 0 else -y  # a Python branch on values: eager for good

    return fn


def test_eager_fallback_updates_state_once() -> None:
    bn, twin = (on_test_device(nn.BatchNorm1d(3)) for _ in range(2))
    tf = fxviews.transform(data_dependent_bn(bn))
    for _ in range(3):
        x = randn(4, 3)
        torch.testing.assert_close(tf(x), data_dependent_bn(twin)(x))
        assert_same_state(bn, twin)
    assert tf.cache_info().eager == 1


def through_item(model: nn.Module) -> Callable[..., Any]:
    """A function the recording refuses (a value leaves through .item() into the graph's math):
    it is traced in fake mode."""
    return fxviews.transform(lambda x: model(x) * (x.abs().max().item() > -1.0))


def test_fake_mode_path_state_after_each_call() -> None:
    calls = [call_with(randn(4, 6)) for _ in range(3)]
    run_twice(on_test_device(mlp_dropout_bn()), through_item, calls)


# --- every aten op that writes an argument other than self, by its schema --------------------


def ops_writing_other_arguments() -> list[str]:
    """Every aten overload whose schema marks a non-first argument written, ``out`` variants
    (keyword-only written arguments) excepted: found from the schemas, not listed by hand."""
    found = []
    for full_name in sorted(torch._C._dispatch_get_all_op_names()):
        if not full_name.startswith("aten::"):
            continue
        name, _, overload = full_name[len("aten::") :].partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        arguments = op._schema.arguments
        written = [a for a in arguments if a.alias_info is not None and a.alias_info.is_write]
        if any(a.kwarg_only for a in written):
            continue
        if any(a is not arguments[0] for a in written):
            found.append(f"{name}.{overload or 'default'}")
    return found


def _floats(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def _adam_like(op: Any, tensor_lr: bool, amsgrad_lists: int) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        params = [_floats(3), _floats(2)]
        state = [[torch.zeros_like(p) for p in params] for _ in range(amsgrad_lists)]
        steps = [torch.ones(()) for _ in params]  # stepped before the update, as Adam does
        lr = torch.tensor(0.1) if tensor_lr else 0.1

        def fn(x: torch.Tensor) -> Any:
            grads = [p * x.sum() for p in params]
            op(params, grads, *state, steps, lr=lr, beta1=0.9, beta2=0.99, weight_decay=0.0,
               eps=1e-8, amsgrad=True, maximize=False)  # fmt: skip
            return [p * 1 for p in params]

        fn.closed_over = [*params, *[t for ts in state for t in ts], *steps]  # type: ignore[attr-defined]
        return fn

    return make


def _sgd(tensor_lr: bool) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        params, momenta = [_floats(3)], [torch.zeros(3)]
        lr = torch.tensor(0.1) if tensor_lr else 0.1

        def fn(x: torch.Tensor) -> Any:
            grads = [p * x.sum() for p in params]
            torch.ops.aten._fused_sgd_(params, grads, momenta, weight_decay=0.0, momentum=0.9,
                                       lr=lr, dampening=0.0, nesterov=False, maximize=False,
                                       is_first_step=False)  # fmt: skip
            return [p * 1 for p in params]

        fn.closed_over = [*params, *momenta]  # type: ignore[attr-defined]
        return fn

    return make


def _adagrad(tensor_lr: bool) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        params, sums, steps = [_floats(3)], [torch.zeros(3)], [torch.ones(())]
        lr = torch.tensor(0.1) if tensor_lr else 0.1

        def fn(x: torch.Tensor) -> Any:
            grads = [p * x.sum() for p in params]
            torch.ops.aten._fused_adagrad_(params, grads, sums, steps, lr=lr, lr_decay=0.0,
                                           weight_decay=0.0, eps=1e-10, maximize=False)  # fmt: skip
            return [p * 1 for p in params]

        fn.closed_over = [*params, *sums, *steps]  # type: ignore[attr-defined]
        return fn

    return make


def _with_state(*tensors: torch.Tensor) -> Callable[[Callable], Callable]:
    def attach(fn: Callable) -> Callable:
        fn.closed_over = list(tensors)  # type: ignore[attr-defined]
        return fn

    return attach


def _batch_norm_op(op: Any, *flags: Any) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        mean, var = torch.zeros(3), torch.ones(3)
        return _with_state(mean, var)(lambda x: op(x, None, None, mean, var, *flags))

    return make


def _cum_helper(op: Any) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        values, indices = torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.long)
        return _with_state(values, indices)(lambda x: (op(x, values, indices, 0), values * 1)[1])

    return make


def _observer(op: Any, *extra: Any) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        on, fq = torch.ones(1, dtype=torch.long), torch.ones(1, dtype=torch.long)
        low, high = torch.tensor([-1.0]), torch.tensor([1.0])
        scale, zero = torch.ones(1), torch.zeros(1, dtype=torch.int32)

        def fn(x: torch.Tensor) -> Any:
            return op(x, on, fq, low, high, scale, zero, 0.01, 0, 255, 0, *extra)

        return _with_state(low, high, scale, zero)(fn)

    return make


def _amp_unscale() -> Callable[[torch.Tensor], Any]:
    found_inf, inv_scale = torch.zeros(1), torch.tensor([0.5])

    def fn(x: torch.Tensor) -> Any:
        grads = [x * 2, x.exp() * 1e38]  # overflows to inf for some samples: found_inf is set
        torch.ops.aten._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return grads

    return _with_state(found_inf)(fn)


def _amp_update_scale() -> Callable[[torch.Tensor], Any]:
    scale, tracker = torch.tensor([4.0]), torch.zeros(1, dtype=torch.int32)

    def fn(x: torch.Tensor) -> Any:
        found_inf = (x.sum() < 0).float().reshape(1)
        torch.ops.aten._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
        return x * scale

    return _with_state(scale, tracker)(fn)


def _rrelu(op: Any) -> Callable[[], Callable]:
    def make() -> Callable[[torch.Tensor], Any]:
        noise = torch.zeros(4, 3)
        return _with_state(noise)(lambda x: op(x * 1, noise, 0.1, 0.3, True))

    return make


aten = torch.ops.aten
#: How to call each op of ops_writing_other_arguments() on closed-over state, on this machine.
WRITERS_OF_OTHER_ARGUMENTS: dict[str, Callable[[], Callable]] = {
    "_amp_foreach_non_finite_check_and_unscale_.default": _amp_unscale,
    "_amp_update_scale_.default": _amp_update_scale,
    "_batch_norm_with_update.default": _batch_norm_op(aten._batch_norm_with_update, 0.1, 1e-5),
    "_native_batch_norm_legit.default": _batch_norm_op(
        aten._native_batch_norm_legit, True, 0.1, 1e-5
    ),
    "_cummax_helper.default": _cum_helper(aten._cummax_helper),
    "_cummin_helper.default": _cum_helper(aten._cummin_helper),
    "_fused_adam_.default": _adam_like(aten._fused_adam_.default, False, 3),
    "_fused_adam_.tensor_lr": _adam_like(aten._fused_adam_.tensor_lr, True, 3),
    "_fused_adamw_.default": _adam_like(aten._fused_adamw_.default, False, 3),
    "_fused_adamw_.tensor_lr": _adam_like(aten._fused_adamw_.tensor_lr, True, 3),
    "_fused_sgd_.default": _sgd(False),
    "_fused_sgd_.tensor_lr": _sgd(True),
    "_fused_adagrad_.default": _adagrad(False),
    "_fused_adagrad_.tensor_lr": _adagrad(True),
    "_fused_moving_avg_obs_fq_helper.default": _observer(
        aten._fused_moving_avg_obs_fq_helper, False, False
    ),
    "fused_moving_avg_obs_fake_quant.default": _observer(
        aten.fused_moving_avg_obs_fake_quant, False, False
    ),
    "rrelu_with_noise.default": _rrelu(aten.rrelu_with_noise),
    "rrelu_with_noise_.default": _rrelu(aten.rrelu_with_noise_),
}
#: Ops of that list that cannot run here, and why.
CANNOT_RUN_HERE = {
    "fbgemm_linear_fp16_weight.out": "needs a weight packed by fbgemm_pack_gemm_matrix_fp16",
    "fbgemm_linear_fp16_weight_fp32_activation.out": "needs a weight packed by fbgemm",
}


def test_every_op_writing_another_argument_is_covered() -> None:
    """The corpus below covers every such op this torch has (a new release's fail here)."""
    missing = set(ops_writing_other_arguments()) - WRITERS_OF_OTHER_ARGUMENTS.keys()
    assert missing <= CANNOT_RUN_HERE.keys(), sorted(missing - CANNOT_RUN_HERE.keys())


def _available_writers() -> Iterator[Any]:
    present = set(ops_writing_other_arguments())
    for name, make in WRITERS_OF_OTHER_ARGUMENTS.items():
        marks = [] if name in present else [pytest.mark.skip(reason="not in this torch")]
        yield pytest.param(make, id=name, marks=marks)


@pytest.mark.parametrize("make", list(_available_writers()))
def test_ops_writing_other_arguments_update_state_once_per_call(make: Callable) -> None:
    fn, twin = make(), make()
    for tensor, other in zip(fn.closed_over, twin.closed_over, strict=True):
        other.copy_(tensor)
    tf = fxviews.transform(fn)
    torch.manual_seed(1)
    inputs = [torch.randn(4, 3) for _ in range(3)]
    for step, x in enumerate(inputs):
        torch.manual_seed(step)
        out = tf(x)
        torch.manual_seed(step)
        assert_tree_close(out, twin(x))
        for got, want in zip(fn.closed_over, twin.closed_over, strict=True):
            torch.testing.assert_close(got, want, msg=lambda m, s=step: f"after call {s}: {m}")
    assert tf.cache_info().eager == 0


# --------------------------------------------------------------------------------------------
# 3. First-call failures leave no permanent eager entry.
# --------------------------------------------------------------------------------------------


class NotReady:
    """A function whose closure state is set up after its first call."""

    def __init__(self) -> None:
        self.ready = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            raise ValueError("state not ready")
        return x.as_strided((x.shape[0] - 1, 2), (1, 1)) * 1


@pytest.mark.parametrize("strict", [False, True])
def test_user_exception_propagates_and_the_next_call_traces(strict: bool) -> None:
    fn = NotReady()
    tf = fxviews.transform(fn, strict=strict)
    with pytest.raises(ValueError, match="state not ready"):
        tf(torch.randn(5))
    assert tf.cache_info().currsize == 0
    fn.ready = True
    # The next call traces: vmap of the as_strided windows is right for a batch dim at 1, which
    # eager (and so an eager entry) reads with the wrong strides.
    samples = [(torch.randn(5),) for _ in range(3)]
    actual = vmap(tf, in_dims=1)(*stack_batched(samples, (1,)))
    assert_tree_close(actual, per_sample_reference(fn, samples, (1,)))
    assert tf.cache_info().eager == 0 and tf.cache_info().currsize == 1


def test_an_exception_raised_by_an_op_is_eagers() -> None:
    """A shape error inside an op: the call raises what eager raises, nothing is cached."""
    tf = fxviews.transform(lambda x, y: x @ y)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        tf(torch.randn(2, 3), torch.randn(2, 3))
    assert tf.cache_info().currsize == 0


def test_nested_transforms_under_vmap() -> None:
    inner = fxviews.transform(lambda x: x.as_strided((x.shape[0] - 2, 3), (1, 1)) * 2)
    outer = fxviews.transform(lambda x: inner(x).sum(-1) + inner(x.flip(0))[:, 0])

    def reference(x: torch.Tensor) -> torch.Tensor:
        def windows(t: torch.Tensor) -> torch.Tensor:
            return t.as_strided((t.shape[0] - 2, 3), (1, 1)) * 2

        return windows(x).sum(-1) + windows(x.flip(0))[:, 0]

    samples = [(torch.randn(6),) for _ in range(4)]
    for in_dims in [(0,), (1,)]:
        actual = vmap(outer, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, per_sample_reference(reference, samples, in_dims))
    assert outer.cache_info().eager == 0


def test_lazy_module_traces_after_its_first_call(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    lazy = nn.Sequential(nn.LazyLinear(3), nn.Tanh())
    tf = fxviews.transform(lazy)
    x = torch.randn(2, 4)
    with caplog.at_level(logging.INFO, logger="fxviews"):
        first = tf(x)
    assert not caplog.records
    torch.testing.assert_close(first, lazy(x))
    assert tf.cache_info().currsize == 0  # nothing cached while the parameters did not exist
    samples = [(torch.randn(4),) for _ in range(3)]
    actual = vmap(tf, in_dims=1)(*stack_batched(samples, (1,)))
    assert_tree_close(actual, per_sample_reference(lazy, samples, (1,)))
    assert tf.cache_info().currsize == 1 and tf.cache_info().eager == 0


class RebindingEMA(nn.Module):
    """An EMA kept by rebinding its buffer (eager replaces it on every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("avg", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.avg = self.avg * 0.5 + x
        return self.avg * 2


class CallCounter(nn.Module):
    """A Python counter in the computation: each call scales by how many calls came before."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


class LazyState(nn.Module):
    """A state tensor made on the first call, then written in place: traceable from the
    second call on."""

    def __init__(self) -> None:
        super().__init__()
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.state is None:
            self.state = torch.zeros_like(x)
        return self.state.add_(x).clone()


@pytest.mark.parametrize("make", [RebindingEMA, CallCounter], ids=lambda m: m.__name__)
def test_python_state_rebound_every_call_runs_eagerly(make: Callable[[], nn.Module]) -> None:
    # The trace would run the assignment once and the graph would keep the trace's value
    # (Note [Python state a trace rebinds]): such a module runs eagerly, and its outputs and
    # state after each call are eager's.
    x = torch.randn(3)
    run_twice(make(), plain, [call_with(x)] * 4)
    tf = fxviews.transform(make())
    for _ in range(3):
        tf(x)
    assert tf.cache_info().eager == 1 and tf.cache_info().currsize == 1


def test_python_state_made_on_the_first_call_is_traced_from_the_second() -> None:
    x = torch.randn(3)
    model, twin = LazyState(), LazyState()
    tf = fxviews.transform(model)
    for _ in range(4):
        torch.testing.assert_close(tf(x), twin(x), rtol=0, atol=0)
    torch.testing.assert_close(model.state, twin.state, rtol=0, atol=0)
    assert tf.cache_info().eager == 0 and tf.cache_info().currsize == 1


TOTAL = torch.zeros(())


def accumulate_globally(x: torch.Tensor) -> torch.Tensor:
    global TOTAL  # noqa: PLW0603 - the pattern under test
    TOTAL = TOTAL + x.sum()
    return x * TOTAL


class Carried:
    """An RNN's carried state on a plain object passed as an argument."""

    def __init__(self) -> None:
        self.h = torch.zeros(3)


def step(carried: Carried, x: torch.Tensor) -> torch.Tensor:
    carried.h = torch.tanh(carried.h + x)
    return carried.h * 2


def test_rebound_globals_and_argument_attributes_follow_eager(caplog) -> None:
    global TOTAL  # noqa: PLW0603 - reset between the two runs
    x = torch.randn(3)
    runs = []
    for fn, carried in (
        (fxviews.transform(accumulate_globally), Carried()),
        (accumulate_globally, Carried()),
    ):
        TOTAL = torch.zeros(())
        stepper = fxviews.transform(step) if fn is not accumulate_globally else step
        runs.append([(fn(x), stepper(carried, x), TOTAL, carried.h) for _ in range(3)])
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert "rebinds global TOTAL" in caplog.text and "rebinds Carried.h" in caplog.text


class StridedReader(nn.Module):
    """Reads its weight's memory with ``as_strided`` and branches on its contiguity in Python:
    both depend on the parameter's layout, which ``to(memory_format=...)`` changes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.conv.weight
        window = weight.as_strided((4,), (1,)).sum()
        scale = 2.0 if weight.is_contiguous() else 3.0
        return x * window * scale


class PlainConv(nn.Module):
    """A conv whose result does not depend on its weight's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@pytest.mark.parametrize("make", [StridedReader, PlainConv], ids=lambda m: m.__name__)
def test_a_held_tensor_whose_layout_the_graph_read_is_guarded_on_it(make) -> None:
    # model.to(memory_format=channels_last) swaps each parameter's .data under the same object:
    # eager's as_strided then reads other memory, and its Python branch goes the other way.
    torch.manual_seed(0)
    model = make()
    twin = copy.deepcopy(model)
    tf = fxviews.transform(model)
    x = torch.randn(3) if make is StridedReader else torch.randn(1, 2, 3, 3)
    for step in range(4):
        if step == 2:
            model.to(memory_format=torch.channels_last)
            twin.to(memory_format=torch.channels_last)
        got, want = tf(x), twin(x)
        assert_tree_close(got, want)
        got.sum().backward()
        want.sum().backward()
        assert_tree_close([p.grad for p in model.parameters()], [p.grad for p in twin.parameters()])
    # Both trace again once: the parameters are the graph's inputs, read from the module with
    # their strides checked as an argument's are (Note [Parameters are read when the graph
    # runs]), and the one whose layout Python read takes the other branch.
    assert tf.cache_info().misses == 2


def test_a_closed_over_tensor_read_through_as_strided_is_guarded_on_its_layout() -> None:
    table = torch.arange(12.0).reshape(3, 4)
    tf = fxviews.transform(lambda x: x + table.as_strided((3,), (1,), 1))
    x = torch.zeros(3)
    assert_tree_close(tf(x), x + table.as_strided((3,), (1,), 1))
    table.data = table.data.t().contiguous().t()  # the same values, column-major memory
    assert_tree_close(tf(x), x + table.as_strided((3,), (1,), 1))
    assert tf.cache_info().misses == 2


def _replace_weight(model: nn.Sequential) -> None:
    model[0].weight = nn.Parameter(torch.randn_like(model[0].weight))


def _load_assigning(model: nn.Sequential) -> None:
    model.load_state_dict(copy.deepcopy(_small_net()).state_dict(), assign=True)


def _prune(model: nn.Sequential) -> None:
    torch.nn.utils.prune.l1_unstructured(model[0], "weight", amount=0.5)


def _weight_norm(model: nn.Sequential) -> None:
    torch.nn.utils.parametrizations.weight_norm(model[2])


def _swap_activation(model: nn.Sequential) -> None:
    model[1] = nn.Tanh()


def _small_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize(
    "replace", [_replace_weight, _load_assigning, _prune, _weight_norm, _swap_activation]
)
def test_a_parameter_or_submodule_assigned_anew_is_seen(replace: Callable[[nn.Module], None]):
    # The graph holds the tensors it read by reference: after an assignment it would read the
    # old ones, and gradients would land on them. The modules' registration hooks count the
    # assignment, and the guard reads the count.
    torch.manual_seed(0)
    model = _small_net()
    twin = copy.deepcopy(model)
    tf = fxviews.transform(model)
    x = torch.randn(5, 3)
    for _ in range(2):
        assert_tree_close(tf(x), twin(x))
    for net in (model, twin):
        torch.manual_seed(1)
        replace(net)
    for _ in range(2):
        got, want = tf(x), twin(x)
        assert_tree_close(got, want)
        got.sum().backward()
        want.sum().backward()
    grads = [[p.grad for p in net.parameters()] for net in (model, twin)]
    assert_tree_close(grads[0], grads[1])
    # A parameter assigned in place of one is read when the graph runs, as functional_call's
    # are (Note [Parameters are read when the graph runs]): one trace. A new parameter or
    # submodule changes what the function computes: one trace before, one after; pruning's
    # forward pre-hook runs on every call, which a trace refuses (Note [The state a graph bakes
    # in], item 6): that state runs eagerly.
    swaps = (_replace_weight, _load_assigning)
    assert tf.cache_info().misses == (1 if replace in swaps else 2)
    assert tf.cache_info().eager == (1 if replace is _prune else 0)


WEIGHT = torch.eye(3)
RATE = 0.1
MODEL = nn.Linear(3, 3)


def functional_step(x: torch.Tensor) -> torch.Tensor:
    return x @ WEIGHT * RATE + MODEL(x)


def test_names_and_closure_cells_rebound_between_calls_are_seen() -> None:
    # A JAX-style update rebinds the global (W = W - lr * g), a schedule rebinds the rate, a
    # model is replaced: the graph held the old objects. Names are checked by identity.
    global WEIGHT, RATE, MODEL  # noqa: PLW0603 - the pattern under test
    tf = fxviews.transform(functional_step)
    x = torch.randn(2, 3)
    for rebind in (
        lambda: None,
        lambda: globals().update(WEIGHT=WEIGHT - 0.5),
        lambda: globals().update(RATE=0.01),
        lambda: globals().update(MODEL=nn.Linear(3, 3)),
        lambda: None,
    ):
        rebind()
        assert_tree_close(tf(x), functional_step(x))
    assert tf.cache_info().misses == 4 and tf.cache_info().hits == 1

    scale = torch.ones(3)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * scale

    tf = fxviews.transform(scaled)
    for _ in range(2):
        assert_tree_close(tf(x), scaled(x))
        scale = scale * 2  # a nonlocal rebinding: the cell holds a new tensor
    assert_tree_close(tf(x), scaled(x))


def test_lazy_module_under_strict_says_why() -> None:
    tf = fxviews.transform(nn.LazyLinear(3), strict=True)
    with pytest.raises(fxviews.TracingError, match="lazy modules"):
        tf(torch.randn(2, 4))


def test_wrong_arguments_raise_type_error_without_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    tf = fxviews.transform(f)
    with caplog.at_level(logging.DEBUG, logger="fxviews"), pytest.raises(TypeError, match="f()"):
        tf(torch.randn(3), torch.randn(3))
    assert not [r for r in caplog.records if r.name == "fxviews"]
    assert tf.cache_info().currsize == 0


def test_zoo_models_in_train_mode_keep_eager_state() -> None:
    """torchvision's ResNet-18 in train mode (BatchNorm everywhere), two calls at two batch
    sizes: outputs, every running statistic and the random stream as eager's."""
    from fxviews.bench import zoo

    require_zoo_or_skip("torchvision")
    torch.manual_seed(0)
    calls = [call_with(randn(b, 3, 32, 32)) for b in (2, 3, 2)]
    run_twice(on_test_device(zoo.resnet18(32).train()), plain, calls)


# --------------------------------------------------------------------------------------------
# Random state: generators the function draws from, and random state it sets from Python
# (Notes [Which generators to fork] and [Random state set from Python]).
# --------------------------------------------------------------------------------------------


class _Noisy(nn.Module):
    """Adds noise drawn from a generator of its own."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(x.shape, generator=self.generator)


def _generator_argument(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda x, g: x + torch.rand(x.shape, generator=g)), (g,)


def _closed_over_generator(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (lambda x: x * torch.randn(x.shape, generator=g)), ()


def _module_generator(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return _Noisy(g), ()


def _generator_made_inside(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        own = torch.Generator().manual_seed(3)
        return x + torch.rand(x.shape, generator=own)

    return fn, ()


def _manual_seed_inside(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(123)
        return x + torch.rand_like(x)

    return fn, ()


def _fork_rng_inside(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng():
            noise = torch.rand_like(x)
        return x + noise

    return fn, ()


def _set_rng_state_inside(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        state = torch.get_rng_state()
        first = torch.rand_like(x)
        torch.set_rng_state(state)
        return x + first + torch.rand_like(x)

    return fn, ()


def _generator_seeded_inside(g: torch.Generator) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        g.manual_seed(5)
        return x + torch.rand(x.shape, generator=g)

    return fn, ()


RANDOM_STATE_CASES = {
    "generator argument": _generator_argument,
    "closed-over generator": _closed_over_generator,
    "generator of a module": _module_generator,
    "generator made inside": _generator_made_inside,
    "manual_seed inside": _manual_seed_inside,
    "fork_rng inside": _fork_rng_inside,
    "set_rng_state inside": _set_rng_state_inside,
    "generator seeded inside": _generator_seeded_inside,
}


def _draws(
    case: Callable[[torch.Generator], tuple[Callable[..., Any], tuple[Any, ...]]],
    through: Callable[[Callable[..., Any]], Callable[..., Any]],
    x: torch.Tensor,
) -> list[Any]:
    """Three calls of the case's function through ``through``, from the same seeds: each call's
    output, then the next draw of its generator and of the default stream."""
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    fn, extra = case(g)
    run = through(fn)
    return [(run(x, *extra), torch.rand(2, generator=g), torch.rand(2)) for _ in range(3)]


@pytest.mark.parametrize("name", list(RANDOM_STATE_CASES))
def test_random_state_after_each_call_equals_eagers(name: str) -> None:
    """Outputs and both streams after each of three calls: as eager, whether the function
    draws from a generator of its own or sets random state from Python (then it runs eagerly)."""
    case = RANDOM_STATE_CASES[name]
    x = torch.zeros(4, 3)
    eager = _draws(case, lambda fn: fn, x)
    torch.testing.assert_close(_draws(case, fxviews.transform, x), eager, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["closed-over generator", "manual_seed inside"])
def test_random_state_under_vmap_equals_eagers(name: str) -> None:
    def same_noise(fn: Callable[..., Any]) -> Callable[..., Any]:
        return vmap(fn, randomness="same")

    case = RANDOM_STATE_CASES[name]
    x = torch.zeros(5, 4, 3)
    eager = _draws(case, same_noise, x)
    transformed = _draws(case, lambda fn: same_noise(fxviews.transform(fn)), x)
    torch.testing.assert_close(transformed, eager, rtol=0, atol=0)


def test_random_state_set_from_python_runs_eagerly_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tf = fxviews.transform(_manual_seed_inside(torch.Generator())[0])
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        tf(torch.zeros(3))
        tf(torch.zeros(3))
    assert tf.cache_info().eager == 1
    assert caplog.text.count("it sets the random state from Python") == 1
    with pytest.raises(fxviews.TracingError, match="torch.Generator it makes") as err:
        fxviews.transform(_generator_made_inside(torch.Generator())[0], strict=True)(randn(3))
    assert err.value.cause == "random state"


def _dropout_twice(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, 0.5) + F.dropout(x, 0.2)


def _grad_through_dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.func.grad(lambda s: F.dropout(s, 0.5).sin().sum())(x)


def _jvp_through_noise(x: torch.Tensor) -> torch.Tensor:
    return torch.func.jvp(lambda s: s * torch.randn_like(s), (x,), (torch.ones_like(x),))[1]


PLAIN_DRAWS = {
    "dropout twice": _dropout_twice,
    "randn_like": lambda x: x + torch.randn_like(x),
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    "randperm": lambda x: x[torch.randperm(x.shape[0])],
    "multinomial": lambda x: torch.multinomial(x.abs() + 0.1, 2),
    "vmap randomness different": lambda x: vmap(
        lambda s: s + torch.randn(s.shape), randomness="different"
    )(x),
    "grad through dropout": _grad_through_dropout,
    "jvp through noise": _jvp_through_noise,
}


@pytest.mark.parametrize("name", list(PLAIN_DRAWS))
def test_plain_draws_trace_as_a_graph(name: str) -> None:
    """Draws only, from the default stream: traced (no eager entry), the streams as eager's."""
    fn = PLAIN_DRAWS[name]
    tf = fxviews.transform(fn)
    x = torch.randn(4, 3)
    torch.manual_seed(0)
    eager = [(fn(x), torch.rand(2)) for _ in range(3)]
    torch.manual_seed(0)
    transformed = [(tf(x), torch.rand(2)) for _ in range(3)]
    torch.testing.assert_close(transformed, eager, rtol=0, atol=0)
    assert tf.cache_info().eager == 0
