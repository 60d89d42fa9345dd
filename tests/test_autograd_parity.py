"""Gradients through ``fxviews.transform`` equal eager's, by every route, or the call runs eagerly.

Each program of :mod:`tests.autograd_programs` is built twice from one seed: one instance runs
eagerly, the other through ``transform``. Every route (``.backward()`` with and without the
inputs requiring grad, ``grad``, ``vjp``, ``jvp``, ``jacrev``, ``hessian``, ``vmap(grad)`` with
the batch dim physically at 0, 1 and last) is taken twice (the second call runs the cached
graph), and each time the outputs, gradients (of the inputs and of every parameter), the state
the call leaves (EMA teachers, buffers) and the exception, where eager raises one, must be
eager's. Programs whose constructs a graph cannot keep must run eagerly (``cache_info().eager``),
with a warning naming the construct and the line of the program that uses it, and never trace
again on later calls.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fxviews
from fxviews.consumers.export.program import rewrite_exported
from fxviews.passes.compat.torch_internals import top_saved_tensors_hooks
from fxviews.passes.schema import RECORDED, TRACED_WITH
from fxviews.tracing.autograd import KeptFunction
from fxviews.tracing.capture import capture
from tests.autograd_programs import PROGRAMS, SAMPLE_SHAPE, Program
from tests.reference import (
    assert_tree_close,
    make_samples,
    per_sample_reference,
    stable_seed,
    stack_batched,
)

BATCH = 3


def _backward(inputs_require_grad: bool) -> Callable[[Program, Callable[..., Any], Any], Any]:
    def route(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
        for tensor in program.state:
            tensor.grad = None
        leaves = [a.detach().clone().requires_grad_(inputs_require_grad) for a in samples[0]]
        out = fn(*leaves)
        out.backward()
        params = [t.grad for t in program.state if t.requires_grad]
        return out.detach(), [a.grad for a in leaves], params

    return route


def _argnums(program: Program) -> tuple[int, ...]:
    return tuple(range(program.arity))


def _grad(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
    return torch.func.grad(fn, _argnums(program))(*samples[0])


def _vjp(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
    out, pull = torch.func.vjp(fn, *samples[0])
    return out, pull(torch.ones_like(out))


def _jvp(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
    return torch.func.jvp(fn, samples[0], tuple(a.cos() for a in samples[0]))


def _jacrev(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
    return torch.func.jacrev(fn, _argnums(program))(*samples[0])


def _hessian(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
    return torch.func.hessian(fn)(*samples[0])


def _vmap_grad(bd: int) -> Callable[[Program, Callable[..., Any], Any], Any]:
    def route(program: Program, fn: Callable[..., Any], samples: Any) -> Any:
        in_dims = (bd,) * program.arity
        return torch.func.vmap(torch.func.grad(fn, _argnums(program)), in_dims=in_dims)(
            *stack_batched(samples, in_dims)
        )

    route.bd = bd  # type: ignore[attr-defined]
    return route


ROUTES: dict[str, Callable[[Program, Callable[..., Any], Any], Any]] = {
    "backward": _backward(True),
    "backward_params": _backward(False),
    "grad": _grad,
    "vjp": _vjp,
    "jvp": _jvp,
    "jacrev": _jacrev,
    "hessian": _hessian,
    "vmap_grad_bd0": _vmap_grad(0),
    "vmap_grad_bd1": _vmap_grad(1),
    "vmap_grad_bdlast": _vmap_grad(-1),
}


def _eager_reference(route: str, program: Program, samples: Any) -> Any:
    """Eager PyTorch's outcome of ``route``: one sample at a time for ``vmap`` (eager ``vmap``
    where a call updates state, so one batched call is not a loop of calls)."""
    bd = getattr(ROUTES[route], "bd", None)
    if bd is None or not program.per_sample:
        return ROUTES[route](program, program.fn, samples)
    in_dims = (bd,) * program.arity
    return per_sample_reference(torch.func.grad(program.fn, _argnums(program)), samples, in_dims)


def _outcome(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except Exception as err:  # noqa: BLE001 - the eager outcome the transform must match
        return None, err


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_transform_matches_eager(name: str, route: str, caplog: pytest.LogCaptureFixture) -> None:
    eager, traced = PROGRAMS[name](), PROGRAMS[name]()
    if eager.routes is not None and route not in eager.routes:
        pytest.skip(f"{name}: eager torch.func refuses {route} by an implementation limit")
    samples = make_samples([SAMPLE_SHAPE] * eager.arity, BATCH, seed=stable_seed(name))
    transformed = fxviews.transform(traced.fn)
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        for call in range(2):  # the second call runs the cached graph (or the eager entry)
            expected, error = _outcome(lambda: _eager_reference(route, eager, samples))
            if error is not None:
                with pytest.raises(type(error)):
                    ROUTES[route](traced, transformed, samples)
            else:
                got = ROUTES[route](traced, transformed, samples)
                assert_tree_close(got, expected, msg=f"{name}, {route}, call {call}")
            assert_tree_close(traced.state, eager.state, msg=f"{name}: state after call {call}")
    info = transformed.cache_info()
    if error is not None and info.currsize == 0:
        return  # a first call eager fails where fxviews could not trace: cached as nothing
    assert info.misses == 1, f"{name} traced again on its second call: {info}"
    assert info.eager == (traced.refused is not None), info
    warnings = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    if traced.refused is not None:
        (warning,) = warnings
        assert traced.refused in warning and "autograd_programs.py:" in warning, warning
    else:
        assert warnings == []


# --- the examples of the issue, by hand ----------------------------------------------------------


def test_a_no_grad_target_and_a_straight_through_estimator_give_eager_gradients() -> None:
    def target(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = x * 2
        return (x * t).sum()

    class RoundSTE(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return torch.round(x)

        @staticmethod
        def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
            pass

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return grad

    def quantized(x: torch.Tensor) -> torch.Tensor:
        return (RoundSTE.apply(3 * x) ** 2).sum()

    for fn, x in [
        (target, torch.tensor([1.0, 2.0, 3.0])),
        (quantized, torch.tensor([0.3, -1.2, 2.6])),
    ]:
        transformed = fxviews.transform(fn)
        torch.testing.assert_close(torch.func.grad(transformed)(x), torch.func.grad(fn)(x))
        leaf, eager_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
        transformed(leaf).backward()
        fn(eager_leaf).backward()
        torch.testing.assert_close(leaf.grad, eager_leaf.grad)


# --- what the graph keeps, and says it kept -------------------------------------------------------


class _GradModes(torch.utils._python_dispatch.TorchDispatchMode):
    """Eager's grad mode at each aten op, in order: the reference for a graph's switches."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append((func, torch.is_grad_enabled()))
        return func(*args, **(kwargs or {}))


