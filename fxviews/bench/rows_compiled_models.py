"""Row 13: whole models compiled, ``backend="fxviews"`` against the backends it stands in for.

For each model of :mod:`fxviews.bench.compiled_models` (HF Longformer's sliding-chunk
attention, a cache read by chunks past its filled rows, a gain written into gapped windows, a
Toeplitz layer, an im2col convolution, GPT-2 blocks), in eval (a forward under ``no_grad``)
and one training step (the forward and the backward of a loss): ``fxviews`` with Inductor
inside against Inductor, and ``fxviews`` with the eager inner compiler against
``aot_eager``. First compile: CPU time of a compile from scratch (Dynamo reset, compile caches
off) and the first call, median of ``compile_repeats``; steady state: the settings' clock over
interleaved repeats (minimum CPU time on CPU). The last lines hold the median and the worst
of each ratio: the goals are a steady state within 1.02x and a first compile within 1.1x of
the backend compared with. A path whose result is not eager's (the loss, in training) says
so in the note.

Example::

    >>> table = bench_compiled_models(QUICK)
    >>> table[-2]["model"], table[-1]["model"]
    ('median', 'worst')
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

from fxviews.bench.compile_paths import own_code
from fxviews.bench.compiled_models import COMPILED_MODELS, build
from fxviews.bench.output import progress
from fxviews.bench.report import measured, ratio
from fxviews.bench.settings import Settings, Table
from fxviews.bench.timing import first_call, steady_seconds

__all__ = ["COMPILED_MODELS_BATCH", "bench_compiled_models"]

#: Samples per batch of row 13.
COMPILED_MODELS_BATCH = 4
#: The paths compared, as ``torch.compile`` keywords, and whether each runs Inductor.
PATHS: dict[str, tuple[dict[str, Any], bool]] = {
    "inductor": ({}, True),
    "fxviews (inductor)": ({"backend": "fxviews", "options": {"inner": "inductor"}}, True),
    "aot_eager": ({"backend": "aot_eager"}, False),
    "fxviews (eager)": ({"backend": "fxviews"}, False),
}
#: (ratio column, path, the path it is compared with, which measure).
RATIOS = (
    ("steady fx/inductor", "fxviews (inductor)", "inductor", "steady"),
    ("first fx/inductor", "fxviews (inductor)", "inductor", "first"),
    ("steady fx/aot_eager", "fxviews (eager)", "aot_eager", "steady"),
    ("first fx/aot_eager", "fxviews (eager)", "aot_eager", "first"),
)


def bench_compiled_models(settings: Settings) -> Table:
    """The row: a line per model and program, then the median and the worst ratio."""
    paths = {
        n: kw for n, (kw, inductor) in PATHS.items() if settings.default_backend or not inductor
    }
    table = []
    for name in settings.compiled_models or tuple(COMPILED_MODELS):
        model, make_input = build(name)
        model = model.to(settings.device)
        x = make_input(COMPILED_MODELS_BATCH, device=settings.device)
        for kind in ("eval", "train"):
            progress.step(f"{name}, {kind}")
            table.append(
                {"model": name, "program": kind, **_measure(model, kind, x, paths, settings)}
            )
    return table + [_summary("median", table, statistics.median), _summary("worst", table, max)]


def _program(model: torch.nn.Module, kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Eval: the forward under no_grad; train: the loss whose backward is the step."""
    if kind == "eval":

        def forward(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return model(x)

        return forward

    def loss(x: torch.Tensor) -> torch.Tensor:
        return model(x).square().mean()

    return loss


def _measure(
    model: torch.nn.Module,
    kind: str,
    x: torch.Tensor,
    paths: dict[str, dict[str, Any]],
    settings: Settings,
) -> dict[str, Any]:
    """First compiles, the paths alternating round by round (a burst of load hits them alike),
    then every path compiled once more and timed side by side: a first call resets Dynamo,
    so no steady state is built before the last first call."""
    train = kind == "train"
    wraps = {path: _wrap(path, kind, options) for path, options in paths.items()}
    calls: dict[str, list[tuple[float | None, str]]] = {path: [] for path in paths}
    program = functools.partial(_program, model, kind)
    for _ in range(settings.compile_repeats):
        for path, wrap in wraps.items():
            first_seconds = functools.partial(_first_seconds, program, wrap, x, train)
            calls[path].append(measured(first_seconds))
    first: dict[str, float | None] = {}
    ready: dict[str, Callable[[], Any]] = {}
    expected = _program(model, kind)(x).detach()
    wrong: list[str] = []
    for path, results in calls.items():
        seconds = [s for s, _ in results if s is not None]
        first[path] = statistics.median(seconds) if seconds else None
        if seconds:
            compiled = wraps[path](_program(model, kind))
            step = functools.partial(_step if train else _forward, compiled, x)
            step()  # compiled (caches on): the steady state follows
            ready[path] = step
            error = (compiled(x).detach() - expected).abs().max().item()
            if error > 1e-4 * (1 + expected.abs().max().item()):
                wrong.append(f"{path}: other numbers than eager (max |diff| {error:.2g})")
    steady = steady_seconds(ready, settings)
    line: dict[str, Any] = {
        "inductor_steady_s": steady.get("inductor"),
        "aot_eager_steady_s": steady.get("aot_eager"),
    }
    for column, path, base, measure in RATIOS:
        times = steady if measure == "steady" else first
        line[column] = ratio(times.get(path), times.get(base))
    notes = wrong + [
        f"{path}: {note}" for path, results in calls.items() for _, note in results if note
    ]
    return {**line, "note": "; ".join(dict.fromkeys(notes))}


def _first_seconds(
    program: Callable[[], Callable[..., Any]],
    wrap: Callable[..., Any],
    x: torch.Tensor,
    train: bool,
) -> float:
    """CPU seconds of a compile from scratch and the first call (its backward if ``train``)."""
    return first_call(program, wrap, (x,), train).cpu_s


def _wrap(path: str, kind: str, options: dict[str, Any]) -> Callable[..., Any]:
    """How ``path`` compiles a program: its own code object, so paths share no Dynamo cache."""

    def wrap(fn: Callable[..., Any]) -> Any:
        return torch.compile(own_code(fn, f"{path} {kind}"), **options)

    return wrap


def _forward(compiled: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    compiled(x)


def _step(compiled: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """One training step: the loss and its backward."""
    compiled(x).backward()


def _summary(label: str, table: Table, pick: Callable[[list[float]], float]) -> dict[str, Any]:
    line: dict[str, Any] = {"model": label, "program": ""}
    line |= {"inductor_steady_s": None, "aot_eager_steady_s": None}
    for column, *_ in RATIOS:
        values = [row[column] for row in table if row[column] is not None]
        line[column] = pick(values) if values else None
    return {**line, "note": ""}
