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
        leaves = [leaf for _, leaf in _nodes(fn(*args)) if _is(leaf, torch.Tensor)]
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
    directly (twice: the trace's call, then the graph's), under ``vmap`` (of its tensor
    arguments, on ``batched``, by default each stacked twice), under ``grad`` (of
    :func:`float_total`, with respect to the first argument), and compiled with
    ``backend="fxviews"``. Returns the transformed function."""
    tf = fxviews.transform(fn)
    if "direct" in routes:
        for _ in range(2):
            assert_as_eager(lambda: tf(*args), lambda: fn(*args), args, **tolerances)
    # vmap and grad take the tensors and close over the rest: torch.func wraps every argument
    # that isinstance calls a tensor, and one whose __class__ of the user's claims to be one
    # crashes the process (torch 2.13, eager grad as much as transform's).
    tensors = [i for i, a in enumerate(args) if _is(a, torch.Tensor)]
    if "vmap" in routes and tensors:
        batch = batched if batched is not None else [_stacked(args[i]) for i in tensors]
        if all(b is not None for b in batch):  # a kind torch.stack cannot batch: no vmap call
            assert_as_eager(
                lambda: vmap(_at(tf, args, tensors))(*batch),
                lambda: vmap(_at(fn, args, tensors))(*batch),
                **tolerances,
            )
    if "grad" in routes and tensors[:1] == [0]:
        assert_as_eager(
            lambda: grad(float_total(_at(tf, args, [0])))(args[0]),
            lambda: grad(float_total(_at(fn, args, [0])))(args[0]),
        )
    if "backend" in routes:
        assert_backend_as_eager(fn, args, **tolerances)
    return tf


def assert_backend_as_eager(fn: Callable[..., Any], args: Sequence[Any], **tolerances: Any) -> None:
    """``torch.compile(fn, backend="fxviews")`` has eager's outcome on ``args``, or the one
    Dynamo has with every backend (``backend="eager"``: a failure of Dynamo's own, on objects
    it cannot guard, is PyTorch's, not the backend's)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="fxviews")
    if outcome(lambda: compiled(*args))[0] == outcome(lambda: fn(*args))[0]:
        torch._dynamo.reset()
        assert_as_eager(lambda: compiled(*args), lambda: fn(*args), args, **tolerances)
        return
    torch._dynamo.reset()
    dynamo = torch.compile(fn, backend="eager")
    assert_as_eager(lambda: compiled(*args), lambda: dynamo(*args), args, **tolerances)


def _at(fn: Callable[..., Any], args: Sequence[Any], positions: Sequence[int]) -> Any:
    """``fn`` of the arguments at ``positions``, the others ``args``' own."""

    def call(*given: Any) -> Any:
        filled = list(args)
        for position, value in zip(positions, given, strict=True):
            filled[position] = value
        return fn(*filled)

    return call


def _stacked(value: Any) -> Any:
    """``value`` and another sample of it stacked (None where ``torch.stack`` refuses its
    kind); a non-tensor as it is."""
    if not _is(value, torch.Tensor):
        return value
    try:
        other = value * 2 if value.dtype in (torch.float32, torch.float64) else value
        return torch.stack([value, other.detach().requires_grad_(value.requires_grad)])
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _nodes(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every node of a result with its path, containers before their items."""
    yield path, value
    if _is(value, torch.Tensor | torch.Size):
        return
    if _is(value, tuple | list):
        for i, item in enumerate(value):
            yield from _nodes(item, f"{path}[{i}]")
    elif _is(value, dict):
        for key, item in value.items():
            yield from _nodes(item, f"{path}[{key!r}]")
    elif dataclasses.is_dataclass(type(value)):
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
        if _is(e, torch.Tensor):
            assert a.requires_grad == e.requires_grad, f"{path}: requires_grad differs"
            assert (a.dtype, a.layout, a.device) == (e.dtype, e.layout, e.device), path
            if e.is_nested:
                a, e = list(a.unbind()), list(e.unbind())
            elif e.device.type == "meta" or e.is_mkldnn:
                a, e = a.shape, e.shape
            elif e.layout != torch.strided:
                a, e = a.to_dense(), e.to_dense()
            torch.testing.assert_close(a, e, msg=lambda m, p=path: f"{p}: {m}", **tolerances)
        elif not _is(e, tuple | list | dict) and not dataclasses.is_dataclass(type(e)):
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


def _is(value: Any, kinds: Any) -> bool:
    """``isinstance`` by the real type: a result or argument may be an object of the user's
    whose ``__class__`` raises or lies."""
    return issubclass(type(value), kinds)


def _comparable(value: Any) -> bool:
    return _is(value, int | float | complex | str | bytes | bool | torch.dtype | type(None))


def _identity_matters(value: Any) -> bool:
    """Whether which object a node is can tell two results apart (not for small values Python
    shares, nor a new-each-time ``torch.device``)."""
    return not _is(value, int | float | complex | str | bytes | bool | type(None)) and not (
        _is(value, torch.device | torch.dtype | torch.Size)
    )
