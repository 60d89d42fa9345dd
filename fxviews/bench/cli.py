"""The bench's command line: ``python -m fxviews bench`` (or ``python -m fxviews.bench``)."""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import textwrap
import time
from collections.abc import Callable, Sequence

import torch

from fxviews.arguments import positive_int
from fxviews.bench import plots
from fxviews.bench.compile_paths import COMPILED_BATCH
from fxviews.bench.report import failed_paths, render
from fxviews.bench.rows_compile import bench_compile, bench_compiled, bench_first_call
from fxviews.bench.rows_engine import bench_pass_cost
from fxviews.bench.rows_models import MODELS_BATCH, bench_models
from fxviews.bench.rows_runtime import bench_graph, bench_overhead, bench_vmap
from fxviews.bench.settings import FULL, QUICK, Settings, Table

__all__ = ["BENCHES", "ROWS", "add_arguments", "main", "run", "run_rows"]

#: Each row's title and the function measuring it, in the order the rows run and print.
BENCHES: dict[str, tuple[str, Callable[[Settings], Table]]] = {
    "vmap": (
        "1. vmap of push_jvp: loop / eager vmap / transform vs the rewritten graph",
        bench_vmap,
    ),
    "graph": ("2. rewritten vs original graph, contiguous inputs, no vmap", bench_graph),
    "first_call": (
        "3. first call on a fresh function (trace or compile + one run)",
        bench_first_call,
    ),
    "pass_cost": ("4. engine cost vs graph size", bench_pass_cost),
    "overhead": (
        "5. steady-state overhead of a cached transform call, without and under vmap "
        "(min CPU time)",
        bench_overhead,
    ),
    "compile": ("6. compile time: backend='fxviews' vs aot_eager", bench_compile),
    "compiled": (
        f"7. vmap(push_jvp) compiled vs vmap(transform), B={COMPILED_BATCH}: steady state, "
        "first call, break-even",
        bench_compiled,
    ),
    "models": (
        f"8. whole models under vmap, B={MODELS_BATCH}: per-sample grads and jvp, first "
        "call (cpu), steady state",
        bench_models,
    ),
}


#: Row names, in the order they run and print.
ROWS = tuple(BENCHES)

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
        default=",".join(ROWS),
        help=f"comma-separated subset of {','.join(ROWS)} (default: all)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmarks ``args`` select, print their tables, write JSON if asked.

    Exit code 0; 1 if a measured path raised (its cell says why); 2 for unknown rows, or for
    ``--plot`` without matplotlib.
    """
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows:
        print(f"fxviews bench: unknown rows {unknown}; choose from {', '.join(ROWS)}")
        return 2
    settings = QUICK if args.quick else FULL
    if args.plot:
        try:
            plots.require_matplotlib()  # before minutes of measuring, not after
        except ImportError as err:
            print(f"fxviews bench: {err}")
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


def run_rows(rows: Sequence[str], settings: Settings, json_path: str | None) -> dict[str, Table]:
    """Run and print ``rows`` with the current torch settings; write them to ``json_path``."""
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} cpus",
        "threads": torch.get_num_threads(),
        "quick": settings is QUICK,
        "date": datetime.date.today().isoformat(),
    }
    print(textwrap.fill("  ".join(f"{k}={v}" for k, v in meta.items()), 100,
                        initial_indent="fxviews bench  ", subsequent_indent="  "))  # fmt: skip
    tables: dict[str, Table] = {}
    for row in rows:
        title, bench = BENCHES[row]
        # Each row starts from a collected heap: row 4's 100k-node graph leaves ~1.3M objects
        # in reference cycles, collected here rather than in the middle of a later timing.
        gc.collect()
        start = time.perf_counter()
        tables[row] = bench(settings)
        print(f"\n{title}  [{time.perf_counter() - start:.1f} s]", flush=True)
        print(render(tables[row]), flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump({"meta": meta, "rows": tables}, out, indent=2)
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxviews.bench [options]``: the bench command on its own."""
    parser = argparse.ArgumentParser(prog="fxviews bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