def _modes_of_graph(gm: torch.fx.GraphModule) -> list[tuple[Any, bool]]:
    """Each aten node of ``gm`` with the grad mode its switches put it in, in order."""
    mode, seen = torch.is_grad_enabled(), []
    for node in gm.graph.nodes:
        if node.target is torch._C._set_grad_enabled:
            mode = node.args[0]
        elif isinstance(node.target, torch._ops.OpOverload):
            seen.append((node.target, mode))
    return seen


def _differentiable(ops: list[tuple[Any, bool]]) -> list[tuple[Any, bool]]:
    """``ops`` but ``detach``, whose result is the same in any grad mode (make_fx records one
    more than a dispatch mode sees, on the gradient autograd.grad seeds)."""
    return [(op, mode) for op, mode in ops if op != torch.ops.aten.detach.default]


@pytest.mark.parametrize("name", ["dqn_td", "byol_ema", "nested_grad_modes", "saliency"])
def test_each_op_of_the_graph_runs_in_the_grad_mode_eager_ran_it_in(name: str) -> None:
    eager, traced = PROGRAMS[name](), PROGRAMS[name]()
    (sample,) = make_samples([SAMPLE_SHAPE] * eager.arity, 1, seed=stable_seed(name))
    args = [a.clone().requires_grad_() for a in sample]
    with _GradModes() as reference:
        eager.fn(*args)
    gm = fxviews.trace(traced.fn, *[a.clone().requires_grad_() for a in sample])
    assert {mode for _, mode in reference.seen} == {True, False}, "a grad-mode region"
    assert _differentiable(_modes_of_graph(gm)) == _differentiable(reference.seen)
    assert gm.meta["fxviews_autograd"], gm.meta


