"""The differential harness: a graph under ``vmap`` against eager PyTorch, layout by layout.

Every differential test asks one question of a graph: under ``torch.func.vmap``, with each
input's batch dim physically where ``in_dims`` says, does it give what eager PyTorch gives one
sample at a time? The helpers of :mod:`tests.reference` build those inputs and that reference;
this module asks the question once for every test:

* :func:`check_vmap` compares one layout and raises ``AssertionError`` on a wrong number.
* :func:`failures` runs labelled checks and reports every failing one as a wrong result or as
  the error PyTorch raised, so one test shows all its failing layouts at once.
* :func:`vmap_failures` and :func:`assert_every_layout_matches` do that over a layout sweep.
* :func:`prepare` traces a function on its first sample and rewrites it, once per case
  (:class:`Prepared`); :func:`assert_raw_graph_is_wrong` is the self-check that the comparison
  fails on the un-rewritten graph.
* :func:`push_in_y` and :func:`pull_in_y` put ``f(x, y)`` under ``jvp`` or ``grad`` in ``y``;
  :func:`with_transform` picks one by name.

Example::

    >>> samples = make_samples([(3, 4)], batch=3, seed=0)
    >>> assert_every_layout_matches(torch.sin, torch.sin, samples, label="sin")
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.func import grad, jvp, vmap

import fxviews
from tests.device_checks import raise_if_test_device_failed
from tests.reference import (
    InDims,
    Sample,
    as_strided_nodes,
    assert_tree_close,
    in_dims_id,
    in_dims_sweep,
    per_sample_reference,
    stack_batched,
)

#: How :func:`failures` marks a check that returned wrong numbers (not an error).
WRONG_RESULT = "WRONG RESULT"


def check_vmap(
    graph: Callable[..., Any],
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    in_dims: InDims,
    *,
    label: str = "",
) -> None:
    """``vmap(graph, in_dims)`` on physically batched ``samples`` equals eager ``fn`` per sample.

    Example::

        >>> check_vmap(torch.cos, torch.cos, make_samples([(2, 3)], 3, seed=1), (1,))
    """
    expected = per_sample_reference(fn, samples, in_dims)
    actual = vmap(graph, in_dims=in_dims)(*stack_batched(samples, in_dims))
    assert_tree_close(actual, expected, msg=f"{label} vmap {in_dims_id(in_dims)}")


def failures(checks: Mapping[str, Callable[[], None]]) -> list[str]:
    """Run every check; one line per failing one, ``"label: WRONG RESULT: ..."`` or the error.

    A ``RuntimeError`` (PyTorch refusing a layout) is a failure too, reported by its first
    line; any other exception propagates, since it is a bug in the test rather than a result.

    Example::

        >>> failures({"ok": lambda: None, "bad": lambda: torch.ones(2).view(3)})
        ["bad: RuntimeError: shape '[3]' is invalid for input of size 2"]
    """
    found = []
    for label, check in checks.items():
        try:
            check()
        except AssertionError as err:
            detail = " | ".join(line.strip() for line in str(err).splitlines()[:4] if line.strip())
            found.append(f"{label}: {WRONG_RESULT}: {detail}")
        except RuntimeError as err:
            raise_if_test_device_failed(err, label)
            found.append(f"{label}: {type(err).__name__}: {str(err).splitlines()[0]}")
    return found


def vmap_failures(
    graph: Callable[..., Any],
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    layouts: Sequence[InDims],
    *,
    label: str = "",
) -> list[str]:
    """:func:`failures` of :func:`check_vmap` at each of ``layouts``, labelled ``bd=...``."""
    return failures(
        {
            in_dims_id(in_dims): functools.partial(
                check_vmap, graph, fn, samples, in_dims, label=label
            )
            for in_dims in layouts
        }
    )


def assert_every_layout_matches(
    graph: Callable[..., Any],
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    *,
    layouts: Sequence[InDims] | None = None,
    label: str = "",
) -> None:
    """Strict: no wrong number and no error at any layout; the message lists every failure.

    ``layouts`` defaults to :func:`tests.reference.in_dims_sweep` over the sample's arguments
    (every batch position of every argument, none unbatched).

    Example::

        >>> samples = make_samples([(3, 4), (4,)], batch=3, seed=0)
        >>> assert_every_layout_matches(torch.mv, torch.mv, samples, label="mv")
    """
    if layouts is None:
        layouts = in_dims_sweep([arg.dim() for arg in samples[0]])
    found = vmap_failures(graph, fn, samples, layouts, label=label)
    assert not found, "\n".join([f"{label}: {len(found)}/{len(layouts)} layouts fail:", *found])


@dataclass
class Prepared:
    """A function traced on its first sample (unbatched, contiguous) and rewritten.

    Where eager PyTorch refuses that sample, nothing is traced and ``eager_error`` says why.
    """

    label: str
    fn: Callable[..., Any]
    samples: list[Sample]
    gm: torch.fx.GraphModule | None = None
    code_before_rewrite: str = ""
    result: fxviews.RewriteResult | None = None
    eager_error: str | None = None

    def or_skip(self) -> Prepared:
        """This case, or a pytest skip where eager PyTorch itself refuses it."""
        if self.eager_error is not None:
            pytest.skip(f"eager PyTorch refuses this sample: {self.eager_error}")
        return self


def prepare(label: str, fn: Callable[..., Any], samples: list[Sample]) -> Prepared:
    """Run ``fn`` eagerly on ``samples[0]``, then trace it there and rewrite the trace.

    Example::

        >>> prep = prepare("sin", torch.sin, make_samples([(3,)], 2, seed=0))
        >>> prep.result.modified
        False
    """
    try:
        fn(*samples[0])
    except RuntimeError as err:
        raise_if_test_device_failed(err, f"eager {label}")
        return Prepared(label, fn, samples, eager_error=str(err).splitlines()[0])
    gm = fxviews.trace(fn, *samples[0])
    code = gm.code
    return Prepared(label, fn, samples, gm, code, fxviews.rewrite(gm))


def assert_raw_graph_is_wrong(prep: Prepared, layouts: Sequence[InDims]) -> None:
    """The harness can fail: the un-rewritten graph holds as_strided and gives wrong numbers.

    Under ``vmap`` at some of ``layouts`` the raw trace is silently wrong (no error), which is
    the bug fxviews fixes; with every batch dim first it is right even raw (its strides are the
    traced ones there), so a failure there would mean a broken reference rather than the bug.
    """
    assert prep.gm is not None, prep.eager_error
    assert as_strided_nodes(prep.gm), f"{prep.label} no longer produces as_strided"
    found = vmap_failures(prep.gm, prep.fn, prep.samples, layouts, label=prep.label)
    assert found, f"vmap of the raw graph of {prep.label} matched eager on every layout"
    assert all(WRONG_RESULT in line for line in found), found
    batch_first = in_dims_id((0,) * len(prep.samples[0]))
    assert not any(line.startswith(batch_first + ":") for line in found), found


def nonlinear_loss(outs: Any) -> torch.Tensor:
    """A scalar of every output whose gradient depends on the forward values (unlike a sum).

    Example::

        >>> nonlinear_loss((torch.zeros(2), torch.zeros(3)))
        tensor(0.)
    """
    leaves = outs if isinstance(outs, (tuple, list)) else (outs,)
    return sum(((i + 1) * out.sin()).sum() for i, out in enumerate(leaves))


def push_in_y(f: Callable[..., Any]) -> Callable[..., Any]:
    """``push(x, y, yt)``: the jvp of ``f(x, .)`` at ``y`` along ``yt`` (outputs and tangents)."""

    def push(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
        return jvp(functools.partial(f, x), (y,), (yt,))

    return push


def pull_in_y(f: Callable[..., Any]) -> Callable[..., Any]:
    """``pull(x, y)``: the gradient in ``y`` of :func:`nonlinear_loss` of ``f(x, y)``."""

    def pull(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return grad(lambda y_: nonlinear_loss(f(x, y_)))(y)

    return pull


def with_transform(f: Callable[..., Any], transform: str) -> tuple[Callable[..., Any], int]:
    """``f(x, y)`` under ``"jvp"`` (:func:`push_in_y`) or ``"grad"`` (:func:`pull_in_y`).

    Returns the function and how many arguments it takes (3 and 2).

    Example::

        >>> pull, n_args = with_transform(lambda x, y: x * y, "grad")
        >>> pull(*make_samples([(2,)] * n_args, 1, seed=0)[0]).shape
        torch.Size([2])
    """
    if transform == "jvp":
        return push_in_y(f), 3
    if transform == "grad":
        return pull_in_y(f), 2
    raise ValueError(f"no transform {transform!r}: 'jvp' or 'grad'")
