"""The "whole models" row: per-sample gradients and jvp of whole models under vmap.

For each program of :mod:`fxviews.bench.models` (the small models written there, then the zoo
torchvision and timm build, at the settings' image side), eager ``vmap(fn)``,
``vmap(transform(fn))`` and ``torch.compile(vmap(fn), backend="aot_eager")``: the first call on
a fresh function (a trace or compile from scratch, and one run; CPU time, median of
``compile_repeats``), the share of ``transform``'s first call spent in fxviews' rewrite, and
the steady-state call (minimum CPU time over interleaved repeats; with ``--device``, first calls
and steady state in wall time, the device synchronised). A zoo model whose library
cannot be imported gets lines saying why. The last lines hold the medians of the ratios, over
the written models and over the zoo when both ran, then over all: the goals are a first call
within 15x eager vmap's, fxviews' share within 25% of it, and a steady state at or below 1.0x
eager vmap.
"""

from __future__ import annotations

import functools
import gc
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch

import fxviews
from fxviews.bench import zoo
from fxviews.bench.models import MODELS, build, program
from fxviews.bench.output import progress
from fxviews.bench.report import ratio, why
from fxviews.bench.settings import MODELS_BATCH, Settings, Table
from fxviews.bench.timing import FirstCall, first_call, steady_seconds
from fxviews.passes.device_faults import devices_of, raise_if_device_failed
from fxviews.tracing.torch_state import preserved_torch_state

__all__ = ["MODELS_BATCH", "bench_models"]

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]

#: How each path runs a per-sample function on a batch.
PATHS: dict[str, Wrap] = {
    "eager": torch.func.vmap,
    "tf": lambda fn: torch.func.vmap(fxviews.transform(fn)),
    "aot": lambda fn: torch.compile(torch.func.vmap(fn), backend="aot_eager"),
}


def bench_models(settings: Settings) -> Table:
    """The row: one line per model and program, then one line of median ratios."""
    # Eager vmap runs BatchNorm and PyTorch's fused attention per sample, and says so on
    # every call: the row measures that as it is, without printing it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*performance drop.*")
        return _rows(settings)


def _rows(settings: Settings) -> Table:
    table: Table = []
    warmed = False
    side, batch, device = settings.zoo_image_side, settings.models_batch, settings.device
    for name in settings.models:
        library = MODELS[name].library
        missing = library and zoo.unavailable(library)
        if missing:
            table += [_unmeasured(name, kind, f"n/a ({missing})") for kind in MODELS[name].programs]
            continue
        model = build(name, image_side=side).to(device)
        for kind in MODELS[name].programs:
            progress.step(f"{name}, {kind}")

            def make_fn(name: str = name, model: Any = model, kind: str = kind) -> Any:
                return program(name, model, kind, batch, side, device)[0]

            args = program(name, model, kind, batch, side, device)[1]
            if not warmed:  # the process's one-time work (imports, first traces) is no row's
                for wrap in PATHS.values():
                    _first_calls(make_fn, wrap, args, 1)
                warmed = True
            table.append({"model": name, "program": kind, **_measure(make_fn, args, settings)})
    return table + _medians(table)


def _unmeasured(name: str, kind: str, note: str) -> dict[str, Any]:
    return {"model": name, "program": kind, **dict.fromkeys(_MEASURED), "note": note}


def _measure(
    make_fn: Callable[[], Any], args: tuple[Any, ...], settings: Settings
) -> dict[str, Any]:
    # Dynamo's captures of vmap (the aot path) leave reference cycles of frames whose locals
    # hold guards of dispatch keys: collected later, on torch 2.15 they reinstate the keys vmap
    # had excluded, in whatever runs then. They are collected here, and the state put back.
    with preserved_torch_state():
        try:
            return _measured(make_fn, args, settings)
        finally:
            gc.collect()