def test_explain_says_what_it_kept_for_autograd() -> None:
    program = PROGRAMS["dann"]()
    (sample,) = make_samples([SAMPLE_SHAPE], 1, seed=1)
    result = fxviews.explain(program.fn, sample[0])
    (kept,) = result.autograd_kept
    assert "GradientReversal kept as one node" in kept and "autograd_programs.py:" in kept
    printout = str(result)
    assert "kept for autograd" in printout and "GradientReversal" in printout
    assert "GradientReversal_apply" in result.graph_module.code


_REFUSED = [name for name, build in PROGRAMS.items() if build().refused is not None]


@pytest.mark.parametrize("name", _REFUSED)
def test_what_a_graph_cannot_keep_raises_under_strict_and_in_trace(name: str) -> None:
    program = PROGRAMS[name]()
    (sample,) = make_samples([SAMPLE_SHAPE] * program.arity, 1, seed=stable_seed(name))
    args = [a.clone().requires_grad_() for a in sample]
    strict = fxviews.transform(program.fn, strict=True)
    for attempt in (lambda: fxviews.trace(program.fn, *args), lambda: strict(*args)):
        with pytest.raises(fxviews.TracingError) as caught:
            attempt()
        assert caught.value.cause == "autograd"
        assert program.refused in str(caught.value) and "autograd_programs.py:" in str(caught.value)


def test_hooks_registered_inside_fn_never_make_a_call_trace_again() -> None:
    program = PROGRAMS["tensor_hook"]()
    transformed = fxviews.transform(program.fn)
    x = torch.randn(SAMPLE_SHAPE, dtype=torch.float64, requires_grad=True)
    for _ in range(4):
        transformed(x).backward()
    assert transformed.cache_info()[1:] == (1, 32, 1, 1)  # one miss: an eager entry

    def hooked_input(x: torch.Tensor) -> torch.Tensor:
        x.register_hook(lambda g: g * 2)  # raises in eager where x does not require grad
        return x.sum()

    transformed = fxviews.transform(hooked_input)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="does not require grad|doesn't require grad"):
            transformed(torch.ones(3))
    assert transformed.cache_info()[1:] == (1, 32, 1, 1)


