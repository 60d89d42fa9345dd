"""What a transformed function returns is what eager returns (Note [What fn returns] in
``fxviews/calls/rebuilding.py``): the same types (``torch.Size``, ``nn.Parameter``, named
tuples, PyTorch's return types, dataclasses, dicts of each kind), the same objects where eager
hands the same out (an argument, a closed-over tensor or list, one tensor twice), and a
generator, coroutine or object made on each call handed out anew, by running ``fn`` per call.
Each through ``transform`` directly, under ``vmap`` and ``grad``, and the backend, against
eager (:mod:`tests.parity`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging

import pytest
import torch
from torch import nn

import fxviews
from tests.parity import ROUTES, assert_routes_match

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

Pair = collections.namedtuple("Pair", "value doubled")


@dataclasses.dataclass
class Prediction:
    mean: torch.Tensor
    scale: torch.Tensor
    label: str = "p"


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: torch.Tensor
    inner: Prediction


@dataclasses.dataclass
class Labelled:
    """A dataclass whose ``__post_init__`` changes a field: eager's, run per call."""

    value: torch.Tensor
    label: str = "p"

    def __post_init__(self) -> None:
        self.label = f"{self.label}{self.value.dim()}"


class Stats:
    def __init__(self, total: float) -> None:
        self.total = total


WEIGHT = torch.randn(4)
HISTORY = [1, 2]


def generator(x):
    yield x * 2


async def coroutine(x):
    return x * 2


RESULTS = {
    "size": lambda x: x.shape,
    "size in a tuple": lambda x: (x * 2, x.shape[1:]),
    "parameter": lambda x: nn.Parameter(x * 2),
    "parameter without grad": lambda x: nn.Parameter(x * 2, requires_grad=False),
    "named tuple": lambda x: Pair(x, x * 2),
    "return type": lambda x: x.max(0),
    "dataclass": lambda x: Prediction(x.mean(0), x.std(0)),
    "nested frozen dataclass": lambda x: Frozen(x * 2, Prediction(x, x)),
    "dataclass with __post_init__": lambda x: Labelled(x * 2),
    "ordered dict": lambda x: collections.OrderedDict(b=x * 2, a=x),
    "defaultdict": lambda x: collections.defaultdict(list, a=x * 2),
    "argument": lambda x: x,
    "argument twice": lambda x: (x, x),
    "one result twice": lambda x: (lambda y: (y, y))(x * 2),
    "view of the argument": lambda x: x[0],
    "closed-over tensor": lambda x: (x * 2, WEIGHT),
    "closed-over list": lambda x: (x * 2, HISTORY),
    "dtype, device and a string": lambda x: (x.dtype, x.device, "s"),
    "python number": lambda x: float(x.shape[0]) * 2,
    "generator function": generator,
    "generator expression": lambda x: (row * 2 for row in x),
    "coroutine": coroutine,
    "set": lambda x: (x * 2, {"a", "b"}),
    "object of its own class": lambda x: (x * 2, Stats(3.0)),
}


#: Routes a case leaves out, and why: not fxviews' to match.
SKIPPED_ROUTES = {
    # Dynamo returns a tuple_iterator for a generator expression, with any backend ("eager" too).
    "generator expression": ("backend",),
}


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
@pytest.mark.parametrize("name", RESULTS)
def test_results_are_eagers(name, caplog):
    routes = [r for r in ROUTES if r not in SKIPPED_ROUTES.get(name, ())]
    with caplog.at_level(logging.ERROR, logger="fxviews"):
        assert_routes_match(RESULTS[name], [torch.randn(3, 4)], routes)


@pytest.mark.parametrize("name", ["generator function", "generator expression", "coroutine"])
def test_a_generator_or_coroutine_is_made_and_run_per_call(name):
    tf = fxviews.transform(RESULTS[name])
    x = torch.randn(3, 4)
    first, second = tf(x), tf(x)
    assert first is not second
    expected = {"generator function": [x * 2], "generator expression": list(x * 2)}
    for made in (first, second):
        if name == "coroutine":
            torch.testing.assert_close(asyncio.run(made), x * 2)
        else:
            torch.testing.assert_close(list(made), expected[name])
    assert tf.cache_info().eager == 1


def test_an_object_made_per_call_is_new_per_call():
    tf = fxviews.transform(RESULTS["object of its own class"])
    x = torch.randn(3)
    (_, first), (_, second) = tf(x), tf(x)
    assert first is not second and tf.cache_info().eager == 1


def test_what_fn_reached_is_handed_out_itself():
    """A list, dict or object fn reached before the call is the result's own item, as eager's:
    pytree would have rebuilt a copy holding the trace's items."""
    config = {"scale": 2.0}
    holder = nn.Linear(2, 2)
    holder.extra = ["a"]
    tf = fxviews.transform(lambda x: (x * 2, HISTORY, config, holder.extra))
    x = torch.randn(3)
    for _ in range(2):
        _, history, got_config, extra = tf(x)
        assert history is HISTORY and got_config is config and extra is holder.extra
