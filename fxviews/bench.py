"""``python -m fxviews bench``: the benchmarks of fxviews, run side by side in one process.

Seven tables, each a set of timings taken in this run with ratios beside them (ratios measured
in one process on one machine are what compare; absolute times move with the machine). The
timers are :mod:`fxviews.bench_timing`'s; this module builds what they time:

1. ``vmap``        vmap over the rewritten graph of ``push_jvp`` vs a per-sample Python
                   loop of eager ``push_jvp``, eager ``vmap(push_jvp)`` and
                   ``vmap(fxviews.transform(push_jvp))``.
2. ``graph``       the rewritten graph vs the original graph, same contiguous inputs, no vmap.
3. ``first_call``  first call of ``transform(fn)`` vs first call of ``torch.compile(fn)`` with
                   ``aot_eager`` and with the default backend, on a fresh function.
4. ``pass_cost``   the engine's cost vs graph size, per node and as a fraction of make_fx.
5. ``overhead``    a cached ``transform`` call vs its graph's ``forward`` returning ``fn``'s
                   output tree and returning a flat list, called directly and under ``vmap``.
6. ``compile``     compile time of ``backend="fxviews"`` vs ``aot_eager``.
7. ``compiled``    ``vmap(push_jvp)`` under ``torch.compile`` (Inductor, ``aot_eager``,
                   ``fxviews`` with inner eager and inner Inductor) vs ``vmap(transform)``:
                   steady-state call, first call, and after how many calls a compile pays.

Rows 1, 4 and 5 and row 7's steady state report the minimum CPU time over interleaved repeats,
which resolves the microseconds they compare on a loaded machine; rows 2 and 3 the median wall
time. The first calls of rows 6 and 7 report CPU time beside wall time and, in the full run,
time each compile in a fresh interpreter (Note [Cold compiles]). torch runs on one thread
unless ``--threads`` says otherwise, so that timings do not depend on how busy the other cores
are. A row whose dependency cannot run here prints ``n/a (reason)`` instead of a number; a measured
path that raises prints ``n/a (error: ...)`` and makes the run exit with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from tabulate import tabulate

import fxviews
from fxviews import bench_plots
from fxviews.bench_timing import (
    FirstCall,
    cpu_ratio_range,
    first_call,
    first_call_seconds,
    median_of,
    median_seconds,
    min_cpu_seconds,
)
from fxviews.cli import positive_int
from fxviews.examples import f, push_jvp, seed_args
from fxviews.tracing import first_line

__all__ = ["add_arguments", "main", "run"]

#: Row names, in the order they run and print.
ROWS = ("vmap", "graph", "first_call", "pass_cost", "overhead", "compile", "compiled")

#: A JSON-ready table: one dict per printed line, the same keys in every dict.
Table = list[dict[str, Any]]


@dataclass(frozen=True)
class Settings:
    """How hard to measure: ``--quick`` trades precision for a run of under a minute."""

    repeats: int  # repeats of a timed call (rows 1 and 7 take three times as many, half as long)
    min_repeat_seconds: float  # each repeat loops a call until it takes at least this long
    batch_sizes: tuple[int, ...]
    graph_nodes: tuple[int, ...]  # approximate node counts of the row-4 graphs
    compile_repeats: int  # first calls, compiles and row 4's traces take seconds: fewer repeats
    default_backend: bool  # Inductor compiles for many seconds; --quick leaves it out
    dense_views: int = 1_000  # views of one base in row 4's as_strided-dense graph (0: none)
    # Rows 6 and 7 time each compile in a fresh interpreter, this many per path, the paths
    # alternating (0: in this process instead, compile_repeats after a warm-up).
    cold_compiles: int = 0
    big_graph_repeats: int = 1  # passes timed on row 4's 100k-node graph (seconds each)


QUICK = Settings(3, 0.01, (8, 64, 256, 1024), (1_000, 10_000), 1, False, 300)
FULL = Settings(
    7,
    0.1,
    (8, 64, 256, 1024),
    (1_000, 10_000, 100_000),
    3,
    True,
    cold_compiles=5,
    big_graph_repeats=3,
)


# --- the functions measured -----------------------------------------------------------------


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


def seed_batch(batch: int) -> tuple[list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """``batch`` samples of ``push_jvp``'s arguments, and the same stacked along dim 0."""
    samples: list[tuple[torch.Tensor, ...]] = [seed_args() for _ in range(batch)]
    return samples, tuple(torch.stack(column) for column in zip(*samples, strict=True))