def test_a_call_that_raises_inside_a_region_leaves_grad_mode_as_eager_does() -> None:
    running = torch.zeros(4)

    def accumulate(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            running.add_(x)  # under vmap: a batched value into an unbatched buffer
        return (x * running).sum()

    transformed = fxviews.transform(accumulate)
    transformed(torch.zeros(4))
    for fn in (accumulate, transformed):
        with pytest.raises(RuntimeError):
            torch.func.vmap(fn)(torch.ones(3, 4))
        assert torch.is_grad_enabled()


def test_enable_grad_inside_a_call_made_under_no_grad() -> None:
    layers = [torch.nn.Linear(4, 4).double() for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())

    def gated(layer: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scale = x.exp()
            with torch.enable_grad():
                gated = (scale * torch.sigmoid(layer(x))).sum()
            return gated, (scale * layer(x)).sum()

        return fn

    x = torch.randn(SAMPLE_SHAPE, dtype=torch.float64)
    grads = []
    for fn, layer in (
        (gated(layers[0]), layers[0]),
        (fxviews.transform(gated(layers[1])), layers[1]),
    ):
        with torch.no_grad():
            gated, plain = fn(x)
        assert gated.requires_grad and not plain.requires_grad  # only the region tracks
        gated.backward()
        grads.append((gated.detach(), plain, [p.grad for p in layer.parameters()]))
    assert_tree_close(grads[1], grads[0])


def test_requires_grad_of_the_arguments_is_part_of_the_signature() -> None:
    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.requires_grad else x * 3

    transformed = fxviews.transform(branchy)
    x = torch.randn(3)
    for arg in (x, x.clone().requires_grad_(), x):
        torch.testing.assert_close(transformed(arg), branchy(arg))
    assert transformed.cache_info()[:2] == (1, 2)
    torch.testing.assert_close(
        torch.func.grad(lambda a: transformed(a).sum())(x), 2 * torch.ones(3)
    )


# --- custom autograd.Functions: kept where their rules are what runs ----------------------------


class _Scale(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, how: Any) -> torch.Tensor:  # type: ignore[override]
        return x * (how() if callable(how) else how)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        pass

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * 10, None


class _Outer(torch.autograd.Function):
    """A Function whose forward applies another: the inner one runs as part of the outer."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _Scale.apply(x, 2.0).sin()

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        pass

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * 3


class _Direct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        return grad * 5


def _applied_behind_apply(x: torch.Tensor) -> torch.Tensor:
    # The C++ apply, bound to the class: Function.apply is never called.
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, _Direct)(x).sum()


@pytest.mark.parametrize(
    ("fn", "construct"),
    [
        (lambda x: _Scale.apply(x, lambda: 2.0).sum(), "it is passed a function"),
        (lambda x: torch.func.grad(lambda a: (_Scale.apply(a, 2.0) * a).sum())(x).pow(2).sum(),
         "inside a torch.func transform inside fn"),
        (_applied_behind_apply, "forward AD off"),
    ],
    ids=["a callable argument", "inside fn's own torch.func.grad", "apply fxviews did not see"],
)  # fmt: skip
def test_a_function_whose_rules_a_graph_would_not_run_is_refused(fn: Any, construct: str) -> None:
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(fxviews.TracingError, match=construct) as caught:
        fxviews.trace(fn, x)
    assert caught.value.cause == "autograd"
    transformed = fxviews.transform(fn)
    torch.testing.assert_close(
        torch.autograd.grad(transformed(x), x), torch.autograd.grad(fn(x), x)
    )
    assert transformed.cache_info().eager == 1
    assert torch.autograd.Function.__dict__["apply"] is _ORIGINAL_APPLY  # restored after a refusal


_ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]


def test_a_function_applied_inside_a_kept_one_runs_as_part_of_it() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return _Outer.apply(x).pow(2).sum()

    gm = fxviews.trace(fn, torch.randn(3))
    kept = [n.target for n in gm.graph.nodes if n.op == "call_function" and "apply" in n.name]
    assert [k.cls for k in kept] == [_Outer]  # type: ignore[attr-defined]
    x = torch.randn(3)
    transformed = fxviews.transform(fn)
    torch.testing.assert_close(torch.func.grad(transformed)(x), torch.func.grad(fn)(x))
    assert torch.autograd.Function.__dict__["apply"] is _ORIGINAL_APPLY


@pytest.mark.parametrize("name", ["qat_ste", "dann", "custom_activation"])
def test_a_kept_function_is_recorded_on_a_sample(name: str) -> None:
    """A kept Function's node is the recording's, not a reason to trace again in fake mode."""
    program = PROGRAMS[name]()
    (sample,) = make_samples([SAMPLE_SHAPE] * program.arity, 1, seed=stable_seed(name))
    gm = capture(program.fn, list(sample), fresh=True, caller="test", name=name)
    assert gm.meta[TRACED_WITH] == RECORDED
    assert any(isinstance(node.target, KeptFunction) for node in gm.graph.nodes), gm.code


def test_a_refused_checkpoint_leaves_no_saved_tensor_hooks() -> None:
    """The refused trace of a checkpointed function leaves no saved-tensor hooks pushed, with
    the garbage collector off (before torch 2.13, ``checkpoint`` leaves them to it): later
    eager checkpoints and ``torch.func.grad`` calls run as if no trace had happened."""
    eager, traced = PROGRAMS["checkpointed"](), PROGRAMS["checkpointed"]()
    samples = make_samples([SAMPLE_SHAPE], 1, seed=stable_seed("checkpointed"))
    transformed = fxviews.transform(traced.fn)
    collecting = gc.isenabled()
    gc.disable()
    try:
        got = ROUTES["backward"](traced, transformed, samples)
        assert top_saved_tensors_hooks() is None
        assert_tree_close(got, ROUTES["backward"](eager, eager.fn, samples))
        x = samples[0][0]
        torch.testing.assert_close(torch.func.grad(lambda x: x.pow(2).sum())(x), 2 * x)
    finally:
        if collecting:
            gc.enable()
    assert transformed.cache_info().eager == 1


def _dropped_out(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A block whose recomputation must draw the random numbers its forward drew."""

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout((x @ weight).tanh(), 0.5, training=True).sin()

    return block


def _checkpointed_step(
    block: Callable[[torch.Tensor], torch.Tensor],
    weight: torch.Tensor,
    x: torch.Tensor,
    use_reentrant: bool,
) -> Any:
    """A training step through ``checkpoint(block)``: its outputs, gradients and the next
    random draw."""
    weight.grad = None
    leaf = x.clone().requires_grad_()
    torch.manual_seed(7)
    out = torch.utils.checkpoint.checkpoint(block, leaf, use_reentrant=use_reentrant)
    out.sum().backward()
    return out.detach(), leaf.grad, weight.grad, torch.rand(2)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_around_a_transformed_function_gives_eager_gradients(
    use_reentrant: bool,
) -> None:
    """The first call traces inside ``checkpoint``, whose saved-tensor hooks count what the
    forward saves against what the recomputation saves: they must never see the trace's. A
    reentrant checkpoint recomputes inside the engine's backward, the caller's, not one fn
    runs: that signature gets a graph too."""
    weight = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    block = _dropped_out(weight)
    transformed = fxviews.transform(block)
    for call in range(3):  # the first call traces, the later ones run the cached graph
        x = torch.randn(4, dtype=torch.float64)
        expected = _checkpointed_step(block, weight, x, use_reentrant)
        got = _checkpointed_step(transformed, weight, x, use_reentrant)
        assert_tree_close(got, expected, msg=f"call {call}")
    assert transformed.cache_info().eager == 0


def _saved_tensor_hook_calls(fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, int]:
    """How many times a caller's saved-tensor hooks pack and unpack around a training step of
    ``fn``."""
    calls = {"pack": 0, "unpack": 0}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        calls["pack"] += 1
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        calls["unpack"] += 1
        return tensor

    x = torch.randn(SAMPLE_SHAPE, dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = fn(x)
    out.sum().backward()
    return calls


@pytest.mark.parametrize("name", ["distillation", "custom_activation", "lossy_saved_tensors"])
def test_a_callers_saved_tensor_hooks_see_what_eager_saves(name: str) -> None:
    """The trace is fxviews' own work: the caller's hooks see the graph's run as eager's ops,
    from the first call on, and hooks ``fn`` pushes itself are still refused."""
    eager, traced = PROGRAMS[name](), PROGRAMS[name]()
    transformed = fxviews.transform(traced.fn)
    for call in range(2):
        got = _saved_tensor_hook_calls(transformed)
        assert got == _saved_tensor_hook_calls(eager.fn), f"call {call}"
        assert got["pack"] > 0 or traced.refused is not None
    assert transformed.cache_info().eager == (traced.refused is not None)


# --- the other entry points -------------------------------------------------------------------


_COMPILED = [name for name in PROGRAMS if not name.startswith("wgan_gp")]


@pytest.mark.parametrize("name", _COMPILED)
def test_the_backend_gives_eager_gradients_and_state(name: str) -> None:
    """AOTAutograd traces above the dispatcher, so the backend keeps what autograd sees. (A
    WGAN-GP penalty, autograd.grad(create_graph=True) inside the compiled function, raises
    under torch.compile's AOTAutograd as under "aot_eager": double backward is unsupported.)"""
    eager, traced = PROGRAMS[name](), PROGRAMS[name]()
    samples = make_samples([SAMPLE_SHAPE] * eager.arity, 1, seed=stable_seed(name))
    compiled = torch.compile(traced.fn, backend="fxviews")
    try:
        for route in ("backward", "backward_params", "backward"):
            run = ROUTES[route]
            expected, error = _outcome(lambda: run(eager, eager.fn, samples))  # noqa: B023
            if error is not None:
                with pytest.raises(type(error)):
                    run(traced, compiled, samples)
            else:
                assert_tree_close(ROUTES[route](traced, compiled, samples), expected, msg=route)
            assert_tree_close(traced.state, eager.state, msg=f"state after {route}")
    finally:
        torch._dynamo.reset()


class _TDHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(4, 3)

    def forward(self, s: torch.Tensor, s_next: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = 0.5 + 0.9 * self.q(s_next.t().contiguous().t()).max(-1).values
        return (self.q(s).max(-1).values - target).pow(2).sum()


class _FrozenProduct(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, s: torch.Tensor, s_next: torch.Tensor) -> torch.Tensor:
        frozen = self.lin(s_next).detach()
        return (self.lin(s) * frozen + s.t().contiguous().view(-1)[:4]).sum()


def _gradients(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
    leaves = [a.clone().requires_grad_() for a in args]
    params = [p for p in module.parameters() if p.requires_grad]
    out = module(*leaves)
    return out.detach(), torch.autograd.grad(out, [*leaves, *params], allow_unused=True)


def test_rewriting_an_exported_program_keeps_its_gradients_or_refuses() -> None:
    args = (torch.randn(4, 4), torch.randn(4, 4))
    model = _FrozenProduct()
    program = torch.export.export(model, args)
    result = fxviews.rewrite(program)
    assert result.modified  # the merging view became a reshape
    expected = _gradients(model, args)
    assert_tree_close(_gradients(program.module(), args), expected)
    assert_tree_close(_gradients(result.exported_program.module(), args), expected)

    # Lowering the training IR would inline the no_grad region: refused, not differentiated.
    head = _TDHead()
    program = torch.export.export(head, args)
    with pytest.raises(fxviews.FxViewsError, match="grad-mode region"):
        fxviews.rewrite(program)
    # Inference consumers (ONNX, ExecuTorch) lower it as before: their runtimes never
    # differentiate.
    lowered = rewrite_exported(program, inference=True).exported_program
    torch.testing.assert_close(lowered.module()(*args), head(*args))


def test_a_refusal_stands_where_fn_catches_it() -> None:
    def swallowing(x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        try:
            h.register_hook(lambda g: g * 2)
        except Exception:  # noqa: BLE001, S110 - the user's code swallows whatever it meets
            pass
        return h.sum()

    with pytest.raises(fxviews.TracingError, match="register_hook") as caught:
        fxviews.trace(swallowing, torch.ones(3, requires_grad=True))
    assert caught.value.cause == "autograd"


@pytest.mark.parametrize(
    ("name", "kept"), [("dqn_td", True), ("qat_ste", False), ("wgan_gp", False)]
)
def test_functionalize_keeps_regions_and_refuses_what_it_transforms(name: str, kept: bool) -> None:
    """``functionalize=True`` traces ``fn`` inside a torch.func transform: a custom Function or
    ``requires_grad_`` there is refused for good (not retried on every call)."""
    eager, traced = PROGRAMS[name](), PROGRAMS[name]()
    samples = make_samples([SAMPLE_SHAPE] * eager.arity, 1, seed=stable_seed(name))
    transformed = fxviews.transform(traced.fn, functionalize=True)
    for _ in range(2):
        got = ROUTES["backward"](traced, transformed, samples)
        assert_tree_close(got, ROUTES["backward"](eager, eager.fn, samples))
    assert transformed.cache_info()[1:] == (1, 32, 1, 0 if kept else 1)


# --- reads of autograd state, and leaves made inside fn ----------------------------------------


def _training_steps(
    step: Callable[[torch.nn.Module], None], wrap: Callable[[Callable[[], None]], Any]
) -> tuple[list[torch.Tensor], Any]:
    """Parameters and their ``.grad`` over three steps of a model trained by ``wrap``-ed
    ``step`` (which reads the parameters' ``.grad``), with ``zero_grad()`` between them
    (set_to_none: each backward makes new ``.grad`` tensors); and the wrapped step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    run = wrap(lambda: step(model))
    seen = []
    for call in range(3):
        model.zero_grad()
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(call))
        model(x).pow(2).sum().backward()
        run()
        seen += [t.detach().clone() for p in model.parameters() for t in (p, p.grad)]
    return seen, run


def _clipped_sgd(model: torch.nn.Module) -> None:
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.1 * p.grad)


def test_reading_grad_of_a_closed_over_parameter_runs_eagerly() -> None:
    got, transformed = _training_steps(_clipped_sgd, fxviews.transform)
    assert_tree_close(got, _training_steps(_clipped_sgd, lambda f: f)[0])
    assert transformed.cache_info().eager == 1  # its reason warned once, never traced again


def _sgd_step(p: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if p.grad is not None:
            p.sub_(0.1 * p.grad)
    return p * 2


@pytest.mark.parametrize(
    ("read", "make"),
    [
        (lambda x: x.is_leaf, lambda: torch.ones(3, requires_grad=True)),
        (lambda x: x.grad_fn is None, lambda: torch.ones(3, requires_grad=True)),
        (lambda x: x.retains_grad, lambda: _retaining(torch.ones(3, requires_grad=True) * 1)),
        (lambda x: x.grad is not None, lambda: _with_grad(torch.ones(3, requires_grad=True))),
        (lambda x: x.is_inference(), lambda: _inference(torch.ones(3))),
        (lambda x: x._is_view(), lambda: torch.ones(5)[1:4]),
        (lambda x: x._base is None, lambda: torch.ones(5)[1:4]),
        (lambda x: isinstance(x, torch.nn.Parameter), lambda: torch.nn.Parameter(torch.ones(3))),
    ],
)
def test_a_branch_on_an_arguments_autograd_state_takes_the_calls_side(
    read: Callable[[torch.Tensor], bool], make: Callable[[], torch.Tensor]
) -> None:
    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if read(x) else 3.0)

    transformed = fxviews.transform(branchy)
    for _ in range(3):
        x = make()
        assert_tree_close(transformed(x), branchy(x))


def _retaining(x: torch.Tensor) -> torch.Tensor:
    x.retain_grad()
    return x


def _with_grad(x: torch.Tensor) -> torch.Tensor:
    x.grad = torch.full_like(x, 5.0)
    return x


def _inference(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return x.clone()


def test_an_sgd_step_on_an_argument_updates_it_as_eager_does() -> None:
    params = [torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0])) for _ in range(2)]
    seen: list[list[Any]] = [[], []]
    for fn, p, got in zip((_sgd_step, fxviews.transform(_sgd_step)), params, seen, strict=True):
        for _ in range(3):
            (p * p).sum().backward()
            got += [fn(p), p.grad]
            p.grad = None
        got.append(p.detach().clone())
    assert_tree_close(seen[1], seen[0])


@pytest.mark.parametrize(
    "make",
    [
        lambda x: torch.zeros(3, dtype=x.dtype, requires_grad=True),
        lambda x: torch.zeros_like(x, requires_grad=True),
        lambda x: torch.full((3,), 2.0, dtype=x.dtype, requires_grad=True),
        lambda x: x.new_ones(3, requires_grad=True),
        lambda x: torch.arange(3.0, dtype=x.dtype, requires_grad=True),
        lambda x: torch.tensor([1.0, 2.0, 3.0], dtype=x.dtype, requires_grad=True),
    ],
)
def test_a_leaf_made_requiring_grad_inside_fn_is_one_as_in_eager(
    make: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    weight = [torch.randn(3, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    weight[1].data.copy_(weight[0].detach())

    def calls(w: torch.Tensor) -> Callable[[torch.Tensor], Any]:
        def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            leaf = make(x)
            return ((x + leaf) @ w).pow(2).sum(), leaf

        return fn

    seen: list[list[Any]] = [[], []]
    for fn, w, got in zip((calls(weight[0]), fxviews.transform(calls(weight[1]))), weight, seen,
                          strict=True):  # fmt: skip
        for call in range(3):
            w.grad = None
            x = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(call),
                            requires_grad=True)  # fmt: skip
            loss, leaf = fn(x)
            loss.backward()
            got += [loss.detach(), leaf.is_leaf, leaf.requires_grad, leaf.grad, x.grad, w.grad]
    assert_tree_close(seen[1], seen[0])


def test_a_tensor_made_from_data_inside_fn_is_new_at_each_call() -> None:
    def accumulate(x: torch.Tensor) -> torch.Tensor:
        total = torch.tensor([1.0, 2.0, 3.0])
        return total.add_(x) * 2

    transformed = fxviews.transform(accumulate)
    for _ in range(3):
        assert_tree_close(transformed(torch.ones(3)), accumulate(torch.ones(3)))


_MIXING = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
_READOUT = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)


def _penalty_through_a_hooked_argument(x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(((x @ _READOUT) ** 3).sum(), x, create_graph=True)
    return (g**2).sum()


def _grads_of_what_made_the_argument(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = ((x @ _READOUT) ** 2).sum()
    return torch.autograd.grad(y, [_MIXING, _READOUT], allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("hooked", [False, True])
@pytest.mark.parametrize(
    "fn", [_penalty_through_a_hooked_argument, _grads_of_what_made_the_argument]
)
def test_an_inner_gradient_reaching_an_argument_is_eagers(fn: Callable, hooked: bool) -> None:
    # Eager's torch.autograd.grad inside fn goes on past the argument into the caller's graph:
    # through the hook the caller registered on it, to the parameter it was computed from. The
    # trace's stand-in for the argument has no such past: such a call runs eagerly.
    transformed = fxviews.transform(fn)
    results: list[list[Any]] = [[], []]
    for f, got in zip((fn, transformed), results, strict=True):
        for call in range(3):
            source = torch.randn(
                3, dtype=torch.float64, generator=torch.Generator().manual_seed(call)
            )
            x = (source @ _MIXING).sin() if fn is _grads_of_what_made_the_argument else source
            x = x if x.requires_grad else x.requires_grad_()
            if hooked:
                x.register_hook(lambda g: g * 10)
            got.append(f(x))
    assert_tree_close(results[1], results[0])
    assert transformed.cache_info().eager == 1


# --- .data and detach_: the call's tensor, as eager's ------------------------------------------


def _scale_through_data(w: torch.Tensor) -> torch.Tensor:
    y = w * w
    w.data.mul_(2)  # a manual update: .data has a version counter of its own
    return y.sum()


def _zero_through_data(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = w * 2
    z = y * y
    y.data.zero_()
    return z.sum(), y


def _data_of(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = w.data
    y = w.sin()  # saves w, which the write below changes without a version bump
    return y.sum(), d.add_(1)


@pytest.mark.parametrize("fn", [_scale_through_data, _zero_through_data, _data_of])
def test_data_shares_memory_not_the_version_counter_as_in_eager(fn: Callable[..., Any]) -> None:
    def outcome(run: Callable[..., Any]) -> list[Any]:
        w = torch.arange(1.0, 4.0, requires_grad=True)
        out = run(w)
        loss, *rest = out if isinstance(out, tuple) else (out,)
        loss.backward()
        shared = [r.data_ptr() == w.data_ptr() for r in rest if r is not None]
        return [loss.detach(), *[r.detach() for r in rest], w.grad, w.detach(), shared,
                [(r.requires_grad, r._version, w._version) for r in rest]]  # fmt: skip

    transformed = fxviews.transform(fn)
    for _ in range(2):
        assert_tree_close(outcome(transformed), outcome(fn))
    assert_tree_close(outcome(fxviews.trace(fn, torch.arange(1.0, 4.0, requires_grad=True))),
                      outcome(fn))  # fmt: skip
    assert transformed.cache_info()[:2] == (1, 1)


def test_data_under_the_callers_transforms_is_eagers() -> None:
    def per_sample(fn: Callable[..., Any]) -> list[Any]:
        w = torch.arange(1.0, 4.0)
        return [torch.func.grad(fn)(w), w]

    transformed = fxviews.transform(_scale_through_data)
    assert_tree_close(per_sample(transformed), per_sample(_scale_through_data))
    with pytest.raises(RuntimeError, match="accessing `data` under vmap transform is not allowed"):
        torch.func.vmap(transformed)(torch.ones(2, 3))


def test_detaching_an_argument_that_is_a_view_in_place_raises_as_eager() -> None:
    def detached_bump(x: torch.Tensor) -> torch.Tensor:
        return x.detach_().add_(1)

    transformed = fxviews.transform(detached_bump)
    for _ in range(2):  # one signature: whether the call's tensor is a view is not part of it
        x, y = (torch.arange(6.0).reshape(2, 3).clone() for _ in range(2))
        assert_tree_close([transformed(x), x], [detached_bump(y), y])
        for run in (detached_bump, transformed):
            view = torch.arange(6.0).reshape(2, 3)
            with pytest.raises(RuntimeError, match="Can't detach views in-place"):
                run(view)
            assert_tree_close(view, torch.arange(6.0).reshape(2, 3))  # nothing written
    assert transformed.cache_info()[:2] == (3, 1)
