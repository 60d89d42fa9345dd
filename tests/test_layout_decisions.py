"""Layout-deciding ops through ``transform``: what eager does, on every layout, in every mode.

The ops are found in PyTorch (tests/layout_sweep.py), not listed: the CompositeImplicitAutograd
ops whose decomposition or aliasing depends on their input's strides, and the ops whose result
follows their input's layout (a ``memory_format`` argument). Each runs through one transformed
function per program, called on every layout of :data:`LAYOUTS` (contiguous, transposed,
sliced, offset, channels_last), directly and under ``vmap`` at every batch dim, so later calls
find graphs traced for other layouts in the cache. Each call is compared with eager PyTorch on
an identically laid-out copy (under ``vmap``: eager on each sample's slice of the batch, in a
loop): the values, and the caller's tensor afterwards, so every write through a result that
aliases (or does not alias) the argument is compared too. ``grad`` and ``jvp`` around the
transformed function and inside it are compared the same way.

Notes [Layout decisions at run time] and [The layout of a call] say how it is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.func import grad, jvp, vmap

import fxviews
from fxviews.passes.compat.torch_internals import is_functorch_wrapped_tensor
from fxviews.tracing.layout_decisions import DECIDING_FUNCTIONS
from tests.layout_sweep import LAYOUTS, LayoutOp, layout_deciding_ops, memory_format_ops
from tests.reference import (
    TEST_DEVICE,
    assert_vmap_matches_per_sample,
    make_samples,
    randn,
    stable_seed,
)

BATCH = 3


def _ops() -> list[LayoutOp]:
    found = {op.id: op for op, _ in layout_deciding_ops()}
    found.update((op.id, op) for op in memory_format_ops())
    return list(found.values())


OPS = _ops()


def _leaves(value: Any) -> list[torch.Tensor]:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _returned(op: LayoutOp) -> Callable[..., Any]:
    def returned(x: torch.Tensor) -> Any:
        return op(x)

    return returned


def _written(op: LayoutOp) -> Callable[..., Any]:
    """``op``'s result written in place: where it aliases ``x``, eager's write reaches ``x``."""

    def written(x: torch.Tensor) -> Any:
        result = _leaves(op(x))[0]
        result.mul_(2)
        return result * 1, x * 1

    return written


def _squared_sum(op: LayoutOp) -> Callable[..., torch.Tensor]:
    def squared_sum(x: torch.Tensor) -> torch.Tensor:
        return sum((leaf.real**2).sum() for leaf in _leaves(op(x)))  # type: ignore[return-value]

    return squared_sum


def _outcome(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as err:  # noqa: BLE001 - eager's errors are outcomes to match
        return "raises", f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"


def _differs(got: Any, want: Any) -> str | None:
    """How two results differ (structure, or the first leaf that does), or None."""
    got_leaves, got_spec = torch.utils._pytree.tree_flatten(_as_lists(got))
    want_leaves, want_spec = torch.utils._pytree.tree_flatten(_as_lists(want))
    if got_spec != want_spec:
        return f"structure {got_spec} != {want_spec}"
    for position, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        try:
            # Tolerance for reduction order: under vmap a composite may reduce in another order
            # on a batch than on a sample (rms_norm), which moves float32 sums by ~1e-5.
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        except AssertionError as err:
            return f"leaf {position}: {str(err).splitlines()[0]}"
    return None


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


def _check(label: str, got: tuple[str, Any], want: tuple[str, Any], failures: list[str]) -> None:
    """Compare two outcomes, each ("ok", (result, caller's tensor)) or ("raises", why)."""
    if got[0] != want[0]:
        failures.append(
            f"{label}: transform {got[0]} {got[1] if got[0] == 'raises' else ''}; "
            f"eager {want[0]} {want[1] if want[0] == 'raises' else ''}"
        )
        return
    difference = _differs(got[1], want[1]) if got[0] == "ok" else None
    if difference is not None:
        failures.append(f"{label}: {difference}")


def _with_argument(outcome: tuple[str, Any], argument: torch.Tensor) -> tuple[str, Any]:
    return (outcome[0], (outcome[1], argument)) if outcome[0] == "ok" else outcome


def _direct(
    tf: Callable[..., Any],
    fn: Callable[..., Any],
    value: torch.Tensor,
    make: Any,
    label: str,
    failures: list[str],
) -> None:
    """``tf`` and ``fn`` on two copies of ``value`` laid out by ``make``: results and copies."""
    mine, theirs = make(value), make(value)
    if mine is None:
        return
    got = _with_argument(_outcome(tf, mine), mine)
    want = _with_argument(_outcome(fn, theirs), theirs)
    _check(label, got, want, failures)


def _per_sample(fn: Callable[..., Any], bd: int) -> Callable[..., Any]:
    """Eager ``fn`` on each sample's slice of the batch (writes reach the batch), stacked."""

    def loop(batch: torch.Tensor) -> Any:
        results = [fn(batch.select(bd, i)) for i in range(batch.shape[bd])]
        return torch.utils._pytree.tree_map(lambda *r: torch.stack(r), *results)

    return loop


def _batched(
    tf: Callable[..., Any],
    fn: Callable[..., Any],
    samples: list[torch.Tensor],
    make: Any,
    label: str,
    failures: list[str],
) -> None:
    """``vmap(tf)`` and the per-sample loop at every batch dim, the batch laid out by ``make``.

    Where eager raises on a sample's slice only because of its layout (``view`` of a slice it
    cannot view), the transformed function computes each sample as if it were contiguous (the
    README's reading of a sample under vmap): its results are compared with eager's on
    contiguous samples.
    Where vmap itself refuses an op (a memory format other than contiguous_format: "NYI" in
    torch 2.13), the transformed function must raise eager ``vmap``'s error.
    """
    for bd in range(samples[0].dim() + 1):
        stacked = torch.stack(samples, dim=bd)
        mine, theirs = make(stacked), make(stacked)
        if mine is None:
            continue
        got = _with_argument(_outcome(vmap(tf, in_dims=bd), mine), mine)
        want = _with_argument(_outcome(_per_sample(fn, bd), theirs), theirs)
        if got[0] == "ok" and want[0] == "raises":  # no eager write to compare the batch with
            contiguous = torch.stack([s.clone() for s in samples])
            want = _with_argument(_outcome(_per_sample(fn, 0), contiguous), mine)
        if got[0] == "raises" and want[0] == "ok":
            want = _outcome(vmap(fn, in_dims=bd), make(stacked))  # vmap's own refusal, if any
        _check(f"{label} vmap bd={bd}", got, want, failures)


def _samples(op: LayoutOp) -> list[torch.Tensor]:
    return make_samples([op.shape], BATCH, seed=stable_seed(op.id), dtype=op.dtype)[0:BATCH]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.id)
def test_layout_deciding_op_matches_eager_on_every_layout(op: LayoutOp) -> None:
    samples = [s[0] for s in _samples(op)]
    failures: list[str] = []
    for program in (_returned(op), _written(op)):
        tf = fxviews.transform(program)  # one cache across layouts and batch dims
        for layout, make in LAYOUTS.items():
            label = f"{program.__name__} {layout}"
            _direct(tf, program, samples[0], make, label, failures)
            _batched(tf, program, samples, make, label, failures)
    assert not failures, f"{op.id}: {len(failures)} cases differ:\n" + "\n".join(failures)


#: The layouts and batch dims grad and jvp are swept on (every op, fewer combinations).
_DERIVATIVE_LAYOUTS = ("contiguous", "transposed", "sliced", "channels_last")


@pytest.mark.parametrize(
    "op", [op for op in OPS if op.dtype.is_floating_point], ids=lambda op: op.id
)
def test_layout_deciding_op_derivatives_match_eager(op: LayoutOp) -> None:
    """``grad`` and ``jvp`` around the transformed function, and inside it."""
    samples = [s[0] for s in _samples(op)]
    loss = _squared_sum(op)
    tf = fxviews.transform(loss)
    tangent = samples[1]

    def pushed(x: torch.Tensor) -> Any:  # a tangent of x's own layout, batched with it
        return jvp(loss, (x,), (x.cos(),))

    programs = {
        "grad around": (grad(tf), grad(loss)),
        "grad inside": (fxviews.transform(grad(loss)), grad(loss)),
        "jvp around": (lambda x: jvp(tf, (x,), (tangent,)), lambda x: jvp(loss, (x,), (tangent,))),
        "jvp inside": (fxviews.transform(pushed), pushed),
    }
    failures: list[str] = []
    for name, (mine, eager) in programs.items():
        for layout in _DERIVATIVE_LAYOUTS:
            make = LAYOUTS[layout]
            _direct(mine, eager, samples[0], make, f"{name} {layout}", failures)
            if name != "jvp around":  # its tangent is unbatched: vmap of jvp is the same sweep
                _batched(mine, eager, samples, make, f"{name} {layout}", failures)
    assert not failures, f"{op.id}: {len(failures)} cases differ:\n" + "\n".join(failures)


def test_every_observable_layout_decision_is_recorded_as_itself() -> None:
    """Each op found whose aliasing of its input depends on the layout is one the tracer keeps
    as its aten op (Note [Layout decisions at run time]); the others are not observable, and
    the sweep above checks them all the same."""
    observable = {op.name for op, _ in layout_deciding_ops() if op.observable}
    assert observable, "the search found no layout-deciding op: it is broken"
    handled = {getattr(f, "__name__", "") for f in DECIDING_FUNCTIONS}
    assert observable <= handled, observable - handled


def test_the_sweep_finds_what_the_issue_names() -> None:
    """The search is not empty or blind: reshape and friends, contiguous, the ``*_like``
    factories and ``clone``, ``to`` with a memory format are among what it finds."""
    names = {op.name for op in OPS}
    assert {"reshape", "reshape_as", "flatten", "ravel", "contiguous"} <= names
    assert {"clone", "zeros_like", "ones_like", "full_like", "to"} <= names
    assert TEST_DEVICE.type in ("cpu", "cuda")


def _bump(x: torch.Tensor) -> torch.Tensor:
    y = x.contiguous()  # eager: a copy of a transposed x, which stays as it was
    y.add_(1)
    return y * 1


def test_reshape_flatten_and_a_write_on_transposed_tensors() -> None:
    """reshape and a write through a transposed tensor, and flatten under vmap with the batch
    dim in the middle, tried as a new user would: each equals eager, the caller's tensor
    included."""
    x = randn(8, 4).t()
    torch.testing.assert_close(fxviews.transform(lambda x: x.reshape(-1))(x), x.reshape(-1))
    batch = randn(4, 3, 8)
    flat = vmap(fxviews.transform(lambda x: x.flatten()), in_dims=1)(batch)
    torch.testing.assert_close(flat, vmap(lambda x: x.flatten(), in_dims=1)(batch))
    values = randn(6, 4)
    mine, theirs = values.clone().t(), values.clone().t()
    torch.testing.assert_close(fxviews.transform(_bump)(mine), _bump(theirs))
    torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_explain_says_what_the_traced_layout_decided(layout: str) -> None:
    x = LAYOUTS[layout](randn(4, 6))
    records = [r for r in fxviews.explain(_bump, x).view_records if r.method == "runtime"]
    [record] = records
    assert record.after == "contiguous(x_1)"
    traced = {"contiguous": ("x_1", "its input itself"), "transposed": ("clone", "a copy")}
    before, kind = traced[layout]
    assert record.before.startswith(before) and kind in record.reason
    assert "test_layout_decisions.py" in (record.source or "")


def test_a_traced_graph_decides_again_on_the_layout_it_is_given() -> None:
    gm = fxviews.trace(_bump, randn(2, 3, 4, 6))  # traced where contiguous() is a no-op
    for layout, make in LAYOUTS.items():
        values = randn(2, 3, 4, 6)
        mine, theirs = make(values), make(values)
        torch.testing.assert_close(gm(mine), _bump(theirs), msg=layout)
        torch.testing.assert_close(mine, theirs, msg=f"{layout}: the argument")


def test_a_decision_inside_the_functions_own_grad_is_viewed_further() -> None:
    """A ``reshape`` inside the function's own ``torch.func.grad``, whose result is viewed
    again (a view the reshape step rewrites): the decision's node holds a plain fake value,
    not one wrapped by that ``grad``'s level (which has no storage to read), and the graph
    gives eager's gradients under ``vmap``."""

    def loss(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1).view(3, 4).pow(2).sum(0).prod()

    per_sample_grad = grad(loss)
    samples = make_samples([(4, 3)], BATCH, seed=stable_seed("reshape inside grad"))
    assert_vmap_matches_per_sample(fxviews.transform(per_sample_grad), per_sample_grad, samples)


def _heads_into_chunks(x: torch.Tensor) -> torch.Tensor:
    """Longformer's chunking: heads first (a transpose), merged with the batch by a reshape
    that copies, the sequence split into chunks by a view of that copy."""
    return x.transpose(1, 2).reshape(2, 16, 4).view(2, 4, 4, 4).sin()


@pytest.mark.parametrize("transform", ["grad", "jvp"])
def test_a_copying_decision_inside_the_functions_own_transform_holds_a_plain_value(
    transform: str,
) -> None:
    """A ``reshape`` that copies, inside the function's own ``grad`` or ``jvp``: make_fx binds
    its result to the node with a snapshot (a ``detach``), which the transform's level would
    wrap (no storage to read: the reshape step's fake value of the view after it raised)."""
    if transform == "grad":
        fn = grad(lambda x: _heads_into_chunks(x).pow(2).sum())
        shapes = [(1, 16, 2, 4)]
    else:
        fn = lambda x, t: jvp(_heads_into_chunks, (x,), (t,))  # noqa: E731
        shapes = [(1, 16, 2, 4)] * 2
    samples = make_samples(shapes, BATCH, seed=stable_seed(f"copying reshape in {transform}"))
    gm = fxviews.trace(fn, *samples[0])
    wrapped = [n.name for n in gm.graph.nodes if _is_functorch_wrapper(n.meta.get("val"))]
    assert not wrapped, f"nodes whose value is a torch.func level's wrapper: {wrapped}"
    assert_vmap_matches_per_sample(fxviews.transform(fn), fn, samples)


def _is_functorch_wrapper(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and is_functorch_wrapped_tensor(value)
