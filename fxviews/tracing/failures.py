"""Why a function could not be one graph, said in the terms of the user's code.

Note [Messages in the user's terms]
-----------------------------------
When a trace fails, PyTorch's error speaks of its own machinery: "Could not guard on
data-dependent expression Eq(u0, 1)", a SymPy symbol standing for ``x.norm() > 1.0``. The
user needs three things instead, and the failure's traceback holds the first:

1. **Where.** The innermost frame of the traceback that runs the user's code (not torch's,
   fxviews', or the standard library's plumbing:
   :func:`~fxviews.passes.source_lines.internal_frame`) is the line that asked for a value:
   ``file:line, in function`` and the line's code.
2. **What depends on values, in their words.** The instruction that frame was running tells a
   condition from a number: a conditional jump (``if``, ``while``, ``and``/``or``, ``assert``,
   a conditional expression) asked for the truth of a tensor or of a number read from one; any
   other instruction turned a value into a Python number that sets a size, an index or a slice
   bound (``int(x.sum())``, ``x[:n]``, ``torch.arange(x.max())``). Reading memory into Python
   (``tolist``, ``numpy``) and reading a closed-over tensor's value are their own kinds, told
   by the tracer (:class:`Failure`).
3. **What to write instead**, for each kind: ``torch.where``/``torch.cond`` for a condition,
   tensor indices and masks for a number, tensor ops for values read into Python.

No SymPy expression or guard text reaches the message; PyTorch's own error stays the
``__cause__`` of the :class:`~fxviews.tracing.failures.TracingError` for whoever debugs fxviews.

Example::

    >>> def f(x):
    ...     if x.norm() > 1.0:
    ...         return x * 2
    ...     return x
    >>> try:
    ...     fxviews.trace(f, torch.randn(3))
    ... except fxviews.TracingError as err:
    ...     print(err)
    fxviews.trace could not trace f (model.py:2, in f): the condition `x.norm() > 1.0` depends
    on tensor values (Python control flow), and a graph takes one branch for every value. ...
"""

from __future__ import annotations

import dis
import enum
import inspect
import linecache
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.passes.errors import FxViewsError
from fxviews.passes.source_lines import format_frame, internal_frame, short_path

__all__ = [
    "converts_a_traced_number",
    "definition_line",
    "describe",
    "EAGER_CAUSES",
    "Failure",
    "first_line",
    "function_name",
    "instruction_at",
    "TracingError",
    "user_line",
    "UserLine",
]


class Failure(enum.Enum):
    """What the tracer found depending on tensor values (the kinds the Note names)."""

    VALUE = "a value"  # fake mode could not decide a guard: a condition or a number (step 2)
    BRANCH = "a branch"  # Tensor.__bool__ itself: always a condition
    VALUE_SHAPED_OUTPUT = "an output shaped by values"  # an op whose result's size is values'
    READS_MEMORY = "reads memory"  # tolist, numpy, data_ptr
    READS_STORAGE = "reads the storage"  # untyped_storage, most often for set_
    CLOSED_OVER_VALUE = "reads a closed-over value"  # .item() of a tensor fn closes over
    VALUE_IN_FUNCTION = "a value read in a kept Function"  # .item() in a Function's forward
    WRAPPED_CLOSURE = "a closure over a transformed tensor"
    OBSERVABLE_GATHER = "a 0-d tensor index read through a view"


@dataclass(frozen=True)
class UserLine:
    """A frame of the user's code: where, and the line's code (empty if its source is not
    readable), with the opcode it was running when the failure passed through it."""

    file: str
    line: int
    function: str
    code: str
    instruction: str | None

    def __str__(self) -> str:
        return format_frame(self.file, self.line, self.function)

    @property
    def is_condition(self) -> bool:
        """Whether the line was asking for the truth of a value: a conditional jump
        (``POP_JUMP_FORWARD_IF_FALSE``, ``JUMP_IF_TRUE_OR_POP``, ...), ``not``, or the
        conversion to bool that precedes a jump since Python 3.13."""
        opname = self.instruction or ""
        return "IF_FALSE" in opname or "IF_TRUE" in opname or opname in ("TO_BOOL", "UNARY_NOT")


def user_line(err: BaseException | None) -> UserLine | None:
    """The innermost frame of the user's code that ``err`` (or the errors it was raised from)
    passed through, or None where it passed through none. An error raised by a check after
    the trace carries the line it is about as ``where``."""
    where = getattr(err, "where", None)
    if isinstance(where, UserLine):
        return where
    for mine in (_user_code, _torch_nn_code):  # a module of torch.nn's where no user code ran
        found = _innermost_frame(err, mine)
        if found is not None:
            code, line, offset = found
            text = linecache.getline(code.co_filename, line).strip()
            return UserLine(
                code.co_filename, line, code.co_name, text, instruction_at(code, offset)
            )
    return None


