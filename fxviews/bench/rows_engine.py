"""Row 4: what the engine costs against the size of the graph and the trace it follows."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import fxviews
from fxviews.bench.output import progress
from fxviews.bench.report import ratio
from fxviews.bench.settings import Settings, Table
from fxviews.bench.workloads import dense_views, many_views


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
        progress.step(f"{name}, ~{target:,} nodes" if target else name)
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
