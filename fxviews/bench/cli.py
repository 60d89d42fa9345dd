"""The bench's command line: ``python -m fxviews bench`` (or ``python -m fxviews.bench``).

Importing it imports no row: ``--help`` and argument errors answer at once, and each row's
module (with the engine, Dynamo or the zoo it needs) is imported when the row runs.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import os
import platform
import textwrap
import time
from collections.abc import Callable, Sequence

import torch

from fxviews.arguments import positive_int
from fxviews.bench import plots
from fxviews.bench.output import collected_output, progress, summarize
from fxviews.bench.report import WIDTH, failed_paths, legend, render
from fxviews.bench.settings import FULL, QUICK, USER_AS_STRIDED_BATCH, Settings, Table, on_device

__all__ = [
    "BENCHES",
    "DESCRIPTION",
    "DEVICE_ROWS",
    "ROWS",
    "add_arguments",
    "main",
    "run",
    "run_rows",
    "title",
]

#: Each row's title and the function measuring it (``module:function``, imported when the row
#: runs), in the order the rows run and print.
BENCHES: dict[str, tuple[str, str]] = {
    "vmap": (
        "1. vmap of push_jvp: loop / eager vmap / transform vs the rewritten graph",
        "fxviews.bench.rows_runtime:bench_vmap",
    ),
    "graph": (
        "2. rewritten vs original graph, contiguous inputs, no vmap",
        "fxviews.bench.rows_runtime:bench_graph",
    ),
    "first_call": (
        "3. first call on a fresh function (trace or compile + one run)",
        "fxviews.bench.rows_compile:bench_first_call",
    ),
    "pass_cost": ("4. engine cost vs graph size", "fxviews.bench.rows_engine:bench_pass_cost"),
    "overhead": (
        "5. steady-state overhead of a cached transform call, without and under vmap "
        "(min CPU time)",
        "fxviews.bench.rows_runtime:bench_overhead",
    ),
    "compile": (
        "6. compile time: backend='fxviews' vs aot_eager",
        "fxviews.bench.rows_compile:bench_compile",
    ),
    "compiled": (
        "7. vmap(push_jvp) compiled vs vmap(transform), B={compiled_batch}: steady state, "
        "first call, break-even",
        "fxviews.bench.rows_compile:bench_compiled",
    ),
    "models": (
        "8. whole models under vmap, B={models_batch}: per-sample grads and jvp, first "
        "call ({first_call_clock}), steady state",
        "fxviews.bench.rows_models:bench_models",
    ),
    "startup": (
        "9. start-up: import fxviews over import torch, and the command line's --help",
        "fxviews.bench.rows_first_hour:bench_startup",
    ),
    "memory": (
        "10. first call's memory: peak {memory} of transform's first call vs eager, large input",
        "fxviews.bench.rows_first_hour:bench_memory",
    ),
    "user_as_strided": (
        f"11. own as_strided under vmap, vmap(grad), compiled, B={USER_AS_STRIDED_BATCH}: "
        "steady, first call (cpu)",
        "fxviews.bench.rows_compile:bench_user_as_strided",
    ),
    "small": (
        "12. small programs under vmap, B=3: transform vs eager, steady state and first call",
        "fxviews.bench.rows_small:bench_small",
    ),
    "compiled_models": (
        "13. whole models compiled, B=4, eval and a train step: fxviews vs Inductor, aot_eager",
        "fxviews.bench.rows_compiled_models:bench_compiled_models",
    ),
}

#: Row names, in the order they run and print.
ROWS = tuple(BENCHES)
#: The rows ``--device`` runs on a device: the ones whose work is the device's kernels. The
#: others measure fxviews' own CPU work (the engine, a cached call's overhead, compiles,
#: start-up): they run without ``--device``.
DEVICE_ROWS = ("vmap", "first_call", "compiled", "models", "memory")


def title(row: str, settings: Settings) -> str:
    """Row ``row``'s printed title under ``settings`` (its batches, its clock).

    Example::

        >>> title("models", QUICK)
        '8. whole models under vmap, B=8: per-sample grads and jvp, first call (cpu), steady state'
    """
    return BENCHES[row][0].format(
        compiled_batch=settings.compiled_batch,
        models_batch=settings.models_batch,
        first_call_clock="cpu" if settings.device is None else "wall",
        memory="RSS" if settings.device in (None, "cpu") else "device memory",
    )


#: ``bench --help``'s description: what each row compares, in plain text.
DESCRIPTION = """\
Time fxviews against the alternatives, every comparison measured side by side in this run
(ratios are what compare; absolute times move with the machine). Rows (--rows NAME,...):

  vmap        vmap over the rewritten graph of push_jvp vs a per-sample Python loop, eager
              vmap(push_jvp) and vmap(fxviews.transform(push_jvp))
  graph       the rewritten graph vs the original one, no vmap
  first_call  first call of transform(fn) vs torch.compile(fn) (aot_eager, Inductor)
  pass_cost   the engine's cost vs graph size, and as a share of make_fx's trace
  overhead    a cached transform call vs calling its graph, directly and under vmap
  compile     compile time of backend="fxviews" vs aot_eager
  compiled    vmap(push_jvp) compiled vs vmap(transform): per call, first call, break-even
  models      per-sample grads and jvp of whole models under vmap: eager vs transform vs
              aot_eager (torchvision and timm models too, with fxviews[zoo])
  startup     seconds import fxviews adds to import torch, and python -m fxviews --help
  memory      peak memory of transform's first call (one sample recorded) vs eager
  user_as_strided
              research programs (im2col, log-mel, Hankel, Takens, windows) that write their own
              as_strided, under vmap and vmap(grad), compiled: backend="fxviews" vs Inductor
              and aot_eager, steady state and first call
  small       programs of a few ops (a KV-cache write, rotary embeddings, a GRU step, an
              optimizer step, a window sum, ...) under vmap: transform vs eager, per call
              and first call
  compiled_models
              whole models (Longformer's sliding-chunk attention, a cache read by chunks, a
              gain written into gapped windows, a Toeplitz layer, an im2col convolution,
              GPT-2 blocks) compiled, eval and a
              training step: backend="fxviews" with Inductor vs Inductor, with its eager
              inner compiler vs aot_eager, steady state and first compile, median and worst