def _innermost_frame(
    err: BaseException | None, mine: Callable[[types.FrameType], bool]
) -> tuple[types.CodeType, int, int] | None:
    """Code, line and instruction offset of the innermost frame ``mine`` accepts in ``err``'s
    traceback, or in those of the errors it was raised from."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        found = None
        tb = err.__traceback__
        while tb is not None:
            if mine(tb.tb_frame):
                found = (tb.tb_frame.f_code, tb.tb_lineno, tb.tb_lasti)
            tb = tb.tb_next
        if found is not None:
            return found
        err = err.__cause__ or err.__context__
    return None


def _user_code(frame: types.FrameType) -> bool:
    return not internal_frame(frame) and not frame.f_code.co_filename.startswith("<")


def _torch_nn_code(frame: types.FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith("torch.nn.")


#: The types of the numbers fake mode computes from tensor values (``x.sum().item() > 0``).
_TRACED_NUMBERS = re.compile(r"\b(SymBool|SymInt|SymFloat)\b")


def converts_a_traced_number(err: Exception) -> bool:
    """Whether ``err`` is Python failing to convert a number computed from tensor values.

    Fake mode traces on static shapes, so every symbolic number stands for tensor values. Where
    Python converts one, the number's type answers (``int()``, ``bool()``, ``math.exp``) or
    fake mode cannot decide it (``GuardOnDataDependentSymNode``); where the type has no such
    method (``float()`` of a ``SymBool``, a format spec, ``hash``), Python raises a TypeError
    naming the type: the same dependence on values, in other words.
    """
    return isinstance(err, TypeError) and _TRACED_NUMBERS.search(str(err)) is not None


def definition_line(fn: object) -> str:
    """`` (file:line)`` where ``fn`` (or the function inside a partial or a module's
    ``forward``) is defined, for messages about a function as a whole; empty if unknown."""
    target = getattr(fn, "func", fn)  # functools.partial
    target = getattr(target, "forward", target)  # nn.Module
    code = getattr(inspect.unwrap(target), "__code__", None)  # type: ignore[arg-type]
    if code is None:
        return ""
    return f" ({short_path(code.co_filename)}:{code.co_firstlineno})"


def instruction_at(code: types.CodeType, offset: int) -> str | None:
    """The name of the instruction of ``code`` at ``offset`` (a traceback's ``tb_lasti``)."""
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset:
            return instruction.opname
    return None


def describe(
    failure: Failure, caller: str, name: str, err: BaseException, op: object = None
) -> str:
    """The message of a trace of ``name`` by ``caller`` that failed with ``err``: where, what
    depends on tensor values there, and what to write instead (see the Note). ``op`` is the
    op (an ``OpOverload``) of a :attr:`Failure.VALUE_SHAPED_OUTPUT`."""
    where = user_line(err)
    quoted = f"`{where.code}`" if where is not None and where.code else "it"
    head = f"{caller} could not trace {name}" + (f" ({where})" if where is not None else "")
    if failure is Failure.BRANCH or (
        failure is Failure.VALUE and where is not None and where.is_condition
    ):
        return f"{head}: {_condition(where)} {_CONDITION_ADVICE}"
    if failure is Failure.VALUE:
        return (
            f"{head}: {quoted} turns a tensor value into a Python number (`.item()`, `int()`, "
            f"`float()`, `.tolist()`) that sets a size, an index or a slice bound, and a graph "
            f"fixes those for every value. {_NUMBER_ADVICE}"
        )
    if failure is Failure.VALUE_SHAPED_OUTPUT:
        return (
            f"{head}: {quoted} calls `{_op_name(op)}`, whose result's size depends on tensor "
            f"values, and a graph cannot follow it for every value. {_NUMBER_ADVICE}"
        )
    if failure is Failure.READS_MEMORY:
        return (
            f"{head}: {quoted} reads tensor values into Python (`.tolist()`, `.numpy()`, "
            f"`data_ptr()`), and a graph cannot hold what Python computes from them for every "
            f"value. Keep the computation in tensor ops (a number used only in tensor "
            f"arithmetic may come from `.item()`)."
        )
    if failure is Failure.READS_STORAGE:
        return (
            f"{head}: {quoted} takes a tensor's storage into Python (`untyped_storage()`, "
            f"`storage()`), to hand its memory to `set_` or read it, and a graph holds tensors "
            f"and the ops on them, not a storage. Take views of the tensor instead "
            f"(`x.view(...)`, `x.as_strided(size, stride, offset)`)."
        )
    if failure is Failure.CLOSED_OVER_VALUE:
        return (
            f"{head}: {quoted} reads the value of a tensor {name} closes over or holds (`.item()`, "
            f"`int()`, a condition on it): eager PyTorch reads it again on every call, a graph "
            f"would keep this call's value. Use it as a tensor (`x * scale`, not "
            f"`x * scale.item()`), or pass it as an argument."
        )
    if failure is Failure.VALUE_IN_FUNCTION:
        return (
            f"{head}: {quoted} reads a tensor value into Python (`.item()`, `float()`, a size "
            f"from `nonzero`) in {err}, which a graph keeps as one node: no graph follows what "
            f"Python computes from the value for every value. Keep it a tensor in `forward` "
            f"(`x / x.abs().max()`, not `x / x.abs().max().item()`; save it for `backward` with "
            f"`ctx.save_for_backward`)."
        )
    if failure is Failure.OBSERVABLE_GATHER:
        return (
            f"{head}: {quoted} indexes with a 0-d integer tensor, which eager PyTorch reads as "
            f"a Python int to return a view; a graph gathers the element for every value "
            f"instead (a copy, as eager vmap does for a batched index), and here the copy "
            f"differs from the view: {err}. Write the update out of place (`x[i] = x[i] + v`, "
            f"not `x[i] += v`), or `.clone()` the result before writing to either."
        )
    return (
        f"{head}: {quoted} uses a tensor wrapped by an enclosing torch.func transform that is "
        f"not one of {name}'s arguments (captured by a closure?). Pass that tensor as an argument."
    )


_CONDITION_ADVICE = (
    "Compute both branches and pick one with `torch.where(condition, a, b)`, or use "
    "`torch.cond(condition, true_fn, false_fn, operands)`."
)
_NUMBER_ADVICE = (
    "Keep the value a tensor: index with integer tensors (`x[idx]`, `x.index_select(0, idx)`, "
    "`torch.gather`), mask with `torch.where` instead of cutting to a computed length, and give "
    "sizes as Python ints that do not come from tensor values."
)


def _condition(where: UserLine | None) -> str:
    """The condition in the user's words: the test of an ``if``/``elif``/``while`` line, else
    the line itself."""
    what = "a condition"
    if where is not None and where.code:
        code = where.code
        for keyword in ("if ", "elif ", "while "):
            if code.startswith(keyword) and code.endswith(":"):
                code = code[len(keyword) : -1].strip()
                break
        what = f"the condition `{code}`" if code != where.code else f"`{code}`"
    return (
        f"{what} depends on tensor values (Python control flow on a tensor, or on a number read "
        f"from one), and a graph takes one branch for every value."
    )


def _op_name(op: object) -> str:
    """The name users call ``op`` by: ``nonzero`` for ``aten.nonzero.default``."""
    packet = getattr(op, "overloadpacket", None)
    return str(getattr(packet, "__name__", op))


class TracingError(FxViewsError):
    """``fn`` could not be captured as one graph; ``cause`` says why.

    ``cause`` is one of ``"control flow"`` (a Python branch on a tensor value),
    ``"data-dependent shape"`` (a size or Python number computed from tensor values), ``"reads
    tensor values"`` (``.numpy()``, ``tolist``, a storage, found by ``transform``'s recording,
    or ``.item()`` of a tensor ``fn`` closes over: values leave the graph), ``"closure over a
    transformed tensor"``, ``"autograd"`` (an autograd-level construct a graph cannot keep: a
    hook, ``backward()``, ...; Note [What autograd sees is part of the trace]), ``"module
    hooks"`` (a module the function calls has forward hooks, or forward-pre ones: Note [The
    state a graph bakes in], item 6), ``"lazy conjugate"`` (``transform`` called with a tensor
    whose conjugate or negative bit is set), ``"rebinds Python state"`` (``self.avg = ...``, a
    global or a closure cell assigned, or a list or dict written while ``fn`` runs: Note [Python
    state a trace rebinds]), ``"random state"`` (random state set from Python, or a generator
    made by ``fn``: Note [Random state set from Python]), ``"lazy module"`` (parameters not
    created yet) or ``"untraceable"`` (an op neither fake nor real tracing could run).

    Example::

        >>> try:
        ...     fxviews.trace(lambda x: x if x.sum() > 0 else -x, torch.randn(3))
        ... except fxviews.TracingError as err:
        ...     err.cause
        'control flow'
    """

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


#: The causes that are the function's nature for an input signature, not a passing state:
#: ``transform`` runs such a signature eagerly (no later call could trace it; "module hooks"
#: until the hooks are removed, which the entry's guard sees).
EAGER_CAUSES = frozenset(
    {
        "control flow",
        "data-dependent shape",
        "reads tensor values",
        "closure over a transformed tensor",
        "autograd",
        "module hooks",
        "mode",
        "returns an object",
        "tensor kind",
        "lazy conjugate",
        "rebinds Python state",
        "random state",
    }
)


def function_name(fn: Callable[..., Any]) -> str:
    """A readable name for ``fn`` (functools.partial and modules included) in messages."""
    func = getattr(fn, "func", None)
    if func is not None and hasattr(fn, "args"):
        return f"partial({function_name(func)})"
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (its type's name when it has none), for one-line
    reports of an error PyTorch raised.

    Example::

        >>> first_line(RuntimeError("view size is not compatible"))
        'view size is not compatible'
    """
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
