"""The model is live: what libraries do to a model between calls, followed on every call.

Each test runs a model through ``fxviews.transform`` and an eager twin (a deep copy) side by
side, changes both the same way between calls (parameters swapped by ``functional_call``,
``stack_module_state`` ensembles, MAML steps, parametrizations, ``swap_tensors``,
``load_state_dict``, dtype changes, ``requires_grad_``, hooks added and removed), and compares
everything a call touches: outputs, gradients and tangents by each route, buffers, parameters
and hook calls (Note [Parameters are read when the graph runs] in
``fxviews/state/module_slots.py``; Note [The state a graph bakes in], item 6, in
``fxviews/state/guard.py``).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, hessian, jvp, stack_module_state, vjp, vmap

import fxviews
from tests.reference import assert_tree_close


class Block(nn.Module):
    """A small model in the style of real ones: a linear layer, a norm with running stats, a
    second layer whose weight is read twice (a tied use), dropout left out (random)."""

    SAMPLE = (5, 4)

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.norm = nn.BatchNorm1d(6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.inp(x)))
        return self.out(h) + h[:, :3] @ self.out.weight[:, :3].t()


class Recurrent(nn.Module):
    """An LSTM and a GRU, whose forward rebuilds a weight cache when their weights change."""

    SAMPLE = (2, 3, 4)

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 5, batch_first=True)
        self.gru = nn.GRU(5, 3, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0])[0].sum(1)


def _twins(model: nn.Module, route: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(transformed, eager) callables of ``model`` and its deep copy, by ``route``:
    ``transform(model)``, ``model.forward = transform(model.forward)``, or the function of
    parameters ``functional_call`` makes of it."""
    twin = copy.deepcopy(model)
    if route == "module":
        return fxviews.transform(model), twin
    if route == "forward":
        model.forward = fxviews.transform(model.forward)  # type: ignore[method-assign]
        return model, twin
    assert route == "functional"
    tf = fxviews.transform(lambda p, x: functional_call(model, p, (x,)))
    return (lambda x: tf(dict(model.named_parameters()), x)), twin


ROUTES = ["module", "forward", "functional"]


def _backward_as_eager(
    tf: Callable[..., Any], model: nn.Module, twin: nn.Module, x: torch.Tensor
) -> None:
    """One call of each twin and ``.backward()``, accumulating into each module's own
    parameters: outputs and ``.grad`` alike."""
    out, ref = tf(x), twin(x)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert_tree_close((out, grads), (ref, {k: p.grad for k, p in twin.named_parameters()}))


@pytest.mark.parametrize("make", [Block, Recurrent])
@pytest.mark.parametrize("route", ROUTES)
def test_calls_follow_training_and_buffers(route, make):
    # A recurrent module's trace holds samples in its weights' slots, and its weight cache
    # follows them: its forward rebinds nothing, and is traced (it ran eagerly, refused, before).
    torch.manual_seed(0)
    model = make()
    tf, twin = _twins(model, route)
    for _ in range(3):
        _backward_as_eager(tf, model, twin, torch.randn(make.SAMPLE))
    assert_tree_close(dict(model.named_buffers()), dict(twin.named_buffers()))
    model.eval(), twin.eval()
    x = torch.randn(make.SAMPLE)
    assert_tree_close(tf(x), twin(x))
    transformed = {"module": tf, "forward": model.forward}.get(route)
    if transformed is not None:  # (the functional route's is inside its lambda)
        assert transformed.cache_info().eager == 0


