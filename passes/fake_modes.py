"""Fake-mode reconciliation: run an op on values that real-mode make_fx gave separate modes.

Example::

    >>> vals = in_one_fake_mode([a_val, b_val])   # b_val recreated in a_val's mode
    >>> torch.ops.aten.select_scatter.default(*vals, 0, 0)
"""

from __future__ import annotations

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
