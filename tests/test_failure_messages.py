"""Messages of a function that cannot be one graph, in the terms of the user's code.

Each kind of value dependence (a branch on a tensor, a branch on ``.item()``, a size or slice
bound from a value, values read into Python, a closed-over tensor's value, a 0-d index read
through a view) gives a message that names the function, the user's own line (``file:line, in
function`` and its code) and what to write instead, and holds none of PyTorch's internals: no
SymPy symbol (``u0``, ``zuf0``), no guard text, no aten op. The same text reaches
``fxviews.trace``'s error, ``transform(strict=True)``'s error and ``transform``'s warning.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fxviews
from fxviews.passes.source_lines import short_path

#: What no message may hold: SymPy symbols and relations, guard and dispatcher vocabulary.
INTERNALS = re.compile(
    r"\bu\d+\b|\bzuf\d+\b|\bEq\(|unhinted|Size-like|guard|data-dependent expression|aten\.|"
    r"_local_scalar_dense|Sym|unbacked|Pending|FakeTensor|GuardOnDataDependent"
)

SCALE = torch.tensor(3.0)  # a tensor the functions below close over


def branch_on_norm(x):
    if x.norm() > 1.0:
        return x * 2
    return x


def branch_on_item(x):
    return x * 2 if x.sum().item() > 0 else -x


def size_from_value(x):
    return x[: int(x.abs().sum())]


def slice_bound_from_argmax(x):
    start = x.argmax()
    return x[start : start + 2]


def values_to_numpy(x):
    return x * torch.from_numpy(x.numpy().cumsum(0))


def restrides_through_storage(x):
    return x.set_(x.untyped_storage(), x.storage_offset(), (2,), (2,))


def reads_closed_over_value(x):
    return x * int(SCALE.item())


def bump_through_tensor_index(x, a):
    x = x.clone()
    x[a] += 1
    return x


#: (function, the text of its line the message names, what that message advises, its cause)
CASES = [
    (branch_on_norm, "if x.norm() > 1.0:", "torch.where", "control flow"),
    (branch_on_item, "return x * 2 if x.sum().item() > 0 else -x", "torch.cond", "control flow"),
    (size_from_value, "return x[: int(x.abs().sum())]", "index with integer tensors",
     "data-dependent shape"),
    (slice_bound_from_argmax, "return x[start : start + 2]", "x.index_select(0, idx)",
     "data-dependent shape"),
    (values_to_numpy, "return x * torch.from_numpy(x.numpy().cumsum(0))",
     "Keep the computation in tensor ops", "reads tensor values"),
    (restrides_through_storage,
     "return x.set_(x.untyped_storage(), x.storage_offset(), (2,), (2,))",
     "Take views of the tensor instead", "reads tensor values"),
    (reads_closed_over_value, "return x * int(SCALE.item())", "pass it as an argument",
     "reads tensor values"),
    (bump_through_tensor_index, "x[a] += 1", "`x[i] = x[i] + v`", "data-dependent shape"),
]  # fmt: skip


def _arguments(fn: Callable[..., Any]) -> tuple[torch.Tensor, ...]:
    x = torch.tensor([0.5, 2.0, 1.5, 3.0])
    return (x, torch.tensor(1)) if fn is bump_through_tensor_index else (x,)


def _where(fn: Callable[..., Any], code: str) -> str:
    """``file:line, in fn`` of the line of ``fn`` whose code is ``code``."""
    lines, first = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if line.strip() == code)
    return f"{short_path(inspect.getsourcefile(fn) or '')}:{first + offset}, in {fn.__name__}"


def _assert_in_user_terms(
    message: str, fn: Callable[..., Any], code: str, advice: str, name: str = ""
) -> None:
    assert f"could not trace {name or fn.__name__} ({_where(fn, code)})" in message, message
    assert f"`{code.removeprefix('if ').removesuffix(':')}`" in message, message
    assert advice in message, message
    assert not INTERNALS.search(message), INTERNALS.search(message)


@pytest.mark.parametrize("fn, code, advice, cause", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_trace_and_strict_transform_say_where_what_and_what_instead(fn, code, advice, cause):
    args = _arguments(fn)
    # trace gives the graph of this call, closed-over values included; it records no sample,
    # which is what tells memory read into Python (its error is PyTorch's, on its line).
    if fn not in (reads_closed_over_value, values_to_numpy, restrides_through_storage):
        with pytest.raises(fxviews.TracingError) as traced:
            fxviews.trace(fn, *args)
        _assert_in_user_terms(str(traced.value), fn, code, advice)
    with pytest.raises(fxviews.TracingError) as strict:
        fxviews.transform(fn, strict=True)(*args)
    _assert_in_user_terms(str(strict.value), fn, code, advice)
    assert strict.value.cause == cause


@pytest.mark.parametrize("fn, code, advice, cause", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_transform_warns_in_user_terms_and_runs_eagerly(fn, code, advice, cause, caplog):
    tf = fxviews.transform(fn)
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        torch.testing.assert_close(tf(*_arguments(fn)), fn(*_arguments(fn)))
    assert tf.cache_info().eager == 1
    [warning] = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    _assert_in_user_terms(warning, fn, code, advice)
    assert f"fxviews.transform runs {fn.__name__} eagerly" in warning


def test_a_branch_inside_a_module_names_the_line_in_forward():
    class Gate(torch.nn.Module):
        def forward(self, x):
            if (x > 0).all():
                return x
            return -x

    with pytest.raises(fxviews.TracingError) as err:
        fxviews.trace(Gate(), torch.ones(3))
    _assert_in_user_terms(str(err.value), Gate.forward, "if (x > 0).all():", "torch.where", "Gate")


def test_a_closure_over_a_transformed_tensor_names_where_the_function_is_defined():
    defined = {}

    def outer(y):
        def inner(x):
            return x * y

        defined["line"] = inner.__code__.co_firstlineno
        return fxviews.transform(inner, strict=True)(torch.ones(3))

    with pytest.raises(fxviews.TracingError) as err:
        torch.func.grad(lambda y: outer(y).sum())(torch.ones(3))
    assert f"inner ({short_path(__file__)}:{defined['line']})" in str(err.value)
    assert "Pass that tensor as an argument" in str(err.value)


class Normalize(torch.autograd.Function):
    """Divides by the largest magnitude, read into Python in ``forward``."""

    @staticmethod
    def forward(ctx, x):
        scale = x.abs().max().item()
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.scale


def float_of_a_drawn_condition(ran: list[None]) -> Callable[[torch.Tensor], torch.Tensor]:
    def scaled_by_a_draw(x):
        ran.append(None)  # counts runs without rebinding Python state
        return x * float(torch.rand(()).item() > 0.5)

    return scaled_by_a_draw


def item_in_a_function_forward(ran: list[None]) -> Callable[[torch.Tensor], torch.Tensor]:
    def normalized(x):
        ran.append(None)
        return (Normalize.apply(x) * x).sum()

    return normalized


#: (a function counting its runs in ``ran``, the function holding the line the message names,
#: that line, what the message advises, its cause)
EAGER_FOR_GOOD = [
    (float_of_a_drawn_condition, None, "return x * float(torch.rand(()).item() > 0.5)",
     "index with integer tensors", "data-dependent shape"),
    (item_in_a_function_forward, Normalize.forward, "scale = x.abs().max().item()",
     "ctx.save_for_backward", "reads tensor values"),
]  # fmt: skip


def _value_and_grad(fn: Callable[..., Any], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = fn(x)
    return out, *torch.autograd.grad(out.sum(), x)


@pytest.mark.parametrize(
    "counted, holder, code, advice, cause", EAGER_FOR_GOOD, ids=lambda v: getattr(v, "__name__", "")
)
def test_a_number_read_from_values_runs_eagerly_for_good_after_one_warning(
    counted, holder, code, advice, cause, caplog
):
    # A Python number computed from values (float() of a comparison, .item() in a kept
    # Function's forward) is the function's nature: no later call traces again, and re-running
    # fn each call would repeat its Python side effects.
    ran: list[None] = []
    fn = counted(ran)
    with pytest.raises(fxviews.TracingError) as strict:
        fxviews.transform(fn, strict=True)(torch.ones(4, requires_grad=True))
    assert strict.value.cause == cause
    tf = fxviews.transform(fn)
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        for call in range(3):
            x = torch.tensor([0.5, -2.0, 1.5, 3.0], requires_grad=True)
            torch.manual_seed(call)
            expected = _value_and_grad(fn, x)
            torch.manual_seed(call)
            runs = len(ran)
            torch.testing.assert_close(_value_and_grad(tf, x), expected)
            if call:
                assert len(ran) == runs + 1  # once, as eager
    info = tf.cache_info()
    assert (info.misses, info.eager) == (1, 1)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    _assert_in_user_terms(warning, holder or fn, code, advice, name=fn.__qualname__)