def test_functional_call_swaps_are_what_runs():
    torch.manual_seed(1)
    model = Block().eval()
    _, twin = _twins(model, "forward")
    x = torch.randn(5, 4)
    model(x)
    call = model
    swapped = {k: v.detach() + 0.5 for k, v in twin.named_parameters()}
    # A dict of all parameters, part of them (strict=False keeps the others), and buffers.
    assert_tree_close(functional_call(call, swapped, (x,)), functional_call(twin, swapped, (x,)))
    part = {"out.weight": swapped["out.weight"]}
    assert_tree_close(functional_call(call, part, (x,)), functional_call(twin, part, (x,)))
    stats = {"norm.running_mean": torch.full((6,), 0.3), "norm.running_var": torch.full((6,), 2.0)}
    assert_tree_close(functional_call(call, stats, (x,)), functional_call(twin, stats, (x,)))
    # After the swaps the module's own tensors are back, and used.
    assert_tree_close(model(x), twin(x))
    with pytest.raises(RuntimeError) as eager_error:
        functional_call(twin, {"nope": torch.ones(1)}, (x,), strict=True)
    with pytest.raises(RuntimeError) as error:
        functional_call(call, {"nope": torch.ones(1)}, (x,), strict=True)
    assert str(error.value) == str(eager_error.value)


def test_tied_weights_through_functional_call():
    torch.manual_seed(2)

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Linear(4, 4, bias=False)
            self.dec = nn.Linear(4, 4, bias=False)
            self.dec.weight = self.enc.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dec(torch.relu(self.enc(x)))

    model = Tied()
    tf, twin = _twins(model, "forward")
    x = torch.randn(3, 4)
    assert_tree_close(model(x), twin(x))
    new = {"enc.weight": torch.randn(4, 4)}
    for tie in (True, False):
        got = functional_call(model, new, (x,), tie_weights=tie)
        assert_tree_close(got, functional_call(twin, new, (x,), tie_weights=tie))


def _loss(apply: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda p, x: apply(p, x).pow(2).sum()


@pytest.mark.parametrize("route", ["forward", "functional"])
def test_parameters_swapped_under_each_transform(route):
    torch.manual_seed(3)
    model = Block().eval()
    twin = copy.deepcopy(model)
    if route == "forward":  # the library swaps the transformed model's parameters
        model.forward = fxviews.transform(model.forward)  # type: ignore[method-assign]
        apply = lambda p, x: functional_call(model, p, (x,))  # noqa: E731
    else:  # the function of the parameters is transformed
        apply = fxviews.transform(lambda p, x: functional_call(model, p, (x,)))
    eager = lambda p, x: functional_call(twin, p, (x,))  # noqa: E731
    x = torch.randn(5, 4)
    params = {k: v.detach() + 0.1 for k, v in twin.named_parameters()}
    # grad, vmap(grad) at batch dims 0 and 1 (physically there), jvp, vjp, hessian: all through
    # the parameters swapped in.
    assert_tree_close(grad(_loss(apply))(params, x), grad(_loss(eager))(params, x))
    per_sample = lambda f: lambda p, xi: _loss(f)(p, xi[None])  # noqa: E731
    for dim in (0, 1):
        xb = x.movedim(0, dim).contiguous().movedim(dim, 0)
        got = vmap(grad(per_sample(apply)), (None, 0))(params, xb)
        assert_tree_close(got, vmap(grad(per_sample(eager)), (None, 0))(params, xb))
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    got = jvp(lambda p: _loss(apply)(p, x), (params,), (tangents,))
    assert_tree_close(got, jvp(lambda p: _loss(eager)(p, x), (params,), (tangents,)))
    cotangent = torch.randn(())
    got = vjp(lambda p: _loss(apply)(p, x), params)
    want = vjp(lambda p: _loss(eager)(p, x), params)
    assert_tree_close((got[0], got[1](cotangent)), (want[0], want[1](cotangent)))
    small = {"out.bias": params["out.bias"]}
    got = hessian(lambda p: _loss(apply)(p, x))(small)
    assert_tree_close(got, hessian(lambda p: _loss(eager)(p, x))(small))


@pytest.mark.parametrize("in_dim", [0, 1])
def test_stack_module_state_ensemble_gets_a_graph(in_dim):
    torch.manual_seed(4)
    members = [nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)) for _ in range(3)]
    params, buffers = stack_module_state(members)
    # The batch dim physically at in_dim, as vmap's in_dims says.
    params = {
        k: v.movedim(0, in_dim).contiguous().movedim(in_dim, 0) if v.dim() > in_dim else v
        for k, v in params.items()
    }
    base = copy.deepcopy(members[0]).to("meta")

    def ensemble(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor):
        return functional_call(base, (p, b), (x,))

    tf = fxviews.transform(ensemble)
    x = torch.randn(6, 4)
    expected = torch.stack([m(x) for m in members])
    for _ in range(2):
        assert_tree_close(vmap(tf, in_dims=(0, 0, None))(params, buffers, x), expected)
    assert tf.cache_info().eager == 0 and tf.cache_info().misses == 1

    # The model's own forward transformed, the ensemble swapped in by functional_call.
    model = copy.deepcopy(members[0])
    model.forward = fxviews.transform(model.forward)  # type: ignore[method-assign]
    got = vmap(lambda p, xx: functional_call(model, p, (xx,)), in_dims=(0, None))(params, x)
    assert_tree_close(got, expected)
    assert model.forward.cache_info().eager == 0  # type: ignore[attr-defined]


