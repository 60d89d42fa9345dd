"""The README's push_jvp example, shared by the demo, the benchmarks and the tests.

``push_jvp`` pushes a tangent through a function that overwrites a base after taking a view of
it: forward AD then hands the view its tangent through ``as_strided``. The functions are left
unannotated on purpose: the demo prints their source, and make_fx copies annotations into the
graph code it prints.

Example::

    >>> gm = fxviews.trace(push_jvp, *seed_args())
    >>> [n for n in gm.graph.nodes if "as_strided" in n.name]
    [as_strided]
"""

from __future__ import annotations

import functools

import torch

__all__ = ["f", "push_jvp", "seed_args"]


def f(x, y):
    x = x.clone()
    view = x[0]
    x.copy_(y)  # y carries a tangent, x did not: forward AD gives x one ...
    return view, x  # ... and propagates it to `view` with as_strided


def push_jvp(x, y, yt):
    return torch.func.jvp(functools.partial(f, x), (y,), (yt,))


def seed_args(
    shape: tuple[int, int] = (2, 6), generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x, y, yt`` for :func:`push_jvp`: the example's shapes by default."""
    x, y, yt = (torch.randn(shape, generator=generator) for _ in range(3))
    return x, y, yt
