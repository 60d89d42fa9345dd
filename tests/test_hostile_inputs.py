"""The user's objects are theirs to break: generated objects whose dunders raise or lie, reached
by every path fxviews walks, never make ``transform`` fail where eager does not.

Each example builds a class of the user's on a base (``object``, ``list``, ``tuple``, ``dict``,
``set``, ``nn.Module``) whose drawn dunders misbehave (``__len__`` raising or returning -1,
``__iter__``/``items`` raising, ``__getattribute__`` raising, a ``__class__`` that raises or
claims to be a module, a list or a tensor, ``__eq__`` raising or returning an array, ``__hash__``
raising or lying, ``__bool__``/``__repr__`` raising, a module's ``training`` raising), places an
instance where ``fn`` reaches it (a closure cell, a global, a default, a ``functools.partial``
argument, a module's attribute, an argument, an item of a list or dict argument),
and has ``fn`` ignore it or use it as eager code would (``len``, ``bool``, iteration). The
transformed function must have eager's outcome (:mod:`tests.parity`: eager's result, or the
exception type eager raises) called directly (twice, the second time with another instance,
so a key compares the two), under ``vmap`` and ``grad``, and compiled with the backend. A case
where fxviews raises anything else fails. Plus the cases the issue found by hand: a closure cell
``del`` emptied (eager's ``NameError``), a dead ``weakref.proxy``, e3nn's ``Irreps``.
"""

from __future__ import annotations