def steady_cpu_seconds(
    calls: Mapping[str, Callable[[], Any]], settings: Settings
) -> dict[str, float]:
    """Rows 1 and 7's steady-state times: minimum CPU seconds over three times the settings'
    repeats, each half as long (:func:`~fxviews.bench_timing.min_cpu_seconds`)."""
    return min_cpu_seconds(calls, settings.repeats * 3, settings.min_repeat_seconds / 2)


# --- first calls in fresh interpreters ---------------------------------------------------------
#
# Note [Cold compiles]
# A compile takes ~0.2-2 s, and a median of three in one process swings by 20% with the load
# of a shared machine and with what earlier compiles left in the process. Rows 6 and 7 (full
# run) therefore time each compile in a fresh interpreter, every path in the same conditions:
# the child imports torch, fxviews, Dynamo and Inductor, compiles a small unrelated function
# on the same path (Inductor's one-time work in a process: probing the C++ compiler and the
# CPU's vector ISA, ~20 s of CPU on an empty cache, is not what is compared), then makes one
# first call (see first_call: caches off, so the graph's code is compiled from scratch) and
# prints its FirstCall. Inductor compiles in the child itself (TORCHINDUCTOR_COMPILE_THREADS
# =1), so the C++ compilers it runs are children the process waits for and their CPU time is
# counted; a pool of workers would outlive the measurement and its CPU time could not be read.
# The paths alternate, one child each per round, so a burst of load hits them alike; CPU time
# (which leaves out waiting for a core) is what the ratios compare, wall time stands beside it.

#: What a cold-compile child runs: ``cold_child(request)``.
_CHILD = "import sys; from fxviews.bench import cold_child; cold_child(sys.argv[1])"


@dataclass(frozen=True)
class FirstCallCase:
    """A first call that a fresh interpreter can rebuild: row 6's or row 7's path and function."""

    row: str  # "compile" or "compiled"
    path: str  # a backend of row 6, or a path of row 7
    function: str = "push_jvp (forward)"  # one of COMPILE_FUNCTIONS (row 6)

    def build(
        self,
    ) -> tuple[Callable[[], Callable[..., Any]], Wrap, tuple[torch.Tensor, ...], bool]:
        """``(make_fn, wrap, args, backward)`` for :func:`first_call`."""
        if self.row == "compiled":
            _, batched = seed_batch(COMPILED_BATCH)
            return make_push_jvp, compiled_path_wrap(self.path), batched, False
        make_fn, train = COMPILE_FUNCTIONS[self.function]
        args = tuple(t.requires_grad_(train) for t in seed_args())
        return make_fn, functools.partial(torch.compile, backend=self.path), args, train


def cold_first_call(case: FirstCallCase, threads: int) -> FirstCall:
    """:func:`first_call` of ``case`` in a fresh interpreter (see Note [Cold compiles])."""
    request = json.dumps({**dataclasses.asdict(case), "threads": threads})
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    command = [sys.executable, "-c", _CHILD, request]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(
            f"cold compile exited with {done.returncode}: {lines[-1] if lines else ''}"
        )
    return FirstCall(**json.loads(done.stdout.strip().splitlines()[-1]))


def cold_child(request: str) -> None:
    """The child's side of :func:`cold_first_call`: one first call, printed as JSON."""
    spec = json.loads(request)
    torch.set_num_threads(spec.pop("threads"))
    make_fn, wrap, args, backward = FirstCallCase(**spec).build()
    # Imports and a process's one-time compile work are not what is compared: every path
    # gets Dynamo and Inductor loaded and one small compile of its own beforehand.
    from fxviews.passes.torch_internals import compile_fx

    del compile_fx  # imported for its import's sake
    first_call(_warm_up_function, wrap, (torch.randn(4, 3),))
    print(json.dumps(dataclasses.asdict(first_call(make_fn, wrap, args, backward))), flush=True)