def test_maml_inner_steps_swap_parameters():
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    tf, twin = _twins(net, "forward")

    def adapted_loss(module: nn.Module, p: dict[str, torch.Tensor], x, y) -> torch.Tensor:
        for _ in range(2):
            g = grad(lambda q: (functional_call(module, q, (x,)) - y).pow(2).mean())(p)
            p = {k: v - 0.1 * g[k] for k, v in p.items()}
        return (functional_call(module, p, (x,)) - y).pow(2).mean()

    p0 = {k: v.detach() for k, v in twin.named_parameters()}
    for x, y in [(torch.randn(6, 4), torch.randn(6, 1)) for _ in range(2)]:
        got = grad(adapted_loss, argnums=1)(net, p0, x, y)
        want = grad(adapted_loss, argnums=1)(twin, p0, x, y)
        assert_tree_close(got, want)
        p0 = {k: v - 0.05 * want[k] for k, v in p0.items()}


@pytest.mark.parametrize("kind", ["orthogonal", "weight_norm"])
def test_parametrizations(kind):
    torch.manual_seed(6)
    layer = nn.Linear(4, 4)
    getattr(nn.utils.parametrizations, kind)(layer)
    tf, twin = _twins(layer, "module")
    x = torch.randn(3, 4)
    for _ in range(2):
        out, ref = tf(x), twin(x)
        assert_tree_close(out, ref)
        got = torch.autograd.grad(out.pow(2).sum(), list(layer.parameters()))
        want = torch.autograd.grad(ref.pow(2).sum(), list(twin.parameters()))
        assert_tree_close(got, want)
        with torch.no_grad():  # an optimizer step on the parametrization's original
            for p, q in zip(layer.parameters(), twin.parameters(), strict=True):
                p.sub_(0.1 * torch.ones_like(p))
                q.sub_(0.1 * torch.ones_like(q))


def test_swap_tensors_load_state_dict_and_dtype_changes():
    torch.manual_seed(7)
    model = Block().eval()
    tf, twin = _twins(model, "forward")
    x = torch.randn(5, 4)
    assert_tree_close(model(x), twin(x))
    for m in (model, twin):  # the same object, other contents
        torch.utils.swap_tensors(m.out.weight, nn.Parameter(torch.ones(3, 6)))
    assert_tree_close(model(x), twin(x))
    state = {k: v + 1 for k, v in Block().eval().state_dict().items()}
    for assign in (False, True):
        model.load_state_dict(state, assign=assign), twin.load_state_dict(state, assign=assign)
        assert_tree_close(model(x), twin(x))
    model.double(), twin.double()
    assert_tree_close(model(x.double()), twin(x.double()))
    model.inp.weight.requires_grad_(False), twin.inp.weight.requires_grad_(False)
    got = torch.autograd.grad(model(x.double()).sum(), [model.out.weight, model.inp.bias])
    want = torch.autograd.grad(twin(x.double()).sum(), [twin.out.weight, twin.inp.bias])
    assert_tree_close(got, want)


