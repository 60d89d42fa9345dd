"""Timing primitives of the bench: interleaved repeats, first calls, CPU time, engine share.

Every function here measures calls it is given and knows nothing of the bench's rows
(:mod:`fxviews.bench`): a row builds its calls, these time them side by side.

Example::

    >>> times = min_cpu_seconds({"graph": graph_call, "tf": tf_call}, 21, 0.05)
    >>> times["tf"] - times["graph"]   # seconds one call of tf costs over graph
    1.9e-06
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.bench.settings import Settings
from fxviews.calls import build
from fxviews.consumers.compile import backend, dynamo_stage
from fxviews.passes.device_faults import devices_of
from fxviews.rewriting import steps


def median_seconds(
    calls: Mapping[str, Callable[[], Any]], repeats: int, repeat_seconds: float
) -> dict[str, float]:
    """Median wall-clock seconds of one call of each of ``calls`` over ``repeats`` repeats.

    Each repeat runs a call enough times to last ``repeat_seconds`` (see
    :func:`interleaved_samples`).
    """
    samples = interleaved_samples(calls, repeats, repeat_seconds, time.perf_counter)
    return {name: statistics.median(times) for name, times in samples.items()}


def min_cpu_seconds(
    calls: Mapping[str, Callable[[], Any]], repeats: int, repeat_seconds: float
) -> dict[str, float]:
    """Minimum CPU seconds of one call of each of ``calls`` over ``repeats`` short repeats.

    For differences of a microsecond or two: CPU time leaves out the time the process waits
    for a core, and the minimum over many short repeats is the repeat least disturbed by the
    rest of the machine (caches, frequency), where a median of a few long wall-clock repeats
    moves by more than the difference measured.
    """
    samples = interleaved_samples(calls, repeats, repeat_seconds, time.process_time)
    return {name: min(times) for name, times in samples.items()}


def interleaved_samples(
    calls: Mapping[str, Callable[[], Any]],
    repeats: int,
    repeat_seconds: float,
    timer: Callable[[], float],
    synchronize: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls`` in each of ``repeats`` repeats, read off ``timer``.

    The calls are compared against each other, so their repeats are interleaved: a burst of
    load from elsewhere on the machine then hits all of them alike instead of one. Each repeat
    runs a call enough times to last ``repeat_seconds``, so fast calls are not dominated by
    timer resolution; the first call of each is a warm-up that also sizes that loop.
    ``synchronize`` waits for the work the calls queued on a device: it runs after the warm-up
    and at both ends of every timed loop, so a repeat times the kernels, not their launches.
    """
    numbers = {}
    for name, call in calls.items():
        synchronize()
        start = time.perf_counter()
        call()
        synchronize()
        elapsed = max(time.perf_counter() - start, 1e-7)
        numbers[name] = max(1, int(repeat_seconds / elapsed))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            synchronize()
            start = timer()
            for _ in range(numbers[name]):
                call()
            synchronize()
            samples[name].append((timer() - start) / numbers[name])
    return samples


def synchronizer(device: str | None) -> Callable[[], None]:
    """What waits for the work queued on ``device``: ``torch.accelerator.synchronize`` on an
    accelerator, nothing on CPU (or None, the CPU bench).

    Example::

        >>> synchronizer("cpu")()   # returns at once
    """
    if device is None or torch.device(device).type == "cpu":
        return lambda: None
    target = torch.device(device)
    return lambda: torch.accelerator.synchronize(target)


def steady_seconds(calls: Mapping[str, Callable[[], Any]], settings: Settings) -> dict[str, float]:
    """Rows 1, 7 and 8's steady states, by the settings' clock.

    The CPU bench (no device): :func:`steady_cpu_seconds`. On a device (``--device``): the
    median wall time over the same repeats, the device synchronised around each timed loop
    (CPU time would miss the kernels, which run after their launch returns).
    """
    if settings.device is None:
        return steady_cpu_seconds(calls, settings)
    samples = interleaved_samples(
        calls,
        settings.repeats * 3,
        settings.min_repeat_seconds / 2,
        time.perf_counter,
        synchronizer(settings.device),
    )
    return {name: statistics.median(times) for name, times in samples.items()}


def first_call_seconds(
    make_fn: Callable[[], Callable[..., Any]],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    args: Sequence[Any],
    repeats: int,
    backward: bool = False,
) -> float:
    """Median seconds of the first call of ``wrap(make_fn())``, after one warm-up.

    Each call is a :func:`first_call`: it compiles (or traces) from scratch, as a fresh function
    in a warm process does.
    """
    from fxviews.passes.compat.torch_internals import reset_dynamo

    try:
        first_call(make_fn, wrap, args, backward)  # imports, lazy initialisation, Dynamo's own
        return statistics.median(
            first_call(make_fn, wrap, args, backward).wall_s for _ in range(repeats)
        )
    finally:
        reset_dynamo()


