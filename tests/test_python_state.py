"""Python state ``fn`` changes while it runs: lists it logs into, dicts it caches in or is
passed, sets, deques, closure cells, mutable defaults, Python's and NumPy's random streams,
and iterators it takes items from (Note [Python state a trace rebinds],
``fxviews/state/python_state.py``).

A graph cannot replay a Python statement: traced once, ``losses.append(loss)`` would run once.
Each program here runs through ``fxviews.transform`` and eagerly from fresh state, and after
every call the outputs, the gradients ``.backward()`` leaves and the Python state must be
eager's; programs that only read their containers must still get a graph.
"""

from __future__ import annotations

import collections
import collections.abc
import logging
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch._C._functorch import is_batchedtensor
from torch.func import grad, jvp, vjp, vmap

import fxviews
from tests.reference import assert_tree_close, per_sample_reference, stack_batched

#: A fresh function, the arguments to pass after the tensor, and what of its Python state to
#: compare.
Program = Callable[[], tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]]

LOSSES: list[torch.Tensor] = []
STATS: dict[str, torch.Tensor] = {}
SEEN: set[tuple[int, ...]] = set()
RECENT: collections.deque[torch.Tensor] = collections.deque(maxlen=2)


def global_logging() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    LOSSES.clear(), STATS.clear(), SEEN.clear(), RECENT.clear()

    def loss(x: torch.Tensor) -> torch.Tensor:
        value = (x.sin() ** 2).sum()
        LOSSES.append(value.detach())
        STATS["mean"] = x.detach().mean()
        SEEN.add(tuple(x.shape))
        RECENT.append(x.detach().max())
        return value

    return loss, (), lambda: (list(LOSSES), dict(STATS), sorted(SEEN), list(RECENT))


class Tracked(nn.Module):
    """A layer that keeps a history and nested per-name logs of what it computed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 4)
        self.history: list[torch.Tensor] = []
        self.logs: dict[str, list[torch.Tensor]] = {"norm": []}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.linear(x))
        self.history.append(y.detach())
        self.logs["norm"].append(y.detach().norm())
        return y


def module_history() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    model = Tracked()
    return model, (), lambda: (model.history, model.logs, model.linear.weight.grad)


def cell(x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """An RNN step carrying its state in a dict it is passed."""
    state["h"] = torch.tanh(state["h"].detach() + x)
    state["steps"] = state.get("steps", 0) + 1
    return state["h"] * 2


def argument_dict() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    state = {"h": torch.zeros(4)}
    return cell, (state,), lambda: dict(state)


def scaled(x: torch.Tensor, log: list[torch.Tensor]) -> torch.Tensor:
    log.append(x.detach().sum())
    return x * 3


def argument_list() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    log: list[torch.Tensor] = []
    return scaled, (log,), lambda: list(log)


def nonlocal_counter() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    calls = 0

    def counted(x: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return x * calls

    return counted, (), lambda: calls


def default_memo() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    def centred(x: torch.Tensor, memo: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        return x - memo.setdefault("first", x.detach().mean())  # type: ignore[union-attr]

    fn = lambda x, f=centred, memo={}: f(x, memo)  # noqa: E731, B006 - the pattern under test
    return fn, (), lambda: dict(fn.__defaults__[1])  # type: ignore[index]


class Explorer(nn.Module):
    """An epsilon-greedy policy drawing from Python's ``random`` and its own ``random.Random``,
    with a NumPy jitter: each call draws anew in eager."""

    def __init__(self) -> None:
        super().__init__()
        random.seed(0)
        np.random.seed(0)
        self.rng = random.Random(1)
        self.noise = np.random.default_rng(2)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        if random.random() < 0.5:
            q = q * 0 + self.rng.randrange(4)
        return q + float(np.random.randn()) + float(self.noise.normal())


def python_random() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    explorer = Explorer()

    def streams() -> Any:
        return hash(random.getstate()), hash(explorer.rng.getstate()), np.random.get_state()[2]

    return explorer, (), streams


def batches() -> collections.abc.Iterator[torch.Tensor]:
    for i in range(8):
        yield torch.full((4,), float(i))


class Streaming(nn.Module):
    """A step that takes its next batch from an iterator it holds: each call takes another."""

    def __init__(self) -> None:
        super().__init__()
        self.source = batches()

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return (w * next(self.source)).sum()


def iterators() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    model = Streaming()
    return model, (), lambda: ()


class Spare(nn.Module):
    """Takes its next scale from an iterator over a list (whose position can be put back), and
    holds another it never advances (torchrl's MLP holds such iterators of its layers' options)."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = iter([torch.ones(4) * i for i in range(8)])
        self.options = iter([{"bias": True}, {"bias": False}])

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return (w * next(self.spare)).sum()