def _measured(
    make_fn: Callable[[], Any], args: tuple[Any, ...], settings: Settings
) -> dict[str, Any]:
    first: dict[str, list[FirstCall] | str] = {}
    for path, wrap in PATHS.items():
        first[path] = _first_calls(make_fn, wrap, args, settings.compile_repeats)
    # First calls in CPU time (the CPU bench) or, on a device, wall time: a first call's kernels
    # run after their launches return, and CPU time would leave them out.
    clock = "cpu_s" if settings.device is None else "wall_s"
    cpu = {p: statistics.median(getattr(c, clock) for c in calls) if isinstance(calls, list)
           else None for p, calls in first.items()}  # fmt: skip
    tf_calls = first["tf"]
    share = (
        statistics.median(c.engine_s / c.cpu_s for c in tf_calls)
        if isinstance(tf_calls, list)
        else None
    )
    runnable = {p: w(make_fn()) for p, w in PATHS.items() if isinstance(first[p], list)}
    for call in runnable.values():
        call(*args)  # built and warm: the steady state is what is timed
    steady = steady_seconds(
        {p: functools.partial(call, *args) for p, call in runnable.items()}, settings
    )
    notes = [f"{p}: {calls}" for p, calls in first.items() if isinstance(calls, str)]
    return {
        "eager_first_s": cpu["eager"],
        "tf_first_s": cpu["tf"],
        "tf/eager first": ratio(cpu["tf"], cpu["eager"]),
        "share_%": None if share is None else 100 * share,
        "aot/eager first": ratio(cpu["aot"], cpu["eager"]),
        "tf/eager": ratio(steady.get("tf"), steady.get("eager")),
        "aot/eager": ratio(steady.get("aot"), steady.get("eager")),
        "note": "; ".join(notes),
    }


#: The measured columns of a line, in :func:`_measure`'s order (between program and note).
_MEASURED = ("eager_first_s", "tf_first_s", "tf/eager first", "share_%", "aot/eager first",
             "tf/eager", "aot/eager")  # fmt: skip
#: How much of the error an ``n/a`` note quotes.
_REASON_CHARACTERS = 90
#: The columns whose medians the last lines hold.
_RATIOS = ("tf/eager first", "share_%", "aot/eager first", "tf/eager", "aot/eager")


def _first_calls(
    make_fn: Callable[[], Any], wrap: Wrap, args: tuple[Any, ...], repeats: int
) -> list[FirstCall] | str:
    """``repeats`` first calls, or why the path cannot run the program here.

    torch.compile cannot capture some of these programs at all (on torch 2.13, Dynamo's
    fake-tensor propagation raises TorchRuntimeError on forward AD through BatchNorm and on
    per-sample gradients through BatchNorm's functional_call): a fact of the path, reported as
    ``n/a``, not a failure of the run.
    """
    # A failed Dynamo capture inside functorch leaves frames in reference cycles whose
    # collection, whenever it comes, exits transform levels that are no longer current and
    # breaks every later jvp of the process: they are collected here, and the state put back.
    with preserved_torch_state():
        try:
            return [first_call(make_fn, wrap, args) for _ in range(repeats)]
        except Exception as err:  # noqa: BLE001 - the path's limitation, stated in the note
            raise_if_device_failed(err, devices_of(list(args)), "a first call of row 8")
            reason = why(err)
        gc.collect()
    return f"n/a, it cannot capture this program here ({reason[:_REASON_CHARACTERS]})"


def _medians(table: Table) -> Table:
    """Lines with the median of every ratio column (and of fxviews' share): over the written
    models and over the zoo when both were measured, then over every line of ``table``.

    A path that cannot run a program (aot_eager's n/a) has no ratio there: its median is over
    the programs it ran.
    """
    measured = [line for line in table if line["tf_first_s"] is not None]
    zoo_lines = [line for line in measured if MODELS[line["model"]].library]
    groups = {"median": measured}
    if zoo_lines and len(zoo_lines) < len(measured):
        written = [line for line in measured if not MODELS[line["model"]].library]
        groups = {"median (written)": written, "median (zoo)": zoo_lines, "median (all)": measured}
    return [_median_line(label, lines) for label, lines in groups.items()]


def _median_line(label: str, lines: Table) -> dict[str, Any]:
    line = _unmeasured(label, "", "")
    for key in _RATIOS:
        values = [row[key] for row in lines if row[key] is not None]
        line[key] = statistics.median(values) if values else None
    return line
