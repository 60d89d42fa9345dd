"""Rows 3, 6, 7 and 11: first calls and compiles, fxviews against torch.compile's paths."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch

import fxviews
from fxviews.bench.cold import FirstCallCase, first_call_samples
from fxviews.bench.compile_paths import (
    COMPILE_FUNCTIONS,
    COMPILED_PATHS,
    TRANSFORM_PATH,
    compiled_path_wrap,
)
from fxviews.bench.output import progress
from fxviews.bench.report import measured, ratio
from fxviews.bench.research_programs import BENCH_SHAPES, KINDS
from fxviews.bench.settings import Settings, Table
from fxviews.bench.timing import (
    cpu_ratio_range,
    first_call_seconds,
    median_of,
    steady_cpu_seconds,
    steady_seconds,
)
from fxviews.bench.workloads import make_push_jvp, on, seed_batch, transform_or_reason
from fxviews.examples import seed_args


def bench_first_call(settings: Settings) -> Table:
    """Row 3: cost of the first call (trace/compile + one run) on a fresh function."""
    args = on(settings.device, seed_args())
    transform, why = transform_or_reason()
    paths: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]] | None] = {
        "fxviews.transform": transform,
        "torch.compile aot_eager": lambda fn: torch.compile(fn, backend="aot_eager"),
        "torch.compile default (inductor)": (torch.compile if settings.default_backend else None),
    }
    skipped = {
        "fxviews.transform": why,
        "torch.compile default (inductor)": "n/a (skipped in --quick)",
    }
    results: dict[str, tuple[float | None, str]] = {}
    for path, wrap in paths.items():
        progress.step(path)
        if wrap is None:
            results[path] = (None, skipped[path])
        else:
            results[path] = measured(
                functools.partial(
                    first_call_seconds, make_push_jvp, wrap, args, settings.compile_repeats
                )
            )
    t_transform = results["fxviews.transform"][0]
    return [
        {
            "path": path,
            "first_call_s": seconds,
            "vs_transform": ratio(seconds, t_transform),
            "note": note,
        }
        for path, (seconds, note) in results.items()
    ]


def bench_compile(settings: Settings) -> Table:
    """Row 6: first-call time of backend="fxviews" vs aot_eager, forward only and trained.

    CPU time is what the ratio compares (see Note [Cold compiles]); ``engine`` is the CPU time
    inside fxviews' rewrite steps during the fxviews compile (part of its CPU time).
    """
    if getattr(fxviews, "backend", None) is None:
        return [{"function": "all", "note": "n/a (fxviews.backend missing)"}]
    table = []
    for function in COMPILE_FUNCTIONS:
        progress.step(function)
        cases = {b: FirstCallCase("compile", b, function) for b in ("aot_eager", "fxviews")}
        measured_calls = first_call_samples(cases, settings)
        aot, fx = measured_calls["aot_eager"][0], measured_calls["fxviews"][0]
        notes = [f"{b}: {note}" for b, (_, note) in measured_calls.items() if note]
        fx_cpu = median_of(fx, "cpu_s")
        table.append(
            {
                "function": function,
                "aot_eager_s": median_of(aot, "wall_s"),
                "fxviews_s": median_of(fx, "wall_s"),
                "aot_eager_cpu_s": median_of(aot, "cpu_s"),
                "fxviews_cpu_s": fx_cpu,
                "fxviews/aot_eager": ratio(fx_cpu, median_of(aot, "cpu_s")),
                "cpu_range": cpu_ratio_range(fx, aot),
                "engine_s": median_of(fx, "engine_s"),
                "note": "; ".join(notes),
            }
        )
    return table


def bench_compiled(settings: Settings) -> Table:
    """Row 7: ``vmap(push_jvp)`` compiled, against ``vmap(fxviews.transform(push_jvp))``.

    Steady state: every path compiled once, then timed side by side (minimum CPU time, which
    the first calls' CPU time and the break-even are compared with; on a device, ``--device``,
    synchronised wall-clock medians, and the break-even in wall time). First call: a fresh
    function, Dynamo reset, compile caches off, in a fresh interpreter in the full run (see
    Note [Cold compiles]); its CPU time is what the ratios and the break-even compare.
    Break-even: the number of calls ``n`` after which ``first + (n - 1) * steady`` of the
    compiled path drops below the transform's.
    """
    from fxviews.passes.compat.torch_internals import reset_dynamo

    transform, why = transform_or_reason()
    batch, device = settings.compiled_batch, settings.device
    _, batched = seed_batch(batch, device)
    names = [TRANSFORM_PATH] if transform is not None else []
    names += [
        n for n, (_, inductor) in COMPILED_PATHS.items() if settings.default_backend or not inductor
    ]
    cases = {n: FirstCallCase("compiled", n, batch=batch, device=device) for n in names}
    first = first_call_samples(cases, settings)
    try:
        ready: dict[str, Callable[[], Any]] = {}
        for name in names:
            if first[name][0]:
                ready[name] = functools.partial(compiled_path_wrap(name)(make_push_jvp()), *batched)
                ready[name]()  # compiles (caches on): the steady state follows
        steady: dict[str, float | None] = dict(steady_seconds(ready, settings))
    finally:
        reset_dynamo()
    cpu = {name: median_of(calls, "cpu_s") for name, (calls, _) in first.items()}
    # The break-even adds first call and steady calls: on a device both in wall time.
    clock = "cpu_s" if device is None else "wall_s"
    total = {name: median_of(calls, clock) for name, (calls, _) in first.items()}
    inductor = (cpu.get("inductor"), steady.get("inductor"))
    table = []
    for name in [*names, *(p for p in COMPILED_PATHS if p not in names)]:
        calls, note = first.get(name, ([], "n/a (--quick)"))
        note = note or (why if name == TRANSFORM_PATH else "")
        base = name == TRANSFORM_PATH
        table.append(
            {
                "path": name,
                "B": batch,
                "steady_s": steady.get(name),
                "first_call_s": median_of(calls, "wall_s"),
                "first_cpu_s": cpu.get(name),
                "engine_s": median_of(calls, "engine_s") or None,
                "break_even": "(base)"
                if base
                else break_even(
                    total.get(name),
                    steady.get(name),
                    total.get(TRANSFORM_PATH),
                    steady.get(TRANSFORM_PATH),
                ),
                "steady/inductor": ratio(steady.get(name), inductor[1]),
                "first/inductor": ratio(cpu.get(name), inductor[0]),
                # How the ratio to Inductor moved from round to round.
                "range": ""
                if name == "inductor"
                else cpu_ratio_range(calls, first.get("inductor", ([], ""))[0]),
                "note": note,
            }
        )
    return table


def break_even(
    first: float | None, steady: float | None, base_first: float | None, base_steady: float | None
) -> str:
    """After how many calls a path with a dearer first call costs less in total than the base.

    Example::

        >>> break_even(first=10.0, steady=1e-5, base_first=0.1, base_steady=1e-4)
        '110,002'
    """
    if None in (first, steady, base_first, base_steady):
        return ""
    assert first is not None and steady is not None  # for the type checker
    assert base_first is not None and base_steady is not None
    if first <= base_first:
        return "1"
    if steady >= base_steady:
        return "never"
    # Total for n calls: first + (n - 1) * steady; the base likewise.
    calls = 1 + (first - base_first) / (base_steady - steady)
    return f"{int(calls) + 1:,}"


def bench_user_as_strided(settings: Settings) -> Table:
    """Row 11: research programs that write their own as_strided, under ``vmap`` (and
    ``vmap(grad)``), compiled: the backend's first stage rewrites them in Dynamo's graph.

    Batch dim first, where Inductor alone is right too (elsewhere it is not: see
    tests/test_backend_vmap.py), so the times compare like with like. Steady state: minimum CPU
    time of a call once compiled; first call: CPU time of a compile from scratch and one run,
    in this process after a warm-up (ten programs times four paths in fresh interpreters would
    take an hour of Inductor compiles).
    """
    from fxviews.passes.compat.torch_internals import reset_dynamo

    settings = dataclasses.replace(settings, cold_compiles=0)

    names = [
        n for n, (_, inductor) in COMPILED_PATHS.items() if settings.default_backend or not inductor
    ]
    table = []
    for program, kind in itertools.product(BENCH_SHAPES, KINDS):
        function = f"{program} {kind}"
        progress.step(function)
        cases = {n: FirstCallCase("user_as_strided", n, function) for n in names}
        first = first_call_samples(cases, settings)
        try:
            ready: dict[str, Callable[[], Any]] = {}
            for name, case in cases.items():
                if first[name][0]:
                    make, wrap, args, _ = case.build()
                    ready[name] = functools.partial(wrap(make()), *args)
                    ready[name]()  # compiles (caches on): the steady state follows
            steady = steady_cpu_seconds(ready, settings)
        finally:
            reset_dynamo()
        cpu = {n: median_of(calls, "cpu_s") for n, (calls, _) in first.items()}
        table.append(
            {
                "program": function,
                "inductor_s": steady.get("inductor"),
                "fxviews_inductor_s": steady.get("fxviews (inductor)"),
                "steady fxviews/inductor": ratio(
                    steady.get("fxviews (inductor)"), steady.get("inductor")
                ),
                "first_cpu inductor_s": cpu.get("inductor"),
                "first fxviews/inductor": ratio(cpu.get("fxviews (inductor)"), cpu.get("inductor")),
                "steady fxviews/aot_eager": ratio(
                    steady.get("fxviews (eager)"), steady.get("aot_eager")
                ),
                "first fxviews/aot_eager": ratio(cpu.get("fxviews (eager)"), cpu.get("aot_eager")),
                "note": "; ".join(f"{n}: {note}" for n, (_, note) in first.items() if note),
            }
        )
    return table