Rows 1, 4, 5, 7, 11, 12 and 13 report the minimum CPU time over interleaved repeats, rows 2 and 3
the median wall time. torch runs on one thread unless --threads says otherwise. A path that
cannot run here prints "n/a (why)"; a path that raises prints "n/a (error: ...)" and the run
exits with status 1. Warnings PyTorch prints while a row runs are collected and summarized
after its table.

--device cuda (or cuda:1, ...) runs the rows whose work is the device's (vmap, first_call,
compiled, models, memory: the default rows then) with their tensors and models there, at
larger batches, every time a wall-clock median with the device synchronised before and after
each timed stretch; memory is the device's peak allocated memory. A device this machine lacks
ends the run before anything is measured, saying so. --device cpu runs the same rows the same
way on CPU.
"""

# --- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser`` (a subparser of ``python -m fxviews``)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats, no 100k-node graph, no Inductor, the zoo at 64x64: about a minute "
        "(2.5 with fxviews[zoo] installed)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every table to PATH as JSON")
    parser.add_argument(
        "--plot",
        metavar="DIR",
        help="also write PNG charts of the tables to DIR (needs the extra fxviews[bench])",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch intra-op threads (default 1: timings independent of load)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        metavar="NAME,...",
        help=f"the rows to run, comma-separated, from: {', '.join(ROWS)} (default: all; with "
        f"--device, {', '.join(DEVICE_ROWS)})",
    )
    parser.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="run the device rows with tensors and models on DEVICE (cuda, cuda:1, cpu), timed "
        "in wall time with the device synchronised",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmarks ``args`` select, print their tables, write JSON if asked.

    Exit code 0; 1 if a measured path raised (its cell says why); 2, before measuring anything,
    for unknown rows, an output path that cannot be written, ``--plot`` without matplotlib, or
    a ``--device`` this machine lacks (or rows it does not run on a device).
    """
    default = DEVICE_ROWS if args.device is not None else ROWS
    rows = [r.strip() for r in (args.rows or ",".join(default)).split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows:
        print(f"fxviews bench: unknown rows {unknown}; choose from {', '.join(ROWS)}")
        return 2
    settings = QUICK if args.quick else FULL
    if args.device is not None:
        problem = unusable_device(args.device)
        off_device = [row for row in rows if row not in DEVICE_ROWS]
        if off_device and not problem:
            problem = (
                f"rows {', '.join(off_device)} measure fxviews' CPU work and run without "
                f"--device; with it: {', '.join(DEVICE_ROWS)}"
            )
        if problem:
            print(f"fxviews bench: --device {args.device}: {problem}")
            return 2
        settings = on_device(settings, args.device)
    # Every check of the outputs comes before minutes of measuring, not after.
    problems = [f"--json {args.json}: {p}" for p in [unwritable(args.json, "file")] if p]
    problems += [f"--plot {args.plot}: {p}" for p in [unwritable(args.plot, "directory")] if p]
    if args.plot and not problems:
        try:
            plots.require_matplotlib()
        except ImportError as err:
            problems.append(str(err))
    if problems:
        print("fxviews bench: " + "\n  ".join(problems))
        return 2
    # Called in-process (tests, notebooks), the thread count must not leak out of the bench.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        tables = run_rows(rows, settings, args.json)
    finally:
        torch.set_num_threads(threads_before)
    if args.plot:
        for path in plots.write_charts(tables, args.plot):
            print(f"wrote {path}")
    failures = failed_paths(tables)
    if failures:
        print("\nfxviews bench: measured paths failed:\n  " + "\n  ".join(failures))
        return 1
    return 0


def unwritable(path: str | None, kind: str) -> str | None:
    """Why the bench could not write its ``kind`` (``"file"`` or ``"directory"``) at ``path``,
    or None where it can (or no path was given).

    A file needs its directory to exist; a directory is created with its missing parents, so
    the nearest one that exists must be a writable directory.

    Example::

        >>> unwritable("/nonexistent/dir/x.json", "file")
        'its directory /nonexistent/dir does not exist'
    """
    if not path:
        return None
    target = os.path.abspath(path)
    if os.path.exists(target):
        if kind == "file" and os.path.isdir(target):
            return "is a directory; give a file name"
        if kind == "directory" and not os.path.isdir(target):
            return "exists and is not a directory"
        return None if os.access(target, os.W_OK) else "is not writable"
    parent = os.path.dirname(target)
    if kind == "directory":
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            return f"{parent} is not a directory"
    elif not os.path.isdir(parent):
        return f"its directory {parent} does not exist"
    return None if os.access(parent, os.W_OK) else f"its directory {parent} is not writable"


def unusable_device(device: str) -> str | None:
    """Why the bench cannot run on ``device`` here (None if it can), in one line.

    Example::

        >>> unusable_device("cuda")   # on a machine without a GPU
        'this machine has no CUDA device: torch 2.13.0+cpu is built without CUDA'
    """
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        return f"not a device torch knows ({str(err).splitlines()[0]})"
    if parsed.type == "cuda":
        if torch.version.cuda is None:
            return (
                f"this machine has no CUDA device: torch {torch.__version__} is built without CUDA"
            )
        if not torch.cuda.is_available():
            return (
                f"this machine has no CUDA device: torch {torch.__version__} (CUDA "
                f"{torch.version.cuda}) finds no GPU or driver (torch.cuda.is_available() is "
                "False)"
            )
    if parsed.type == "meta":
        return "meta tensors hold no values: kernels do not run there"
    try:
        torch.empty(1, device=parsed)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError or AssertionError
        return f"no tensor can be made there ({type(err).__name__}: {str(err).splitlines()[0]})"
    return None


def device_name(device: str | None) -> str:
    """How the bench's header names the device: its model for an accelerator."""
    if device is None:
        return "cpu"
    parsed = torch.device(device)
    if parsed.type == "cuda":
        return f"{parsed} ({torch.cuda.get_device_name(parsed)}, CUDA {torch.version.cuda})"
    return str(parsed)


def bench_function(row: str) -> Callable[[Settings], Table]:
    """The function measuring ``row``, imported now (see :data:`BENCHES`)."""
    module, name = BENCHES[row][1].split(":")
    function: Callable[[Settings], Table] = getattr(importlib.import_module(module), name)
    return function


def run_rows(rows: Sequence[str], settings: Settings, json_path: str | None) -> dict[str, Table]:
    """Run and print ``rows`` with the current torch settings; write them to ``json_path``."""
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} cpus",
        "threads": torch.get_num_threads(),
        "quick": not settings.default_backend,  # --quick: the run without Inductor
        "device": device_name(settings.device),
        "date": datetime.date.today().isoformat(),
    }
    print(textwrap.fill("  ".join(f"{k}={v}" for k, v in meta.items()), WIDTH,
                        initial_indent="fxviews bench  ", subsequent_indent="  "))  # fmt: skip
    tables: dict[str, Table] = {}
    for row in rows:
        heading = title(row, settings)
        bench = bench_function(row)
        # Each row starts from a collected heap: row 4's 100k-node graph leaves ~1.3M objects
        # in reference cycles, collected here rather than in the middle of a later timing.
        gc.collect()
        start = time.perf_counter()
        with collected_output() as collected, progress.row(heading):
            tables[row] = bench(settings)
        print(f"\n{heading}  [{time.perf_counter() - start:.1f} s]", flush=True)
        print(render(tables[row]), flush=True)
        for line in legend(tables[row]) + summarize(collected):
            print(textwrap.fill(line, WIDTH, subsequent_indent="    "), flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump({"meta": meta, "rows": tables}, out, indent=2)
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxviews.bench [options]``: the bench command on its own."""
    parser = argparse.ArgumentParser(
        prog="fxviews bench",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