def test_meta_sgd_style_parameter_replaced_by_a_plain_tensor():
    # torchopt's MetaSGD: pop the Parameter, set a plain tensor attribute in its place.
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    tf, twin = _twins(model, "forward")
    x = torch.randn(3, 4)
    assert_tree_close(model(x), twin(x))
    for step in range(3):
        for m in (model, twin):
            sub = m[0]
            w = sub._parameters.pop("weight", None)
            sub.weight = (w if w is not None else sub.weight).detach() * 0.5 + step
        assert_tree_close(model(x), twin(x))
    # A trace, one more once the parameter became a plain tensor attribute: a slot too, so
    # each step's tensor runs that graph.
    assert model.forward.cache_info().misses == 2  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# Hooks


def _hookable_twins(route: str) -> tuple[nn.Module, Callable[..., Any], Callable[..., Any]]:
    """A small model, and its transformed and eager twins by ``route`` (see :func:`_twins`)."""
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    tf, twin = _twins(model, route)
    return model, tf, twin


def _hook_kinds() -> dict[str, Callable[[nn.Module, list[str]], Any]]:
    """Each kind of module hook, registered on a module, appending its name when it runs."""
    return {
        "forward": lambda m, log: m.register_forward_hook(lambda *a: log.append("f")),
        "forward doubling": lambda m, log: m.register_forward_hook(
            lambda mod, args, out: (log.append("fd"), out * 2)[1]
        ),
        "forward always called": lambda m, log: m.register_forward_hook(
            lambda *a: log.append("fa"), always_call=True
        ),
        "forward pre": lambda m, log: m.register_forward_pre_hook(lambda *a: log.append("p")),
        "full backward": lambda m, log: m.register_full_backward_hook(lambda *a: log.append("b")),
        "backward pre": lambda m, log: m.register_full_backward_pre_hook(
            lambda *a: log.append("bp")
        ),
    }


@pytest.mark.parametrize("where", ["root", "submodule"])
@pytest.mark.parametrize("kind", sorted(_hook_kinds()))
@pytest.mark.parametrize("route", ["module", "forward"])
def test_hooks_added_and_removed_between_calls_run_as_eager(route, kind, where):
    model, tf, twin = _hookable_twins(route)
    log: list[str] = []
    ref_log: list[str] = []

    def step() -> None:
        x = torch.randn(3, 4, requires_grad=True)
        out, ref = tf(x), twin(x)
        assert_tree_close(out, ref)
        got = torch.autograd.grad(out.pow(2).sum(), x)
        assert_tree_close(got, torch.autograd.grad(ref.pow(2).sum(), x))
        assert log == ref_log

    step()  # traced without hooks
    register = _hook_kinds()[kind]
    handles = [
        register(model if where == "root" else model[2], log),
        register(twin if where == "root" else twin[2], ref_log),
    ]
    step()
    step()
    for handle in handles:
        handle.remove()
    step()  # the hook's effect is gone again
    assert log and log == ref_log


def test_hooks_present_at_the_first_call_and_global_hooks():
    torch.manual_seed(10)
    lin = nn.Linear(4, 3)
    calls: list[int] = []
    lin.register_forward_hook(lambda *a: calls.append(1))
    tf = fxviews.transform(lin)
    x = torch.randn(2, 4)
    for _ in range(3):
        assert_tree_close(tf(x), x @ lin.weight.t() + lin.bias)
    assert len(calls) == 3

    seen: list[str] = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, a, o: seen.append(type(m).__name__)
    )
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        tf2 = fxviews.transform(model)
        tf2(x), tf2(x)
    finally:
        handle.remove()
    expected = ["Linear", "ReLU", "Sequential"] * 2
    assert seen == expected
    tf2(x)
    assert seen == expected  # removed: nothing more runs it


def _global_hook_kinds() -> dict[str, Callable[[Callable[[nn.Module], None]], Any]]:
    """Each kind of global module hook, calling ``note(module)`` when it runs."""
    hooks = nn.modules.module
    return {
        "forward": lambda note: hooks.register_module_forward_hook(lambda m, a, o: note(m)),
        "forward always called": lambda note: hooks.register_module_forward_hook(
            lambda m, a, o: note(m), always_call=True
        ),
        "forward pre": lambda note: hooks.register_module_forward_pre_hook(lambda m, a: note(m)),
        "full backward": lambda note: hooks.register_module_full_backward_hook(
            lambda m, gi, go: note(m)
        ),
        "backward pre": lambda note: hooks.register_module_full_backward_pre_hook(
            lambda m, go: note(m)
        ),
    }