@dataclass(frozen=True)
class FirstCall:
    """One first call (trace or compile, and one run): its wall time, CPU time, engine share.

    ``cpu_s`` counts this process and every child process it waited for during the call (the
    C++ compiler Inductor runs); ``engine_s`` is the CPU time spent inside fxviews' rewrite
    steps during the call (0.0 on paths that do not run fxviews).
    """

    wall_s: float
    cpu_s: float
    engine_s: float


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and by the children it has waited for."""
    import resource  # Unix only: imported where it is used

    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )


#: The modules that run fxviews' rewrite in a first call: each calls ``rewrite_in_place`` on the
#: graphs it owns (the engine, the reshape and pinning steps, hygiene, the one recompile).
_REWRITE_CALLERS = (backend, dynamo_stage, build)


@contextlib.contextmanager
def engine_timer() -> Iterator[list[float]]:
    """Count the CPU time spent in fxviews' rewrite while the block runs.

    ``rewrite_in_place`` is wrapped, for the block, where the backend and ``transform`` call it.
    Yields a list whose one item is the total.

    Example::

        >>> with engine_timer() as spent:
        ...     torch.compile(fn, backend="fxviews")(*args)
        >>> spent[0]   # seconds
        0.0191
    """
    spent = [0.0]

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return steps.rewrite_in_place(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start

    for module in _REWRITE_CALLERS:
        setattr(module, "rewrite_in_place", timed)  # noqa: B010 - mypy: a function's name
    try:
        yield spent
    finally:
        for module in _REWRITE_CALLERS:
            setattr(module, "rewrite_in_place", steps.rewrite_in_place)  # noqa: B010


def first_call(
    make_fn: Callable[[], Callable[..., Any]],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    args: Sequence[Any],
    backward: bool = False,
) -> FirstCall:
    """The first call of ``wrap(make_fn())``, Dynamo reset and compile caches off around it.

    ``backward=True`` also runs the backward of the output, which compiles the backward graph.
    """
    # Imported on use: Dynamo takes over a second to import, and most benchmarks never need it.
    from fxviews.passes.compat.torch_internals import reset_dynamo

    reset_dynamo()
    fn = wrap(make_fn())
    # Config modules gain patch() when torch installs them, invisibly to type checkers.
    with (
        torch.compiler.config.patch(force_disable_caches=True),  # type: ignore[attr-defined]
        warnings.catch_warnings(),
        engine_timer() as engine,
    ):
        # Dynamo warns that disabling caches disables its profile-guided recompiles too, on
        # every compile (a reset forgets it warned): that is the cold compile measured here.
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        wall, cpu = time.perf_counter(), cpu_seconds()
        out = fn(*args)
        if backward:
            out.backward()
        for device in devices_of(list(args)):  # the call ends when its kernels have run
            synchronizer(str(device))()
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return FirstCall(wall, cpu, engine[0])


def median_of(calls: Sequence[FirstCall], field: str) -> float | None:
    """The median of one field of ``calls`` (None without calls)."""
    return statistics.median(getattr(c, field) for c in calls) if calls else None


def cpu_ratio_range(calls: Sequence[FirstCall], base: Sequence[FirstCall]) -> str:
    """The lowest and highest CPU-time ratio of ``calls`` to ``base`` measured in one round.

    Example::

        >>> cpu_ratio_range([FirstCall(1, 1.1, 0), FirstCall(1, 0.9, 0)],
        ...                 [FirstCall(1, 1.0, 0), FirstCall(1, 1.0, 0)])
        '0.9-1.1x'
    """
    if len(calls) < 2 or len(calls) != len(base):
        return ""
    ratios = [c.cpu_s / b.cpu_s for c, b in zip(calls, base, strict=True)]
    return f"{min(ratios):.2g}-{max(ratios):.2g}x"


def steady_cpu_seconds(
    calls: Mapping[str, Callable[[], Any]], settings: Settings
) -> dict[str, float]:
    """Rows 1 and 7's steady-state times: minimum CPU seconds over three times the settings'
    repeats, each half as long (:func:`min_cpu_seconds`)."""
    return min_cpu_seconds(calls, settings.repeats * 3, settings.min_repeat_seconds / 2)
