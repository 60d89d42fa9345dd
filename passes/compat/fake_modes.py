"""Fake-mode reconciliation: run an op on values that real-mode make_fx gave separate modes.

Example::

    >>> vals = in_one_fake_mode([a_val, b_val])   # b_val recreated in a_val's mode
    >>> torch.ops.aten.select_scatter.default(*vals, 0, 0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch


def in_one_fake_mode(vals: Sequence[Any]) -> list[Any]:
    """Bring fake tensors into the first one's mode: real-mode make_fx gives each node its own.

    Only the first argument's layout matters to a view or scatter op's output metadata, so the
    others are recreated with the same shape, strides, dtype and device.
    """
    mode = getattr(vals[0], "fake_mode", None) if vals else None
    if mode is None:
        return list(vals)
    out = [vals[0]]
    for val in vals[1:]:
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", mode) is not mode:
            with mode:
                val = torch.empty_strided(
                    val.shape, val.stride(), dtype=val.dtype, device=val.device
                )
        out.append(val)
    return out


def no_new_guards(val: Any) -> contextlib.AbstractContextManager[Any]:
    """A context in which ops on ``val`` (a fake tensor with symbolic sizes) record no guard
    in its ShapeEnv; a no-op for other values.

    For steps that re-dispatch an op whose validity the graph already holds for every size:
    a fake kernel evaluating a size question on the hints would otherwise add a guard.
    """
    shape_env = getattr(getattr(val, "fake_mode", None), "shape_env", None)
    return contextlib.nullcontext() if shape_env is None else shape_env.suppress_guards()