def list_iterators() -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[], Any]]:
    model = Spare()
    return model, (), lambda: ()


PROGRAMS: dict[str, Program] = {
    "global_logging": global_logging,
    "module_history": module_history,
    "argument_dict": argument_dict,
    "argument_list": argument_list,
    "nonlocal_counter": nonlocal_counter,
    "default_memo": default_memo,
    "python_random": python_random,
    "iterators": iterators,
    "list_iterators": list_iterators,
}


def run(program: Program, through: Callable[[Any], Any], calls: int = 4) -> list[Any]:
    """Per call of a fresh ``program`` (through ``through``): its output, the gradient
    ``.backward()`` gives its argument, and its Python state after the call."""
    fn, extra, state = program()
    called = through(fn)
    seen = []
    for i in range(calls):
        x = (torch.linspace(-1, 1, 4) * (i + 1)).requires_grad_()
        out = called(x, *extra)
        out.sum().backward()
        seen.append((out.detach(), x.grad, state()))
    return seen


@pytest.mark.parametrize("name", PROGRAMS)
def test_python_state_a_call_changes_is_eagers_after_every_call(name: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        transformed = run(PROGRAMS[name], fxviews.transform)
    assert_tree_close(transformed, run(PROGRAMS[name], lambda fn: fn), rtol=0, atol=0)
    assert "cannot trace" in caplog.text


def test_the_message_names_the_function_the_state_and_what_to_write_instead(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        run(global_logging, fxviews.transform, calls=2)
        run(module_history, fxviews.transform, calls=1)
        run(nonlocal_counter, fxviews.transform, calls=1)
        run(argument_dict, fxviews.transform, calls=1)
        run(argument_list, fxviews.transform, calls=1)
        run(python_random, fxviews.transform, calls=1)
        run(iterators, fxviews.transform, calls=1)
        run(list_iterators, fxviews.transform, calls=1)
    text = caplog.text
    line = global_logging.__code__.co_firstlineno + 3  # def loss
    assert f"cannot trace global_logging.<locals>.loss (tests/test_python_state.py:{line})" in text
    for changed in (
        "changes the deque global RECENT",
        "changes the dict global STATS",
        "changes the list global LOSSES",
        "changes the set global SEEN",
        "changes the list Tracked.history",
        "changes the list Tracked.logs['norm']",
        "rebinds calls (closed over by nonlocal_counter.<locals>.counted)",
        "changes the dict passed as state",
        "changes the list passed as log",
        "draws from Python's random module",
        "draws from NumPy's random state",
        "draws from the Generator Explorer.noise",
        "reaches the generator Streaming.source",
        "advances the list_iterator Spare.spare",
    ):
        assert changed in text
    assert "return what it logs, caches or updates, and store it after the call" in text
    assert "or pass the value in as an argument" in text
    assert "draw with torch (torch.rand" in text
    assert "take the item outside and pass it in as an argument" in text
    assert "u0" not in text and "Eq(" not in text


def test_a_memo_filled_by_the_first_call_is_traced_from_the_second() -> None:
    fn, _, memo = default_memo()
    tf = fxviews.transform(fn)
    xs = [torch.randn(4) for _ in range(4)]
    eager_fn, _, _ = default_memo()
    for x in xs:
        torch.testing.assert_close(tf(x), eager_fn(x), rtol=0, atol=0)
    assert tf.cache_info().eager == 0 and tf.cache_info().currsize == 1
    assert list(memo()) == ["first"]


WEIGHTS = [torch.randn(4, 4), torch.randn(4)]
CONFIG = {"scale": torch.tensor(0.5), "layers": [torch.randn(4, 4)]}


class Stacked(nn.Module):
    """Layers held in a plain list and a dict, only read."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = [torch.randn(4, 4) for _ in range(2)]
        self.names = {"out": torch.randn(4)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(x @ block)
        return x + self.names["out"]


def read_only(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ WEIGHTS[0] + WEIGHTS[1]) @ CONFIG["layers"][0]
    return y * CONFIG["scale"]


@pytest.mark.parametrize("fn", [read_only, Stacked()], ids=["globals", "module"])
def test_containers_only_read_keep_their_graph(fn: Callable[..., Any]) -> None:
    tf = fxviews.transform(fn)
    samples = [(torch.randn(4),) for _ in range(3)]
    for in_dims in [(0,), (1,)]:
        actual = vmap(tf, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, per_sample_reference(fn, samples, in_dims))
    x, t = torch.randn(4), torch.randn(4)
    for route in (
        lambda f: grad(lambda x: f(x).sum())(x),
        lambda f: jvp(f, (x,), (t,)),
        lambda f: vjp(f, x)[1](t),
        lambda f: vmap(grad(lambda x: f(x).sum()), in_dims=1)(torch.stack([x, t], dim=1)),
    ):
        assert_tree_close(route(tf), route(fn))
    assert tf.cache_info().eager == 0 and tf.cache_info().misses == 2


def test_module_bookkeeping_a_first_call_changes_is_not_the_users() -> None:
    # A lazy module's first call empties its hook dict (PyTorch's bookkeeping, not the user's
    # state): its second call still gets a graph.
    lazy = nn.Sequential(nn.LazyLinear(4), nn.ReLU())
    x = torch.randn(2, 4)
    tf = fxviews.transform(lazy)
    for _ in range(3):
        torch.testing.assert_close(tf(x), lazy(x))
    assert tf.cache_info().eager == 0 and tf.cache_info().currsize == 1


def test_state_written_before_fn_raises_is_what_eager_writes() -> None:
    # fn logs, then raises: under vmap eager logs the batched tensor (escaped), where the trace
    # would have logged one sample's. The trace's write is put back and the call runs eagerly,
    # so the log and the exception are eager's.
    def logged(wrap: Callable[[Any], Any]) -> list[tuple[bool, tuple[int, ...]]]:
        log: list[torch.Tensor] = []

        def checked(x: torch.Tensor) -> torch.Tensor:
            log.append(x.detach())
            if x.shape[0] == 4:
                raise ValueError("four features")
            return x

        with pytest.raises(ValueError, match="four features"):
            vmap(wrap(checked), in_dims=1)(torch.randn(4, 3))
        return [(is_batchedtensor(t), tuple(t.shape)) for t in log]

    assert logged(fxviews.transform) == logged(lambda fn: fn) == [(True, (4,))]


def test_an_iterator_over_a_list_the_function_never_advances_keeps_its_graph() -> None:
    # torchrl's MLP holds iterators over its layers' options, built in __init__ and never
    # advanced by forward: its position is read before the trace and found the same after.
    class Holding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.options = iter([{"bias": True}, {"bias": False}])
            self.lin = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).tanh()

    model = Holding()
    tf = fxviews.transform(model)
    for _ in range(3):
        x = torch.randn(3, 4)
        assert_tree_close(tf(x), model.lin(x).tanh(), rtol=0, atol=0)
    assert tf.cache_info().eager == 0 and tf.cache_info().misses == 1
    assert next(model.options) == {"bias": True}  # not advanced by the trace
