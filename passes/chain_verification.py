"""Verification: a chain is used only once it provably reproduces the target geometry.

Example::

    >>> verify_chain((ViewStep(aten.select.int, (0, 0)),), Geometry((2, 6), (6, 1), 0),
    ...              Geometry((6,), (1,), 0))
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .chain import ViewStep, apply_chain
from .geometry import Geometry, equivalent
from .op_tables import LAYOUT_VIEWS
from .torch_internals import storage_identity


def verify_chain(chain: Sequence[ViewStep], source: Geometry, target: Geometry) -> bool:
    """Whether ``chain`` turns a tensor of geometry ``source`` into one equivalent to ``target``.

    Runs the chain on a meta tensor with the source's exact sizes, strides and offset. Every
    step must be one of :data:`LAYOUT_VIEWS` and the result must share the source's storage: a
    copy with the right geometry would read the right values but miss later writes through the
    view.
    """
    if not all(step.op in LAYOUT_VIEWS for step in chain):
        return False
    start = source.meta_tensor()
    try:
        out = apply_chain(chain, start)
    except (RuntimeError, IndexError):  # what a view op raises on a tensor it does not fit
        return False
    return (
        isinstance(out, torch.Tensor)
        and storage_identity(out) == storage_identity(start)
        and equivalent(Geometry.of(out), target)
    )
