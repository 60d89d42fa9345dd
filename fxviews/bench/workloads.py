"""The functions the bench measures, their inputs, and how each path is built from them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

import fxviews
from fxviews.examples import f, push_jvp, seed_args


def make_push_jvp() -> Callable[..., Any]:
    """A new function object computing ``push_jvp``: no cache anywhere has seen it yet."""

    def fresh_push_jvp(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
        return torch.func.jvp(functools.partial(f, x), (y,), (yt,))

    return fresh_push_jvp


def make_jvp_loss() -> Callable[..., Any]:
    """A new training function through forward AD: as_strided in forward and backward graphs."""

    def fresh_jvp_loss(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> torch.Tensor:
        (view, base), (view_t, base_t) = push_jvp(x, y, yt)
        return (view * view_t).sum() + (base * base_t).sum()

    return fresh_jvp_loss


def many_views(blocks: int) -> Callable[..., Any]:
    """A ``push_jvp``-like function with ``blocks`` mutated bases, each with several live views.

    Each block views a 4x4 base four ways (select, stepped slice, transpose, diagonal), then
    overwrites the base in place with the dual input, so forward AD emits one ``as_strided``
    per view: a graph whose size grows linearly with ``blocks`` and which exercises both
    provenance and synthesis. Each block's views are consumed by one sum, as code consumes
    views, rather than all returned: see BENCHMARKS.md for why that matters to the pass time.
    """

    def body(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        for i in range(blocks):
            base = x[i].clone()
            views = [base[0], base[:, ::2], base.t(), base.diagonal()]
            base.copy_(y[i])
            outs.append(cast(torch.Tensor, sum(v.sum() for v in views)))  # never the start, 0
        return outs

    def generated(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
        return torch.func.jvp(functools.partial(body, x), (y,), (yt,))

    return generated


def dense_views(count: int) -> Callable[..., Any]:
    """``count`` views of one 8x8 base, then the base overwritten: forward AD's as_strided-dense
    graph (one as_strided per view, all of them reading the same buffer).

    The views cycle through rows, columns, stepped row slices, rows of the transpose and
    diagonals, each consumed by a sum.
    """
    kinds: tuple[Callable[[torch.Tensor, int], torch.Tensor], ...] = (
        lambda base, i: base[i % 8],
        lambda base, i: base[:, i % 8],
        lambda base, i: base[i % 7 :: 2],
        lambda base, i: base.t()[i % 8],
        lambda base, i: base.diagonal(i % 5),
    )

    def body(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        base = x.clone()
        views = [kinds[i % len(kinds)](base, i) for i in range(count)]
        base.copy_(y)
        return [view.sum() for view in views]

    def generated(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
        return torch.func.jvp(functools.partial(body, x), (y,), (yt,))

    return generated


def seed_batch(
    batch: int, device: str | None = None
) -> tuple[list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """``batch`` samples of ``push_jvp``'s arguments, and the same stacked along dim 0, on
    ``device`` (default CPU)."""
    samples: list[tuple[torch.Tensor, ...]] = [on(device, seed_args()) for _ in range(batch)]
    return samples, tuple(torch.stack(column) for column in zip(*samples, strict=True))


def on(device: str | None, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``tensors`` on ``device`` (None: left where they are)."""
    return tensors if device is None else tuple(t.to(device) for t in tensors)


def rewritten(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` rewritten (dead nodes included): what ``transform`` runs."""
    return fxviews.rewrite(gm).graph_module


def transform_or_reason() -> tuple[Callable[..., Any] | None, str]:
    """``fxviews.transform`` if this install has it, else why not (for ``n/a`` cells)."""
    transform = getattr(fxviews, "transform", None)
    return (transform, "") if transform is not None else (None, "n/a (fxviews.transform missing)")


def returns_inputs(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
    return (x, y), (yt, x)


def per_sample(fn: Callable[..., Any], samples: Sequence[tuple[torch.Tensor, ...]]) -> list[Any]:
    """``fn`` run on each sample in a Python loop: what vmap replaces."""
    return [fn(*sample) for sample in samples]


def flat_push_jvp(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> list[torch.Tensor]:
    """``push_jvp``'s four tensors as one flat list: its graph, with the output the transform's
    cached graph returns."""
    (view, base), (view_tangent, base_tangent) = push_jvp(x, y, yt)
    return [view, base, view_tangent, base_tangent]
