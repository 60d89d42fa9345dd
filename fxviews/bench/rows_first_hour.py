"""Rows 9 and 10, what a new user meets first: start-up time, and the first call's memory.

Row 9 (``startup``) runs fresh interpreters: one imports torch and then times
``import fxviews`` inside itself (the goal: at most 0.3 s over ``import torch``), another
times ``python -m fxviews --help`` from outside beside ``python -c "import torch"`` (its
``torch`` column: the whole process's wall time for each).

Row 10 (``memory``) runs one fresh interpreter per path on a large input (about
``settings.memory_mb`` MB, push_jvp's three tensors): eager ``push_jvp`` and the first call of
``transform(push_jvp)``, called directly and under ``vmap`` (batch of 8, batch dim last).
Each child reports its peak resident memory (``ru_maxrss``) over what it held just before the
call (its ``peak_mb`` column), so the input itself is not counted; with ``--device`` on an
accelerator, its peak allocated tensor memory there over what was allocated before the call
(the device synchronised before and after). A first call of
``transform`` runs ``fn`` once on fresh tensors holding one sample (Note [Recording a real
trace] in ``fxviews/tracing/recording.py``): called directly that sample is the whole input,
under ``vmap`` one sample of the batch; past ``fxviews.tracing.capture.RECORDING_LIMIT_BYTES``
it traces in fake mode instead.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import fxviews
from fxviews.bench.output import progress
from fxviews.bench.report import FAILED, ratio, why
from fxviews.bench.settings import Settings, Table

__all__ = ["bench_memory", "bench_startup", "memory_child"]

#: The goal of row 9: seconds ``import fxviews`` may add to ``import torch``.
IMPORT_GOAL_S = 0.3

_IMPORT_FXVIEWS = (
    "import time, torch; start = time.perf_counter(); import fxviews; "
    "print(time.perf_counter() - start)"
)


def _child_env() -> dict[str, str]:
    """The environment of a child: this fxviews first on its path, wherever it is installed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(fxviews.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _run(command: list[str]) -> tuple[float, str]:
    """Wall seconds and stdout of a child; raises with its stderr's last line if it fails."""
    start = time.perf_counter()
    done = subprocess.run(command, env=_child_env(), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise RuntimeError(lines[-1])
    return seconds, done.stdout


def bench_startup(settings: Settings) -> Table:
    """Row 9: ``import fxviews`` over ``import torch``, and ``--help`` beside ``import torch``."""
    python = sys.executable
    imports, helps, torches = [], [], []
    for repeat in range(settings.repeats):  # interleaved, so load hits every command alike
        progress.step(f"fresh interpreters, round {repeat + 1} of {settings.repeats}")
        imports.append(float(_run([python, "-c", _IMPORT_FXVIEWS])[1]))
        torches.append(_run([python, "-c", "import torch"])[0])
        helps.append(_run([python, "-m", "fxviews", "--help"])[0])
    fx, torch_s, help_s = (statistics.median(v) for v in (imports, torches, helps))
    return [
        {
            "command": "import fxviews (after torch)",
            "median_s": fx,
            "torch_s": None,
            "over_torch_s": fx,
            "goal": f"<= {IMPORT_GOAL_S} s {'met' if fx <= IMPORT_GOAL_S else 'NOT met'}",
        },
        {
            "command": "python -m fxviews --help",
            "median_s": help_s,
            "torch_s": torch_s,
            "over_torch_s": help_s - torch_s,
            "goal": "",
        },
    ]


#: Row 10's paths: how the child calls push_jvp on its input.
MEMORY_PATHS = ("eager", "transform", "vmap eager", "vmap transform")
#: Row 10's batch under vmap.
MEMORY_BATCH = 8


def bench_memory(settings: Settings) -> Table:
    """Row 10: the first call's peak memory over the input, per path, in fresh interpreters."""
    peaks: dict[str, list[float]] = {path: [] for path in MEMORY_PATHS}
    seconds: dict[str, list[float]] = {path: [] for path in MEMORY_PATHS}
    notes = dict.fromkeys(MEMORY_PATHS, "")
    for repeat in range(settings.compile_repeats):
        for path in MEMORY_PATHS:
            progress.step(f"{path}, {settings.memory_mb} MB input, {repeat + 1}")
            if notes[path]:
                continue
            command = [sys.executable, "-c", _MEMORY_CHILD, path, str(settings.memory_mb)]
            command += [settings.device] if settings.device is not None else []
            try:
                measured = json.loads(_run(command)[1])
            except Exception as err:  # noqa: BLE001 - said in the line, and fails the run
                notes[path] = f"{FAILED}{why(err)})"
                continue
            peaks[path].append(measured["peak_over_start_mb"])
            seconds[path].append(measured["seconds"])
    peak = {p: statistics.median(v) if v else None for p, v in peaks.items()}
    time_s = {p: statistics.median(v) if v else None for p, v in seconds.items()}
    table = []
    for path in MEMORY_PATHS:
        eager = "vmap eager" if path.startswith("vmap") else "eager"
        table.append(
            {
                "path": path,
                "input_mb": settings.memory_mb,
                "peak_mb": peak[path],
                "peak/eager": ratio(peak[path], peak[eager]),
                "first_call_s": time_s[path],
                "time/eager": ratio(time_s[path], time_s[eager]),
                "note": notes[path],
            }
        )
    return table


_MEMORY_CHILD = "import sys; from fxviews.bench.rows_first_hour import memory_child; memory_child()"


def memory_child() -> None:
    """In a fresh interpreter: ``sys.argv[1]`` is the path, ``sys.argv[2]`` the input's MB,
    ``sys.argv[3]`` (optional) the device; print ``{"peak_over_start_mb": ...}`` for one first
    call: resident memory on CPU, the accelerator's allocated memory on one."""
    import torch

    from fxviews.examples import push_jvp

    path, megabytes = sys.argv[1], int(sys.argv[2])
    device = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cpu")
    torch.set_num_threads(1)
    # push_jvp's three (rows, columns) float32 tensors, megabytes in all; under vmap a batch
    # of MEMORY_BATCH samples with the batch dim last.
    columns = max(1, megabytes * 2**20 // (3 * 4 * 4))
    batched = path.startswith("vmap")
    shape = (4, columns // MEMORY_BATCH, MEMORY_BATCH) if batched else (4, columns)
    args = [torch.randn(shape).to(device) for _ in range(3)]
    fn: Any = fxviews.transform(push_jvp) if path.endswith("transform") else push_jvp
    call = torch.func.vmap(fn, in_dims=-1) if batched else fn
    call(*[a[..., :1] if batched else a[:, :1] for a in args])  # imports and first-time work
    memory = _AcceleratorMemory(device) if device.type != "cpu" else _ResidentMemory()
    start, clock = memory.start(), time.perf_counter()
    out = call(*args)
    memory.wait()
    seconds = time.perf_counter() - clock
    peak = memory.peak()
    del out
    print(json.dumps({"peak_over_start_mb": max(0.0, peak - start), "seconds": seconds}))


class _ResidentMemory:
    """This process's resident memory, in MB: now (Linux's /proc), and its peak (ru_maxrss)."""

    def start(self) -> float:
        return _resident_mb()

    def wait(self) -> None:
        """Nothing to wait for: CPU kernels have run when the call returns."""

    def peak(self) -> float:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _AcceleratorMemory:
    """The tensor memory allocated on an accelerator, in MB: now, and its peak since start."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def start(self) -> float:
        import torch

        torch.accelerator.synchronize(self.device)
        torch.accelerator.reset_peak_memory_stats(self.device)
        return int(torch.accelerator.memory_allocated(self.device)) / 2**20

    def wait(self) -> None:
        import torch

        torch.accelerator.synchronize(self.device)

    def peak(self) -> float:
        import torch

        return int(torch.accelerator.max_memory_allocated(self.device)) / 2**20


def _resident_mb() -> float:
    """This process's resident memory now, in MB (Linux's /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
