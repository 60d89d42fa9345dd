"""One function against eager, by every route a user calls it: the outcome compared whole.

An outcome is what a call returns or the type of the exception it raises. Two outcomes are the
same when both raise the same exception type, or both return results of the same shape: the
same type at every node (a ``torch.Size``, an ``nn.Parameter``, a named tuple, a dataclass),
equal non-tensor values, tensors of the same dtype, shape, ``requires_grad`` and values, and
the same objects in the same places (two leaves one object in both, or neither; a leaf the
call's argument itself in both, or neither). A suite built on :func:`assert_routes_match`
fails on anything fxviews raises that eager does not, by construction.

Example::

    >>> assert_routes_match(lambda x: (x.shape, x * 2), [torch.randn(3, 4)])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.func import grad, vmap

import fxviews

__all__ = ["ROUTES", "assert_as_eager", "assert_routes_match", "float_total", "outcome"]

#: The routes a user calls a transformed function by.
ROUTES = ("direct", "vmap", "grad", "backend")


def outcome(run: Callable[[], Any]) -> tuple[str, Any]:
    """``("returned", value)`` or ``("raised", exception type)`` of ``run()``."""
    try:
        return "returned", run()
    except Exception as err:  # noqa: BLE001 - the outcome being compared
        return "raised", type(err)


def assert_as_eager(
    run: Callable[[], Any],
    eager: Callable[[], Any],
    inputs: Sequence[Any] = (),
    **tolerances: Any,
) -> None:
    """``run()`` has the outcome ``eager()`` has (see the module's docstring); ``inputs`` are
    objects both may hand back (the call's arguments)."""
    expected = outcome(eager)
    got = outcome(run)
    if expected[0] == "raised":
        assert got[0] == "raised", f"eager raised {expected[1].__name__}, fxviews returned {got}"
        assert issubclass(got[1], expected[1]), f"eager raised {expected[1]}, fxviews {got[1]}"
        return
    if got[0] == "raised":
        raise AssertionError(f"eager returned, fxviews raised {got[1].__name__}") from None
    _assert_same_result(got[1], expected[1], inputs, tolerances)


def float_total(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``'s floating tensors summed into one float32 scalar: what ``grad`` differentiates."""

    def total(*args: Any) -> Any:
        leaves = [leaf for _, leaf in _nodes(fn(*args)) if isinstance(leaf, torch.Tensor)]
        return sum((t.float().sum() for t in leaves if t.is_floating_point()), torch.zeros(()))

    return total


def assert_routes_match(
    fn: Callable[..., Any],
    args: Sequence[Any],
    routes: Sequence[str] = ROUTES,
    batched: Sequence[Any] | None = None,
    **tolerances: Any,
) -> Any:
    """``fxviews.transform(fn)`` has eager's outcome on ``args`` by each route: called
    directly (twice: the trace's call, then the graph's), under ``vmap`` (on ``batched``, by
    default each tensor argument stacked twice), under ``grad`` (of :func:`float_total`, with
    respect to the first argument), and compiled with ``backend="fxviews"``. Returns the
    transformed function."""
    tf = fxviews.transform(fn)
    if "direct" in routes:
        for _ in range(2):
            assert_as_eager(lambda: tf(*args), lambda: fn(*args), args, **tolerances)
    if "vmap" in routes:
        batch = batched if batched is not None else [_stacked(a) for a in args]
        dims = [0 if isinstance(a, torch.Tensor) else None for a in batch]
        assert_as_eager(
            lambda: vmap(tf, in_dims=tuple(dims))(*batch),
            lambda: vmap(fn, in_dims=tuple(dims))(*batch),
            **tolerances,
        )
    if "grad" in routes and args and isinstance(args[0], torch.Tensor):
        assert_as_eager(lambda: grad(float_total(tf))(*args), lambda: grad(float_total(fn))(*args))
    if "backend" in routes:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="fxviews")
        assert_as_eager(lambda: compiled(*args), lambda: fn(*args), args, **tolerances)
    return tf


def _stacked(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_nested:
        return torch.stack([value, value * 2 if value.is_floating_point() else value])
    return value


def _nodes(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every node of a result with its path, containers before their items."""
    yield path, value
    if isinstance(value, torch.Tensor | torch.Size):
        return
    if isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _nodes(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, f"{path}[{key!r}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _nodes(getattr(value, field.name), f"{path}.{field.name}")


def _assert_same_result(
    got: Any, expected: Any, inputs: Sequence[Any], tolerances: dict[str, Any]
) -> None:
    got_nodes, expected_nodes = list(_nodes(got)), list(_nodes(expected))
    assert [p for p, _ in got_nodes] == [p for p, _ in expected_nodes], (
        f"result structure: {[p for p, _ in got_nodes]} != {[p for p, _ in expected_nodes]}"
    )
    for (path, a), (_, e) in zip(got_nodes, expected_nodes, strict=True):
        assert type(a) is type(e), f"{path or 'result'}: {type(a)} != {type(e)}"
        if isinstance(e, torch.Tensor):
            assert a.requires_grad == e.requires_grad, f"{path}: requires_grad differs"
            if e.layout == torch.strided and not e.is_nested and e.device.type != "meta":
                torch.testing.assert_close(a, e, msg=lambda m, p=path: f"{p}: {m}", **tolerances)
            else:
                assert (a.shape, a.dtype, a.layout) == (e.shape, e.dtype, e.layout), path
        elif not isinstance(e, tuple | list | dict) and not dataclasses.is_dataclass(e):
            if _comparable(e):
                assert a == e, f"{path}: {a!r} != {e!r}"
    # The same objects in the same places.
    objects = [(p, a, e) for (p, a), (_, e) in zip(got_nodes, expected_nodes, strict=True)]
    for i, (path, a, e) in enumerate(objects):
        if not _identity_matters(e):
            continue
        for other_path, a2, e2 in objects[i + 1 :]:
            if _identity_matters(e2):
                assert (a is a2) == (e is e2), f"{path} and {other_path}: aliasing differs"
        for k, given in enumerate(inputs):
            assert (a is given) == (e is given), f"{path} is argument {k}: differs"


def _comparable(value: Any) -> bool:
    return isinstance(value, int | float | complex | str | bytes | bool | torch.dtype | type(None))


def _identity_matters(value: Any) -> bool:
    """Whether which object a node is can tell two results apart (not for small values Python
    shares, nor a new-each-time ``torch.device``)."""
    return not isinstance(value, int | float | complex | str | bytes | bool | type(None)) and not (
        isinstance(value, torch.device | torch.dtype | torch.Size)
    )
