"""The ``torch.compile`` paths rows 6 and 7 compare, and how each wraps a function."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, cast

import torch

import fxviews
from fxviews.bench.workloads import make_jvp_loss, make_push_jvp

#: Row 6's functions: how to make a fresh one, and whether the first call also runs backward.
COMPILE_FUNCTIONS: dict[str, tuple[Callable[[], Callable[..., Any]], bool]] = {
    "push_jvp (forward)": (make_push_jvp, False),
    "jvp_loss (+backward)": (make_jvp_loss, True),
}


#: The ``torch.compile`` paths of row 7: how each wraps ``vmap(push_jvp)``, and whether it runs
#: Inductor (left out of ``--quick``: a cold Inductor compile takes seconds).
COMPILED_PATHS: dict[str, tuple[dict[str, Any], bool]] = {
    "inductor": ({}, True),
    "aot_eager": ({"backend": "aot_eager"}, False),
    "fxviews (eager)": ({"backend": "fxviews"}, False),
    "fxviews (inductor)": ({"backend": "fxviews", "options": {"inner": "inductor"}}, True),
}


def own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function calling ``fn`` through a code object of its own.

    Dynamo keeps compiled entries per code object: compiled paths that all wrapped ``vmap``'s
    one wrapper would share a cache, and each call would check the other paths' guards first.
    """

    def call(*args: Any) -> Any:
        return fn(*args)

    code = call.__code__.replace(co_name=name.replace(" ", "_").strip("()"))
    return types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def compiled_vmap(name: str, options: dict[str, Any]) -> Wrap:
    """How path ``name`` wraps a function: ``torch.compile(vmap(fn), **options)``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(own_code(torch.func.vmap(fn), name), **options)

    return wrap


#: Row 7's base path, against which the compiled ones are compared.
TRANSFORM_PATH = "vmap(transform)"


def compiled_path_wrap(name: str) -> Wrap:
    """How row 7's path ``name`` wraps a function (the base, or one of COMPILED_PATHS)."""
    if name == TRANSFORM_PATH:
        transform = cast(Callable[..., Any], fxviews.transform)
        return lambda fn: torch.func.vmap(transform(fn))
    return compiled_vmap(name, COMPILED_PATHS[name][0])