@pytest.mark.parametrize("first", [False, True], ids=["added_later", "at_the_first_call"])
@pytest.mark.parametrize("kind", sorted(_global_hook_kinds()))
@pytest.mark.parametrize("route", ["module", "forward"])
def test_global_hooks_added_and_removed_between_calls_run_as_eager(route, kind, first):
    # A refused trace runs fn again eagerly: no hook may have run in the refused one (a global
    # forward-pre hook registered before fxviews' own check, an always-called forward hook
    # that nn.Module runs as the refusal leaves the call).
    model, tf, twin = _hookable_twins(route)
    names = {
        **{id(m): f"model.{n}" for n, m in model.named_modules()},
        **{id(m): f"twin.{n}" for n, m in twin.named_modules()},
    }
    log: list[str] = []

    def note(module: nn.Module) -> None:
        if id(module) in names:  # one hook sees every module's calls: each side's, by name
            log.append(names[id(module)])

    def step() -> tuple[list[str], list[str]]:
        x = torch.randn(3, 4, requires_grad=True)
        log.clear()
        out = tf(x)
        got = torch.autograd.grad(out.pow(2).sum(), x)
        ours = [name.removeprefix("model.") for name in log]
        log.clear()
        ref = twin(x)
        want = torch.autograd.grad(ref.pow(2).sum(), x)
        assert_tree_close((out, got), (ref, want))
        return ours, [name.removeprefix("twin.") for name in log]

    if not first:
        step()  # traced without hooks
    handle = _global_hook_kinds()[kind](note)
    try:
        for _ in range(2):
            ours, eagers = step()
            assert ours == eagers and eagers
    finally:
        handle.remove()
    assert step() == ([], [])  # removed: nothing runs it


def _wrap_submodule_forward(model: nn.Module) -> None:
    # accelerate's add_hook_to_module: a wrapper of the old forward, put on the instance.
    inner = model[0].forward
    model[0].forward = lambda x: inner(x) * 3


def _set_root_forward(model: nn.Module) -> None:
    model.forward = types.MethodType(lambda self, x: self[2](self[1](self[0](x)) - 1), model)


def _change_a_number(model: nn.Module) -> None:
    model[1].negative_slope = 0.5


def _add_and_delete_attributes(model: nn.Module) -> None:
    model[1].note = "read by nothing"  # only retraces
    del model[1].note
    model[1].negative_slope = -2.0


def _drop_a_submodule(model: nn.Module) -> None:
    # No registration hook runs for a deletion (del m.sub, or the dict written directly).
    del model._modules["1"]


@pytest.mark.parametrize(
    ("route", "change"),
    [
        (route, change)
        for route in ("module", "forward")
        for change in (
            _wrap_submodule_forward,
            _set_root_forward,  # under "forward", the root's forward is the transformed one
            _change_a_number,
            _add_and_delete_attributes,
            _drop_a_submodule,
        )
        if route == "module" or change is not _set_root_forward
    ],
    ids=lambda p: p if isinstance(p, str) else p.__name__.strip("_"),
)
def test_what_a_module_binds_is_read_as_eager_reads_it(route, change):
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.1), nn.Linear(4, 2))
    tf, twin = _twins(model, route)

    def step() -> None:
        x = torch.randn(3, 4, requires_grad=True)
        out, ref = tf(x - 0.5), twin(x - 0.5)
        got = torch.autograd.grad(out.pow(2).sum(), [x, *model.parameters()])
        want = torch.autograd.grad(ref.pow(2).sum(), [x, *twin.parameters()])
        assert_tree_close((out, got), (ref, want))

    step()
    change(model), change(twin)
    step()
    step()


