"""The "small programs" row: ``vmap(transform(fn))`` against eager ``vmap(fn)`` on programs of a
few ops each (:mod:`fxviews.bench.small_programs`), B=3 with the batch dim at 1.

On such programs eager ``vmap``'s own cost per op is most of a call, so whatever a transformed
call adds per op or per call shows: the row reports, per program and in the same run, the
steady-state call of both paths (minimum CPU time over interleaved repeats, each path warmed
up first), how much more a call of ``transform(fn)`` costs than one of ``fn`` inside one
``vmap`` (timed there, free of ``vmap``'s own variation), and their first calls on a fresh
function in a warm process (CPU time, median of ``compile_repeats``). The last lines hold the
median and the largest of each ratio: the goals are a steady state at or under eager's on
every program and a first call within 5x eager's (median).
"""

from __future__ import annotations

import functools
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch

import fxviews
from fxviews.bench.output import progress
from fxviews.bench.report import ratio
from fxviews.bench.settings import Settings, Table
from fxviews.bench.small_programs import PROGRAMS, arguments, in_dims
from fxviews.bench.timing import first_call, min_cpu_seconds

__all__ = ["SMALL_BATCH", "SMALL_BATCH_DIM", "bench_small"]

#: The batch and where its dim sits in each tensor, as research code meets them.
SMALL_BATCH, SMALL_BATCH_DIM = 3, 1


def bench_small(settings: Settings) -> Table:
    """The row: one line per program, then the median and the largest ratio."""
    # vmap runs ops without a batching rule (gru_cell) per sample, and says so on every call.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*performance drop.*")
        # The process's one-time work (imports, the first trace ever) is no program's.
        names = settings.small_programs or tuple(PROGRAMS)
        for make in _paths(names[0]).values():
            make()(*arguments(names[0], SMALL_BATCH, SMALL_BATCH_DIM))
        table = [_measure(name, settings) for name in names]
    return table + _summary(table)


def _paths(name: str) -> dict[str, Callable[[], Callable[..., Any]]]:
    """Each path's batched function for program ``name``, built afresh on each call."""
    fn, dims = PROGRAMS[name][0], in_dims(name, SMALL_BATCH_DIM)
    return {
        "eager": lambda: torch.func.vmap(fn, in_dims=dims),
        "tf": lambda: torch.func.vmap(fxviews.transform(fn), in_dims=dims),
    }


def _measure(name: str, settings: Settings) -> dict[str, Any]:
    progress.step(name)
    args = arguments(name, SMALL_BATCH, SMALL_BATCH_DIM)
    paths = _paths(name)
    first = {
        path: statistics.median(
            first_call(make, lambda batched: batched, args).cpu_s
            for _ in range(settings.compile_repeats)
        )
        for path, make in paths.items()
    }
    warm = {path: make() for path, make in paths.items()}
    for call in warm.values():
        call(*args)  # traced and warm: what the repeats time is the steady state
    # Many short repeats: the two paths differ by a few percent, and on a loaded machine the
    # minimum of many short ones finds each path's undisturbed time where a few long ones miss.
    steady = min_cpu_seconds(
        {path: functools.partial(call, *args) for path, call in warm.items()},
        settings.repeats * 9,
        settings.min_repeat_seconds / 10,
    )
    inside = _inside_one_vmap(name, args, settings)
    return {
        "program": name,
        "eager_s": steady["eager"],
        "tf_s": steady["tf"],
        "tf/eager": ratio(steady["tf"], steady["eager"]),
        "in_vmap_tf-eager_s": inside["tf"] - inside["eager"],
        "eager_first_s": first["eager"],
        "tf_first_s": first["tf"],
        "tf/eager first": ratio(first["tf"], first["eager"]),
    }


def _inside_one_vmap(name: str, args: tuple[Any, ...], settings: Settings) -> dict[str, float]:
    """Each path's call of ``fn`` alone, timed inside one ``vmap`` call on its batched tensors.

    A whole ``vmap`` call is ~20 us of ``vmap``'s own work around the function, the same for
    both paths but varying by about a microsecond from repeat to repeat; timed inside it, the
    difference ``transform`` makes (its cached call, its graph's ops against eager's) is read
    to a tenth of a microsecond.
    """
    fn, dims = PROGRAMS[name][0], in_dims(name, SMALL_BATCH_DIM)
    transformed = fxviews.transform(fn)
    seconds: dict[str, float] = {}

    def timed(*batched: Any) -> Any:
        calls = {
            "eager": functools.partial(fn, *batched),
            "tf": functools.partial(transformed, *batched),
        }
        for call in calls.values():
            call()  # traced here: the repeats time the steady state (and are sized by it)
        seconds.update(
            min_cpu_seconds(calls, settings.repeats * 3, settings.min_repeat_seconds / 10)
        )
        return batched[0]  # vmap returns something batched

    torch.func.vmap(timed, in_dims=dims)(*args)
    return seconds


def _summary(table: Table) -> Table:
    lines = []
    for label, summarize in (("median", statistics.median), ("largest", max)):
        line: dict[str, Any] = dict.fromkeys(table[0])
        line["program"] = label
        for key in ("tf/eager", "in_vmap_tf-eager_s", "tf/eager first"):
            line[key] = summarize(row[key] for row in table)
        lines.append(line)
    return lines
