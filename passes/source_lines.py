"""The user's source line of a node: recorded while tracing, named in messages.

FX keeps a node's Python stack in ``node.meta["stack_trace"]`` (Dynamo and export fill it;
``make_fx(record_stack_traces=True)`` too), in ``traceback.format_list`` form, outermost frame
first. A message about a node names the last frame of it: the innermost line of the user's code
that made the node, not the graph node's generated name.

Tracers that record no stack (fxviews' recording) call :func:`note_user_frames` on the nodes
messages may be about (the layout-bound ones: the as_strided family and friends), so the cost
of walking the stack is paid for those few nodes only (its ``File ..., line ..., in ...``
lines, without the source text). Frames of torch, functorch, fxviews and
the standard library's plumbing are left out: what remains is the user's code.

Example::

    >>> source_line(node)
    'model.py:12, in forward'
    >>> describe_node(node)
    "'as_strided' (model.py:12, in forward)"
"""

from __future__ import annotations

import inspect
import os
import re
from types import FrameType

import torch.fx

from .compat.torch_internals import reshape_alias
from .op_tables import AS_STRIDED_OPS, LAYOUT_DECIDING_OPS

#: Top-level modules whose frames are the machinery between the user's code and an op.
_INTERNAL_MODULES = frozenset({"torch", "functorch", "fxviews", "contextlib", "functools", "runpy"})
#: The nodes whose stack a tracer without stacks records: those messages are about.
NOTED_OPS = frozenset({*AS_STRIDED_OPS, reshape_alias, *LAYOUT_DECIDING_OPS})
#: How many of the user's innermost frames a recorded stack keeps.
MAX_FRAMES = 8
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>[^\n]+)')


def note_user_frames(node: torch.fx.Node) -> None:
    """Record the user's frames calling into the tracer as ``node``'s stack, if its target is
    one of :data:`NOTED_OPS` and it has none yet."""
    if node.target not in NOTED_OPS or "stack_trace" in node.meta:
        return
    frames = user_frames(inspect.currentframe())
    if frames:
        node.meta["stack_trace"] = "".join(
            f'  File "{file}", line {line}, in {name}\n' for file, line, name in frames
        )


def user_frames(frame: FrameType | None) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` of the user's frames among ``frame`` and its callers,
    outermost first (at most :data:`MAX_FRAMES`, the innermost ones).

    Written without the source text of each line (``traceback.format_list`` would read it),
    which keeps a recorded stack cheap; :func:`source_line` needs only the position.
    """
    mine: list[tuple[str, int, str]] = []
    while frame is not None and len(mine) < MAX_FRAMES:
        code = frame.f_code
        generated = code.co_filename.startswith("<eval_with_key>")  # FX's forward
        if not internal_frame(frame) and not generated:
            mine.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return mine[::-1]


def internal_module(name: str) -> bool:
    """Whether the module ``name`` is machinery between the user's code and an op (PyTorch,
    fxviews, the standard library's call plumbing), not the user's code.

    Example::

        >>> internal_module("torch.nn.functional"), internal_module("my_model")
        (True, False)
    """
    return name.split(".")[0] in _INTERNAL_MODULES


def internal_frame(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of an :func:`internal_module`."""
    # A package run as a program (python -m fxviews) is __main__ by name, its own by spec.
    spec = frame.f_globals.get("__spec__")
    name = spec.name if spec is not None else frame.f_globals.get("__name__", "")
    return internal_module(str(name))


def source_line(node: torch.fx.Node) -> str | None:
    """``file:line, in function`` of the innermost frame of ``node``'s recorded stack."""
    stack = node.meta.get("stack_trace")
    frames = _FRAME.findall(stack) if isinstance(stack, str) else []
    if not frames:
        return None
    file, line, name = frames[-1]
    return format_frame(file, line, name.strip())


def calling_user_line() -> str | None:
    """``file:line, in function`` of the innermost user frame on the stack now, or None.

    Example::

        >>> def model_step():
        ...     return calling_user_line()
        >>> model_step()  # doctest: +SKIP
        'train.py:2, in model_step'
    """
    frames = user_frames(inspect.currentframe())
    return format_frame(*frames[-1]) if frames else None


def format_frame(file: str, line: int | str, name: str) -> str:
    """``file:line, in name``, the file relative to the working directory when below it."""
    return f"{short_path(file)}:{line}, in {name}"


def describe_node(node: torch.fx.Node) -> str:
    """The node's name, with its source line where one was recorded."""
    line = source_line(node)
    return f"{node.name!r}" if line is None else f"{node.name!r} ({line})"


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


__all__ = [
    "MAX_FRAMES",
    "NOTED_OPS",
    "calling_user_line",
    "describe_node",
    "format_frame",
    "internal_frame",
    "internal_module",
    "note_user_frames",
    "short_path",
    "source_line",
    "user_frames",
]