def test_a_tensor_attribute_of_a_module_found_while_tracing_is_bound_by_identity():
    # Reached through an object that is no module, the module's tensors are held by the graph:
    # a plain tensor attribute assigned anew must be seen (no registration hook counts it).
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.tensor(2.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    holder = types.SimpleNamespace(net=Scaled())
    tf = fxviews.transform(lambda x: holder.net(x) + 1)
    x = torch.randn(3)
    for scale in (2.0, 5.0, -1.0):
        holder.net.scale = torch.tensor(scale)
        assert_tree_close(tf(x), x * scale + 1)


def test_train_and_eval_alternating_reuse_their_graphs():
    # A mode change writes the module's dict (its version tag moves): the entry of the mode is
    # found again by comparing, not traced again.
    torch.manual_seed(14)
    model = Block()
    tf, twin = _twins(model, "module")
    for _ in range(3):
        for mode in (True, False):
            model.train(mode), twin.train(mode)
            x = torch.randn(5, 4)
            assert_tree_close(tf(x), twin(x))
    assert tf.cache_info().misses == 2
    assert_tree_close(dict(model.named_buffers()), dict(twin.named_buffers()))


def test_a_module_holding_objects_whose_dunders_raise():
    # e3nn's Irreps: len() may raise; a module holds it and branches on other attributes.
    class Irreps(tuple):
        def __len__(self) -> int:
            raise NotImplementedError

        def __eq__(self, other: object) -> bool:
            raise NotImplementedError

        __hash__ = tuple.__hash__

    class Equivariant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.irreps = Irreps((1, 2))
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * 2

    model = Equivariant()
    tf, twin = _twins(model, "forward")
    x = torch.randn(2, 4)
    for _ in range(2):
        assert_tree_close(model(x), twin(x))


def test_a_swap_of_the_same_kind_reuses_the_graph():
    # "No retrace where the signature is the same": functional_call's swaps, a parameter
    # assigned in place of one, and swap_tensors each run the one graph on what they put there.
    torch.manual_seed(11)
    model = Block().eval()
    _, twin = _twins(model, "forward")
    x = torch.randn(5, 4)
    model(x)
    for step in range(3):
        swapped = {k: nn.Parameter(v.detach() * (step + 2)) for k, v in twin.named_parameters()}
        assert_tree_close(
            functional_call(model, swapped, (x,)), functional_call(twin, swapped, (x,))
        )
    for m in (model, twin):
        m.out.weight = nn.Parameter(torch.ones(3, 6))
        torch.utils.swap_tensors(m.inp.bias, nn.Parameter(torch.zeros(6)))
    assert_tree_close(model(x), twin(x))
    assert model.forward.cache_info().misses == 1  # type: ignore[attr-defined]


def test_without_dict_version_tags_every_call_compares(monkeypatch):
    # A Python whose dicts carry no version tag PyTorch can read: the guard compares what the
    # modules bind on every call instead, and still sees each change.
    import fxviews.calls.cache
    import fxviews.state.guard

    for where in (fxviews.state.guard, fxviews.calls.cache):
        monkeypatch.setattr(where, "read_version", lambda held: object())
    torch.manual_seed(15)
    model = nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.1), nn.Linear(4, 2))
    tf, twin = _twins(model, "module")
    x = torch.randn(3, 4) - 0.5
    for change in (lambda m: None, _change_a_number, _wrap_submodule_forward, lambda m: m.eval()):
        change(model), change(twin)
        assert_tree_close(tf(x), twin(x))


def test_a_recurrent_module_swapped_in_per_sample_gets_a_graph():
    # An LSTM's weights swapped in by functional_call, under vmap(grad): each sample's
    # gradient of the new weights, from one graph. (Eager vmap of a GRU raises for its
    # in-place update, so the LSTM alone.)
    torch.manual_seed(17)
    lstm = nn.LSTM(4, 5, batch_first=True)
    params = {k: v.detach() + 0.1 for k, v in lstm.named_parameters()}

    def per_sample(apply: Callable[..., Any]) -> Callable[..., Any]:
        return grad(lambda p, xi: apply(p, xi)[0].sum())

    eager = lambda p, xi: functional_call(lstm, p, (xi[None],))  # noqa: E731
    tf = fxviews.transform(eager)
    xb = torch.randn(3, 2, 4)
    got = vmap(per_sample(tf), (None, 0))(params, xb)
    assert_tree_close(got, vmap(per_sample(eager), (None, 0))(params, xb))
    assert tf.cache_info().eager == 0