def _warm_up_function() -> Callable[..., Any]:
    """A small function unlike the measured ones, for a child's warm-up compile."""

    def warm_up(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    return warm_up


def first_call_samples(
    cases: Mapping[str, FirstCallCase], settings: Settings
) -> dict[str, tuple[list[FirstCall], str]]:
    """First calls of each case, the cases alternating: per case the samples and a note.

    Cold (``settings.cold_compiles`` children per case) in the full run; in this process
    after one warm-up in ``--quick``. A case that raises gets no more samples and an
    ``n/a (error: ...)`` note, the others go on.
    """
    from fxviews.passes.torch_internals import reset_dynamo

    cold = settings.cold_compiles > 0
    threads = torch.get_num_threads()
    built = {name: case.build() for name, case in cases.items()} if not cold else {}
    samples: dict[str, list[FirstCall]] = {name: [] for name in cases}
    notes = dict.fromkeys(cases, "")

    def sample(name: str) -> float:
        if cold:
            call = cold_first_call(cases[name], threads)
        else:
            call = first_call(*built[name][:3], backward=built[name][3])
        samples[name].append(call)
        return call.wall_s

    try:
        if not cold:  # imports, lazy initialisation and Dynamo's own first-time costs
            for name in cases:
                notes[name] = measured(functools.partial(sample, name))[1]
                samples[name].clear()
        for _ in range(settings.cold_compiles if cold else settings.compile_repeats):
            for name in cases:
                if not notes[name]:
                    notes[name] = measured(functools.partial(sample, name))[1]
    finally:
        reset_dynamo()
    return {name: (samples[name] if not notes[name] else [], notes[name]) for name in cases}


#: How a note starts when the path it measures raised: the run then exits with status 1.
FAILED = "n/a (error: "


def measured(measure: Callable[[], float]) -> tuple[float | None, str]:
    """``(measure(), "")``, or ``(None, "n/a (error: ...)")`` when the path measured fails here.

    A path that raises (a backend bug, a missing feature of this torch) becomes an ``n/a``
    cell with the reason and the other rows still run, but the run fails (see :func:`run`).
    """
    try:
        return measure(), ""
    except Exception as err:  # noqa: BLE001 - reported in its cell, and fails the run
        return None, f"{FAILED}{type(err).__name__}: {first_line(err)}"[:118] + ")"


def failed_paths(tables: dict[str, Table]) -> list[str]:
    """``"row: note"`` for every line whose measured path raised."""
    return [
        f"{row}: {line['note']}"
        for row, table in tables.items()
        for line in table
        if FAILED in str(line.get("note", ""))
    ]


def fmt_seconds(seconds: float | None) -> str:
    """A time with a unit a reader compares at a glance (differences may be negative)."""
    if seconds is None:
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:,.0f}x" if abs(ratio) >= 1000 else f"{ratio:.3g}x"  # 1,510x, not 1.51e+03x


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def above(seconds: float | None, floor: float | None) -> float | None:
    """``seconds - floor``: what a call costs above a floor both include (None if unknown)."""
    return None if seconds is None or floor is None else seconds - floor


