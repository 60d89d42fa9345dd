"""TODO"""

from fxviews.passes.compat.torch_internals import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
)
from fxviews.passes.errors import FxViewsError
from fxviews.passes.random_state import RandomStateFromPython
from fxviews.passes.source_lines import internal_frame
from fxviews.tracing.autograd import (
    HooksNotKept,
    ModeNotKept,
    NestedNotKept,
    NotKept,
    ValueReadInFunction,
)
from fxviews.tracing.failures import (
    Failure,
    TracingError,
    converts_a_traced_number,
    describe,
    instruction_at,
    user_line,
)
from fxviews.tracing.tensor_indices import ObservableGather
from fxviews.tracing.trace_guard import ConstantRead

__all__ = [
    "autograd_not_kept",
    "raise_if_untraceable_by_nature",
    "raised_by_user_code",
    "random_state_from_python",
    "TensorBranch",
]


def raised_by_user_code(err: BaseException | None) -> bool:
    """Whether ``err`` was raised by a ``raise`` or ``assert`` statement of the user's code (a
    frame of no :func:`~fxviews.passes.source_lines.internal_module`), not by an op or tracer
    below it.

    The innermost frame of the traceback says where: an exception raised in C++ (an op's
    kernel) also ends in the user's frame that called it, but at a call instruction.

    Example::

        >>> def f(x):
        ...     raise ValueError("not ready")
        >>> try:
        ...     f(1)
        ... except ValueError as err:
        ...     raised_by_user_code(err)
        True
    """
    tb = err.__traceback__ if err is not None else None
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    if internal_frame(tb.tb_frame):
        return False
    return instruction_at(tb.tb_frame.f_code, tb.tb_lasti) in ("RAISE_VARARGS", "RERAISE")


_DATA_DEPENDENT = (
    GuardOnDataDependentSymNode,
    DataDependentOutputException,
    DynamicOutputShapeException,
)


class TensorBranch(RuntimeError):
    """Python control flow asked for the truth value of a tensor while tracing."""


def raise_if_untraceable_by_nature(err: Exception, caller: str, name: str) -> None:
    """Raise a :class:`TracingError` for failures no tracing mode can get around, said in the
    terms of the user's code (Note [Messages in the user's terms])."""
    if isinstance(err, NotKept):
        raise autograd_not_kept(err, caller, name) from err
    if isinstance(err, RandomStateFromPython):
        raise random_state_from_python(err, caller, name) from err
    if isinstance(err, FxViewsError) or raised_by_user_code(err):
        raise err
    found = _failure_of(err)
    if found is not None:
        failure, cause = found
        op = getattr(err, "func", None)
        raise TracingError(describe(failure, caller, name, err, op=op), cause) from err


def _failure_of(err: Exception) -> tuple[Failure, str] | None:
    """What depends on tensor values in ``err`` (and the :class:`TracingError` cause), or None
    for a failure of another kind."""
    if isinstance(err, TensorBranch):
        return Failure.BRANCH, "control flow"
    if isinstance(err, DynamicOutputShapeException):
        return Failure.VALUE_SHAPED_OUTPUT, "data-dependent shape"
    if isinstance(err, _DATA_DEPENDENT) or converts_a_traced_number(err):
        return _unless_a_condition(err, Failure.VALUE, "data-dependent shape")
    if isinstance(err, ConstantRead):
        return Failure.CLOSED_OVER_VALUE, "reads tensor values"
    if isinstance(err, ValueReadInFunction):
        return _unless_a_condition(err, Failure.VALUE_IN_FUNCTION, "reads tensor values")
    if isinstance(err, ObservableGather):
        return Failure.OBSERVABLE_GATHER, "data-dependent shape"
    if isinstance(err, RuntimeError) and "escaped from inside a function being" in str(err):
        return Failure.WRAPPED_CLOSURE, "closure over a transformed tensor"
    return None


def _unless_a_condition(err: Exception, failure: Failure, cause: str) -> tuple[Failure, str]:
    """``failure`` and ``cause`` of a value read in ``err``, or Python control flow where the
    user's line asked for the value's truth (``if x.sum() > 0:``), whose advice differs."""
    where = user_line(err)
    if where is not None and where.is_condition:
        return Failure.VALUE, "control flow"
    return failure, cause


def autograd_not_kept(err: NotKept, caller: str, name: str) -> TracingError:
    if isinstance(err, HooksNotKept):
        return TracingError(
            f"{caller} does not trace {name}: it runs {err}. It runs eagerly while the module "
            f"has them, and is traced again once they are removed.",
            "module hooks",
        )
    if isinstance(err, NestedNotKept):
        return TracingError(f"{caller} does not trace {name}: it runs {err}.", "tensor kind")
    if isinstance(err, ModeNotKept):
        return TracingError(
            f"{caller} does not trace {name}: it runs an op with {err}.",
            "mode",
        )
    return TracingError(
        f"{caller} could not trace {name}: it uses {err}. A graph of its aten ops would give "
        f"other gradients than autograd does (Note [What autograd sees is part of the trace]).",
        "autograd",
    )


def random_state_from_python(err: RandomStateFromPython, caller: str, name: str) -> TracingError:
    return TracingError(f"{caller} could not trace {name}: {err}.", "random state")