import functools
import os
import random
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fxviews
from tests.parity import assert_as_eager, assert_routes_match

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
#: A trace and a vmap and grad of it per example: ~50 ms each.
EXAMPLES = int(os.environ.get("FXVIEWS_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Boom(Exception):
    """What the user's dunders raise."""


def _raises(*args: Any, **kwargs: Any) -> Any:
    raise Boom("a dunder of the user's")


class _Truthless:
    """What NumPy's ``==`` returns for arrays: no truth value."""

    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array with more than one element is ambiguous")


#: A misbehaving dunder, by name: what it does instead.
DUNDERS: dict[str, dict[str, Any]] = {
    "__len__": {"raises": _raises, "negative": lambda self: -1},
    "__iter__": {"raises": _raises},
    "__getitem__": {"raises": _raises},
    "__contains__": {"raises": _raises},
    "items": {"raises": _raises},
    "values": {"raises": _raises},
    "keys": {"raises": _raises},
    "__eq__": {"raises": _raises, "array": lambda self, other: _Truthless()},
    "__hash__": {"raises": _raises, "lies": lambda self: random.getrandbits(60)},
    "__bool__": {"raises": _raises},
    "__repr__": {"raises": _raises},
    "__getattribute__": {"raises": _raises},
    "__getattr__": {"raises": _raises},
    "__class__": {
        "raises": property(_raises),
        "claims a module": property(lambda self: nn.Module),
        "claims a list": property(lambda self: list),
        "claims a tensor": property(lambda self: torch.Tensor),
    },
    "__copy__": {"raises": _raises},
    "__deepcopy__": {"raises": _raises},
    "__reduce_ex__": {"raises": _raises},
    "training": {"raises": property(_raises, lambda self, value: None)},
}

BASES: dict[str, Callable[[], Any]] = {
    "object": lambda: type("Plain", (), {})(),
    "list": lambda: type("Items", (list,), {})([1, 2]),
    "tuple": lambda: type("Irreps", (tuple,), {})((1, 2)),
    "dict": lambda: type("Config", (dict,), {})(a=1),
    "set": lambda: type("Tags", (set,), {})({"a"}),
    "module": lambda: type("Block", (nn.Module,), {})(),
}


def hostile(base: str, dunders: dict[str, str]) -> Any:
    """An instance of a class of the user's on ``base`` whose ``dunders`` misbehave as named;
    built well-behaved, then given the hostile class (its own ``__init__`` would trip too)."""
    obj = BASES[base]()
    behaviour = {name: DUNDERS[name][how] for name, how in dunders.items()}
    if "__eq__" in behaviour and "__hash__" not in behaviour:
        behaviour["__hash__"] = lambda self: 1  # hashable, so a key compares two of them
    hostile_class = type(f"Hostile{type(obj).__name__}", (type(obj),), behaviour)
    object.__setattr__(obj, "__class__", hostile_class)
    return obj


#: A hostile object as hypothesis draws it: its base and its dunders' behaviours (built inside
#: the test: hypothesis itself would repr, hash or compare the object).
specs = st.tuples(
    st.sampled_from(sorted(BASES)),
    st.lists(st.sampled_from(sorted(DUNDERS)), min_size=1, max_size=3, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries(
            {name: st.sampled_from(sorted(DUNDERS[name])) for name in chosen}
        )
    ),
)

HOSTILE: Any = None  # the global path's name


def _uses(use: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """What ``fn`` does with the object, as eager code would: nothing, or ``len``, ``bool``,
    iteration of it (eager's exception, where it raises)."""
    return {
        "ignores it": lambda obj, x: x * 2,
        "takes its len": lambda obj, x: x * len(obj),
        "branches on it": lambda obj, x: x * 2 if obj else x,
        "iterates it": lambda obj, x: x * sum(1 for _ in obj),
    }[use]


def placed(path: str, obj: Any, use: str) -> tuple[Callable[..., Any], list[Any]]:
    """``fn`` reaching ``obj`` by ``path``, and the arguments to call it with after ``x``."""
    act = _uses(use)
    if path == "closure":
        return (lambda x: act(obj, x)), []
    if path == "global":
        globals()["HOSTILE"] = obj
        return (lambda x: act(HOSTILE, x)), []
    if path == "default":
        return (lambda x, held=obj: act(held, x)), []
    if path == "partial":
        return functools.partial(lambda held, x: act(held, x), obj), []
    if path == "module attribute":
        model = nn.Linear(4, 4)
        try:
            model.held = obj  # nn.Module's own __setattr__ asks the object what it is
        except Exception:  # noqa: BLE001 - the user's object refused it; eager keeps it so
            object.__setattr__(model, "held", obj)
        return (lambda x: act(model.held, model(x))), []
    if path == "argument":
        return (lambda x, held: act(held, x)), [obj]
    if path == "item of a list argument":
        return (lambda x, held: act(held[0], x)), [[obj, 1]]
    if path == "value of a dict argument":
        return (lambda x, held: act(held["k"], x)), [{"k": obj}]
    raise AssertionError(path)


PATHS = [
    "closure",
    "global",
    "default",
    "partial",
    "module attribute",
    "argument",
    "item of a list argument",
    "value of a dict argument",
]
USES = ["ignores it", "takes its len", "branches on it", "iterates it"]


@SETTINGS
@given(
    spec=specs,
    other=specs,
    path=st.sampled_from(PATHS),
    use=st.sampled_from(["ignores it", "ignores it", *USES]),
)
def test_hostile_objects_have_eagers_outcome(spec, other, path, use):
    fn, extra = placed(path, hostile(*spec), use)
    x = torch.randn(3, 4)
    tf = assert_routes_match(fn, [x, *extra], routes=("direct", "vmap", "grad"))
    if extra:  # another instance of another hostile class: a key compares the two
        _, more = placed(path, hostile(*other), use)
        assert_as_eager(lambda: tf(x, *more), lambda: fn(x, *more), [x, *more])


@settings(SETTINGS, max_examples=max(EXAMPLES // 6, 4))
@given(spec=specs, path=st.sampled_from(PATHS))
def test_hostile_objects_through_the_backend(spec, path):
    fn, extra = placed(path, hostile(*spec), "ignores it")
    assert_routes_match(fn, [torch.randn(3, 4), *extra], routes=("backend",))


def test_a_closure_cell_emptied_by_del_raises_eagers_name_error():
    def outer():
        scale = 2.0

        def inner(x):
            return x * scale  # noqa: F821 - the cell del empties below

        del scale
        return inner

    fn = outer()
    assert_routes_match(fn, [torch.randn(3)])
    with pytest.raises(NameError):
        fxviews.transform(fn)(torch.randn(3))


def test_a_dead_weakref_proxy_is_opaque():
    class Held:
        pass

    held = Held()
    proxy = weakref.proxy(held)
    del held
    for fn, extra in (placed(p, proxy, "ignores it") for p in PATHS):
        assert_routes_match(fn, [torch.randn(3, 4), *extra], routes=("direct", "vmap", "grad"))


def test_irreps_like_tuple_whose_len_raises():
    """e3nn's Irreps: a tuple subclass whose ``len()`` raises; fn branches on something else."""

    class Irreps(tuple):
        def __len__(self) -> int:
            raise NotImplementedError("Irreps has no length")

    irreps = Irreps((1, 2))
    assert_routes_match(lambda x: x * 2 if irreps is not None else x, [torch.randn(3)])


def test_an_argument_whose_eq_raises_is_keyed_safely():
    """Two arguments of equal hash whose ``==`` raises: the second call's key compares them
    (eager never does); each gets a graph of its own."""

    class Knob:
        def __init__(self, scale: float) -> None:
            self.scale = scale

        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise Boom("no comparison")

    tf = fxviews.transform(lambda x, knob: x * knob.scale)
    x = torch.randn(3)
    for scale in (2.0, 3.0):
        torch.testing.assert_close(tf(x, Knob(scale)), x * scale)


def test_an_argument_whose_hash_lies_is_keyed_by_identity():
    class Drifting:
        def __hash__(self) -> int:
            return random.getrandbits(60)

    tf = fxviews.transform(lambda x, held: x * 2)
    held, x = Drifting(), torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(tf(x, held), x * 2)
    assert tf.cache_info().misses == 1


def test_an_argument_that_cannot_be_flattened_runs_eagerly(caplog):
    """A named tuple whose iteration raises: pytree cannot read it; eager never iterates it."""
    import collections

    class Broken(collections.namedtuple("Pair", "a b")):
        def __iter__(self):
            raise Boom("no iteration")

    fn = lambda x, pair: x * 2  # noqa: E731 - the function under test
    pair = Broken(1, 2)
    with caplog.at_level("WARNING", logger="fxviews"):
        assert_routes_match(fn, [torch.randn(3), pair], routes=("direct",))
    assert any("cannot key" in r.getMessage() for r in caplog.records)


def test_the_walk_is_bounded():
    """A closure over plain data of any size costs a first call a bounded walk (Note [What a
    function reaches]); its state is still followed where it is the function's own."""
    data = [[i, i + 1] for i in range(200_000)]
    deep: list[Any] = []
    for i in range(5_000):
        deep = [deep, i]
    log: list[torch.Tensor] = []

    def fn(x):
        log.append(x.sum())  # a write a trace must refuse, found past the big data
        return x * 2 if data and deep else x

    tf = fxviews.transform(fn)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(tf(x), x * 2)
    assert len(log) == 2  # eager's two appends, not the trace's