def rewritten(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` rewritten (dead nodes included): what ``transform`` runs."""
    return fxviews.rewrite(gm).graph_module


def transform_or_reason() -> tuple[Callable[..., Any] | None, str]:
    """``fxviews.transform`` if this install has it, else why not (for ``n/a`` cells)."""
    transform = getattr(fxviews, "transform", None)
    return (transform, "") if transform is not None else (None, "n/a (fxviews.transform missing)")


# --- rows -------------------------------------------------------------------------------------


def bench_vmap(settings: Settings) -> Table:
    """Row 1: ways to evaluate ``push_jvp`` on a batch of B samples (batch dim 0, stacked).

    "graph" is the rewritten graph of ``push_jvp``, returning its pair of pairs as the
    transform does (row 5 sets it beside the same graph returning a flat list).

    The last column, the work above vmap's floor, is a difference of differences of tens of
    microseconds: timings are the minimum CPU time over interleaved repeats
    (:func:`min_cpu_seconds`), as in rows 4 and 5, not wall-clock medians.
    """
    graph = rewritten(fxviews.trace(push_jvp, *seed_args()))
    transform, why = transform_or_reason()
    table = []
    for batch in settings.batch_sizes:
        samples, batched = seed_batch(batch)
        # Every vmap is built once, outside the timer: the rows compare running, not wrapping.
        calls = {
            "loop": functools.partial(_per_sample, push_jvp, samples),
            "eager_vmap": functools.partial(torch.func.vmap(push_jvp), *batched),
            # The generated forward, as transform calls its graph (no nn.Module.__call__).
            "graph_vmap": functools.partial(torch.func.vmap(graph.forward), *batched),
            # vmap's own cost: a function that computes nothing and returns push_jvp's pytree.
            "vmap_floor": functools.partial(torch.func.vmap(_returns_inputs), *batched),
        }
        if transform is not None:
            calls["transform_vmap"] = functools.partial(
                torch.func.vmap(transform(push_jvp)), *batched
            )
            # Traced before the timer sizes its loop: sized on the trace, the loop ran a few
            # calls per repeat, and the row measured the first calls after it.
            calls["transform_vmap"]()
        times: dict[str, float | None] = {"transform_vmap": None}
        times.update(steady_cpu_seconds(calls, settings))
        table.append(
            {
                "B": batch,
                **{
                    f"{k}_s": times[k]
                    for k in ("loop", "eager_vmap", "graph_vmap", "transform_vmap", "vmap_floor")
                },
                "loop/graph": ratio(times["loop"], times["graph_vmap"]),
                "loop/floor": ratio(times["loop"], times["vmap_floor"]),
                "eager_vmap/graph": ratio(times["eager_vmap"], times["graph_vmap"]),
                "transform/graph": ratio(times["transform_vmap"], times["graph_vmap"]),
                # The work each does above vmap's own cost.
                "eager/tf_over_floor": ratio(
                    above(times["eager_vmap"], times["vmap_floor"]),
                    above(times["transform_vmap"], times["vmap_floor"]),
                ),
                "note": why,
            }
        )
    return table


def _returns_inputs(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
    return (x, y), (yt, x)


def _per_sample(fn: Callable[..., Any], samples: Sequence[tuple[torch.Tensor, ...]]) -> list[Any]:
    """``fn`` run on each sample in a Python loop: what vmap replaces."""
    return [fn(*sample) for sample in samples]


def bench_graph(settings: Settings) -> Table:
    """Row 2: rewritten vs original graph, called directly on the same contiguous inputs."""
    table = []
    for shape in ((2, 6), (256, 4096)):
        args = seed_args(shape)
        original = fxviews.trace(push_jvp, *args)
        graph = rewritten(original)
        times = median_seconds(
            {
                "original": functools.partial(original, *args),
                "rewritten": functools.partial(graph, *args),
            },
            settings.repeats,
            settings.min_repeat_seconds,
        )
        t_original, t_rewritten = times["original"], times["rewritten"]
        table.append(
            {
                "shape": "x".join(map(str, shape)),
                "nodes_original": len(original.graph.nodes),
                "nodes_rewritten": len(graph.graph.nodes),
                "original_s": t_original,
                "rewritten_s": t_rewritten,
                "rewritten/original": ratio(t_rewritten, t_original),
            }
        )
    return table


def bench_first_call(settings: Settings) -> Table:
    """Row 3: cost of the first call (trace/compile + one run) on a fresh function."""
    args = seed_args()
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


def bench_pass_cost(settings: Settings) -> Table:
    """Row 4: the pass's time per node and as a fraction of the make_fx trace it follows.

    The pass is ``fxviews.rewrite``: its one copy of the graph, engine, reshape step, pinning,
    hygiene and one code generation. Graphs: ``many_views`` at each size of the settings, and
    the as_strided-dense ``dense_views`` graph. Both are single-threaded Python, timed in CPU
    time (``time.process_time``, which leaves out waiting for a core on a loaded machine), each
    the minimum over its repeats.
    """

    def args_for(blocks: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(blocks, 4, 4) for _ in range(3))

    # Calibrate blocks-per-node on a small graph: the node count is linear in the blocks.
    probe = fxviews.trace(many_views(8), *args_for(8))
    nodes_per_block = len(probe.graph.nodes) / 8
    graphs = []
    for target in settings.graph_nodes:
        blocks = max(1, round(target / nodes_per_block))
        graphs.append(("many_views", many_views(blocks), args_for(blocks), target))
    if settings.dense_views:
        dense_args = tuple(torch.randn(8, 8) for _ in range(3))
        graphs.append(("dense_views", dense_views(settings.dense_views), dense_args, 0))
    table = []
    for name, fn, args, target in graphs:
        table.append(_pass_cost_of(name, fn, args, target >= 100_000, settings))
        gc.collect()  # the graphs just measured are garbage the next ones should not scan
    return table


def _pass_cost_of(
    name: str, fn: Callable[..., Any], args: Sequence[Any], big: bool, settings: Settings
) -> dict[str, Any]:
    """Row 4's line for one graph: ``fn`` traced on ``args`` and rewritten, in CPU time."""
    # A trace takes seconds (a 100k-node one minutes): as few repeats as compiles get, one at
    # 100k nodes. The pass is ~10x cheaper: more repeats, fewer at 100k nodes. rewrite leaves
    # gm as it was, so every repeat starts from the same graph.
    traces = []
    for _ in range(1 if big else settings.compile_repeats):
        start = time.process_time()
        gm = fxviews.trace(fn, *args)
        traces.append(time.process_time() - start)
    t_trace = min(traces)
    samples = []
    for _ in range(settings.big_graph_repeats if big else settings.repeats):
        start = time.process_time()
        result = fxviews.rewrite(gm)
        samples.append(time.process_time() - start)
    records = result.records  # the same in every repeat: the pass is deterministic
    t_pass = min(samples)
    nodes = len(gm.graph.nodes)
    return {
        "graph": name,
        "nodes": nodes,
        "as_strided": len(records),
        "rewritten": sum(r.method != "kept" for r in records),
        "trace_s": t_trace,
        "pass_s": t_pass,
        "pass_us_per_node": t_pass / nodes * 1e6,
        "pass/trace": ratio(t_pass, t_trace),
    }


#: Row 5's batch size under vmap.
OVERHEAD_BATCH = 256


def bench_overhead(settings: Settings) -> Table:
    """Row 5: what a cached ``transform`` call adds to its graph's, without and under vmap.

    Three calls side by side: the transformed function; the generated ``forward`` of its graph
    returning ``push_jvp``'s own output tree, a pair of pairs (the fair baseline: the work
    ``fn``'s contract asks of any implementation); the same graph returning its four tensors as
    a flat list (the transform's cached graph does, and rebuilds the tree). Under vmap the
    difference of the two graphs is what vmap charges for unwrapping a nested output; what
    fxviews adds is the transform over the tree graph. Each is a ``forward`` called directly,
    as the transform calls its graph (``nn.Module.__call__`` would add its own overhead).

    The differences are microseconds: timings are the minimum CPU time over many short
    interleaved repeats (:func:`min_cpu_seconds`), not medians.
    """
    transform, why = transform_or_reason()
    args = seed_args()
    graph = rewritten(fxviews.trace(push_jvp, *args))
    flat_graph = rewritten(fxviews.trace(_flat_push_jvp, *args))
    _, batched = seed_batch(OVERHEAD_BATCH)
    cases = {
        "direct": (lambda fn: fn, args),
        f"vmap, B={OVERHEAD_BATCH}": (torch.func.vmap, batched),
    }
    tf = transform(push_jvp) if transform is not None else None
    table = []
    for case, (wrap, case_args) in cases.items():
        calls = {
            "graph": functools.partial(wrap(graph.forward), *case_args),
            "flat_graph": functools.partial(wrap(flat_graph.forward), *case_args),
        }
        if tf is not None:
            calls["tf"] = functools.partial(wrap(tf), *case_args)
            calls["tf"]()  # fills the cache: what follows is the steady state
        times: dict[str, float | None] = {"tf": None}
        times.update(
            min_cpu_seconds(calls, settings.repeats * 15, settings.min_repeat_seconds / 10)
        )
        table.append(
            {
                "call": case,
                "tf_s": times["tf"],
                "graph_s": times["graph"],
                "flat_graph_s": times["flat_graph"],
                "overhead_s": above(times["tf"], times["graph"]),
                "overhead_flat_s": above(times["tf"], times["flat_graph"]),
                "tree_cost_s": above(times["graph"], times["flat_graph"]),
                "tf/graph": ratio(times["tf"], times["graph"]),
                "note": why,
            }
        )
    return table


def _flat_push_jvp(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> list[torch.Tensor]:
    """``push_jvp``'s four tensors as one flat list: its graph, with the output the transform's
    cached graph returns."""
    (view, base), (view_tangent, base_tangent) = push_jvp(x, y, yt)
    return [view, base, view_tangent, base_tangent]


#: Row 6's functions: how to make a fresh one, and whether the first call also runs backward.
COMPILE_FUNCTIONS: dict[str, tuple[Callable[[], Callable[..., Any]], bool]] = {
    "push_jvp (forward)": (make_push_jvp, False),
    "jvp_loss (+backward)": (make_jvp_loss, True),
}


def bench_compile(settings: Settings) -> Table:
    """Row 6: first-call time of backend="fxviews" vs aot_eager, forward only and trained.

    CPU time is what the ratio compares (see Note [Cold compiles]); ``engine`` is the CPU time
    inside fxviews' rewrite steps during the fxviews compile (part of its CPU time).
    """
    if getattr(fxviews, "backend", None) is None:
        return [{"function": "all", "note": "n/a (fxviews.backend missing)"}]
    table = []
    for function in COMPILE_FUNCTIONS:
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


#: The ``torch.compile`` paths of row 7: how each wraps ``vmap(push_jvp)``, and whether it runs
#: Inductor (left out of ``--quick``: a cold Inductor compile takes seconds).
COMPILED_PATHS: dict[str, tuple[dict[str, Any], bool]] = {
    "inductor": ({}, True),
    "aot_eager": ({"backend": "aot_eager"}, False),
    "fxviews (eager)": ({"backend": "fxviews"}, False),
    "fxviews (inductor)": ({"backend": "fxviews", "options": {"inner": "inductor"}}, True),
}

#: Batch size of row 7.
COMPILED_BATCH = 256


def own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function calling ``fn`` through a code object of its own.

    Dynamo keeps compiled entries per code object: compiled paths that all wrapped ``vmap``'s
    one wrapper would share a cache, and each call would check the other paths' guards first.
    """

    def call(*args: Any) -> Any:
        return fn(*args)

    code = call.__code__.replace(co_name=name.replace(" ", "_").strip("()"))
    return types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def compiled_vmap(name: str, options: dict[str, Any]) -> Wrap:
    """How path ``name`` wraps a function: ``torch.compile(vmap(fn), **options)``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(own_code(torch.func.vmap(fn), name), **options)

    return wrap


#: Row 7's base path, against which the compiled ones are compared.
TRANSFORM_PATH = "vmap(transform)"


def compiled_path_wrap(name: str) -> Wrap:
    """How row 7's path ``name`` wraps a function (the base, or one of COMPILED_PATHS)."""
    if name == TRANSFORM_PATH:
        transform = cast(Callable[..., Any], fxviews.transform)
        return lambda fn: torch.func.vmap(transform(fn))
    return compiled_vmap(name, COMPILED_PATHS[name][0])


def bench_compiled(settings: Settings) -> Table:
    """Row 7: ``vmap(push_jvp)`` compiled, against ``vmap(fxviews.transform(push_jvp))``.

    Steady state: every path compiled once, then timed side by side (minimum CPU time, which
    the first calls' CPU time and the break-even are compared with). First call: a fresh
    function, Dynamo reset, compile caches off, in a fresh interpreter in the full run (see
    Note [Cold compiles]); its CPU time is what the ratios and the break-even compare.
    Break-even: the number of calls ``n`` after which ``first + (n - 1) * steady`` of the
    compiled path drops below the transform's.
    """
    from fxviews.passes.torch_internals import reset_dynamo

    transform, why = transform_or_reason()
    _, batched = seed_batch(COMPILED_BATCH)
    names = [TRANSFORM_PATH] if transform is not None else []
    names += [
        n for n, (_, inductor) in COMPILED_PATHS.items() if settings.default_backend or not inductor
    ]
    first = first_call_samples({n: FirstCallCase("compiled", n) for n in names}, settings)
    try:
        ready: dict[str, Callable[[], Any]] = {}
        for name in names:
            if first[name][0]:
                ready[name] = functools.partial(compiled_path_wrap(name)(make_push_jvp()), *batched)
                ready[name]()  # compiles (caches on): the steady state follows
        steady: dict[str, float | None] = dict(steady_cpu_seconds(ready, settings))
    finally:
        reset_dynamo()
    cpu = {name: median_of(calls, "cpu_s") for name, (calls, _) in first.items()}
    inductor = (cpu.get("inductor"), steady.get("inductor"))
    table = []
    for name in [*names, *(p for p in COMPILED_PATHS if p not in names)]:
        calls, note = first.get(name, ([], "n/a (--quick)"))
        note = note or (why if name == TRANSFORM_PATH else "")
        base = name == TRANSFORM_PATH
        table.append(
            {
                "path": name,
                "steady_s": steady.get(name),
                "first_call_s": median_of(calls, "wall_s"),
                "first_cpu_s": cpu.get(name),
                "engine_s": median_of(calls, "engine_s") or None,
                "break_even": "(base)"
                if base
                else break_even(
                    cpu.get(name),
                    steady.get(name),
                    cpu.get(TRANSFORM_PATH),
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
}


# --- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser`` (a subparser of ``python -m fxviews``)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats, no 100k-node graph, no Inductor: under a minute",
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
            bench_plots.require_matplotlib()  # before minutes of measuring, not after
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
        for path in bench_plots.write_charts(tables, args.plot):
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


def render(table: Table) -> str:
    """A tabulate table: ``*_s`` columns as times, ratio columns (``a/b``) as ``Nx``."""

    def cell(key: str, value: Any) -> Any:
        if key.endswith("_s"):
            return fmt_seconds(value)
        if "/" in key or key.startswith("vs_"):
            return fmt_ratio(value)
        if isinstance(value, float):
            return f"{value:.3g}"
        return value

    # Columns with nothing to say in any line (an empty note) are left out of the printout.
    keys = [k for k in table[0] if any(line[k] not in ("", None) for line in table)]
    headers = [header(k) for k in keys]
    return tabulate([[cell(k, line[k]) for k in keys] for line in table], headers=headers)


def header(key: str) -> str:
    """A column's printed header: within ~100 columns a table of ten keeps its names whole.

    Times carry their unit in each cell, so ``_s`` goes; a long ratio ``a/b`` is printed over two
    lines, ``a/`` above ``b``.

    Example::

        >>> header("eager_vmap/graph")
        'eager_vmap/\ngraph'
    """
    key = SHORT_HEADERS.get(key, key).removesuffix("_s")
    if "/" in key and len(key) > 7 and "\n" not in key:
        numerator, denominator = key.split("/", 1)
        return f"{numerator}/\n{denominator}"
    return key


#: Printed names of row 1's and row 5's columns (their JSON keys stay as they are).
SHORT_HEADERS = {
    "eager_vmap_s": "eager",
    "graph_vmap_s": "graph",
    "transform_vmap_s": "tf",
    "vmap_floor_s": "floor",
    "eager_vmap/graph": "eager/graph",
    "transform/graph": "tf/graph",
    "eager/tf_over_floor": "eager/tf\nover floor",
    "flat_graph_s": "flat graph",
    "overhead_s": "tf - graph",
    "overhead_flat_s": "tf - flat\ngraph",
    "tree_cost_s": "graph - flat\ngraph",
}
#: Printed names of rows 6 and 7's first-call columns: the wall and CPU time of one compile.
SHORT_HEADERS.update(
    {
        "aot_eager_s": "aot_eager\nwall",
        "fxviews_s": "fxviews\nwall",
        "aot_eager_cpu_s": "aot_eager\ncpu",
        "fxviews_cpu_s": "fxviews\ncpu",
        "fxviews/aot_eager": "fxviews/\naot_eager\n(cpu)",
        "cpu_range": "range\n(cpu)",
        "first_cpu_s": "first\ncpu",
        "first/inductor": "first/\ninductor\n(cpu)",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxviews.bench [options]``: the bench command on its own."""
    parser = argparse.ArgumentParser(prog="fxviews bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
