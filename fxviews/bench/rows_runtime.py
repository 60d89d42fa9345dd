"""Rows 1, 2 and 5: running the rewritten graph, with and without vmap, and a cached call."""

from __future__ import annotations

import functools

import torch

import fxviews
from fxviews.bench.report import above, ratio
from fxviews.bench.settings import LOOP_LIMIT, Settings, Table
from fxviews.bench.timing import median_seconds, min_cpu_seconds, steady_seconds
from fxviews.bench.workloads import (
    flat_push_jvp,
    on,
    per_sample,
    returns_inputs,
    rewritten,
    seed_batch,
    transform_or_reason,
)
from fxviews.examples import push_jvp, seed_args


def bench_vmap(settings: Settings) -> Table:
    """Row 1: ways to evaluate ``push_jvp`` on a batch of B samples (batch dim 0, stacked).

    "graph" is the rewritten graph of ``push_jvp``, returning its pair of pairs as the
    transform does (row 5 sets it beside the same graph returning a flat list).

    The last column, the work above vmap's floor, is a difference of differences of tens of
    microseconds: timings are the minimum CPU time over interleaved repeats
    (:func:`min_cpu_seconds`), as in rows 4 and 5, not wall-clock medians. On a device
    (``--device``) they are synchronised wall-clock medians (:func:`steady_seconds`), and the
    loop runs up to ``LOOP_LIMIT`` samples.
    """
    graph = rewritten(fxviews.trace(push_jvp, *on(settings.device, seed_args())))
    transform, why = transform_or_reason()
    table = []
    for batch in settings.batch_sizes:
        samples, batched = seed_batch(batch, settings.device)
        # Every vmap is built once, outside the timer: the rows compare running, not wrapping.
        calls = {
            "loop": functools.partial(per_sample, push_jvp, samples),
            "eager_vmap": functools.partial(torch.func.vmap(push_jvp), *batched),
            # The generated forward, as transform calls its graph (no nn.Module.__call__).
            "graph_vmap": functools.partial(torch.func.vmap(graph.forward), *batched),
            # vmap's own cost: a function that computes nothing and returns push_jvp's pytree.
            "vmap_floor": functools.partial(torch.func.vmap(returns_inputs), *batched),
        }
        if transform is not None:
            calls["transform_vmap"] = functools.partial(
                torch.func.vmap(transform(push_jvp)), *batched
            )
            # Traced before the timer sizes its loop: sized on the trace, the loop ran a few
            # calls per repeat, and the row measured the first calls after it.
            calls["transform_vmap"]()
        loop_note = ""
        if settings.device is not None and batch > LOOP_LIMIT:
            del calls["loop"]
            loop_note = f"loop: n/a above {LOOP_LIMIT} samples"
        times: dict[str, float | None] = {"transform_vmap": None, "loop": None}
        times.update(steady_seconds(calls, settings))
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
                "note": "; ".join(n for n in (why, loop_note) if n),
            }
        )
    return table


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


#: Row 5's batch size under vmap.
OVERHEAD_BATCH = 256


def guarded_model() -> torch.nn.Module:
    """Row 5's model: 17 modules in eval mode, whose training flags a cached call checks."""
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1), torch.nn.ReLU())
        for _ in range(4)
    ]
    return torch.nn.Sequential(*blocks).eval()


def bench_overhead(settings: Settings) -> Table:
    """Row 5: what a cached ``transform`` call adds to its graph's, without and under vmap.

    Three calls side by side: the transformed function; the generated ``forward`` of its graph
    returning ``push_jvp``'s own output tree, a pair of pairs (the fair baseline: the work
    ``fn``'s contract asks of any implementation); the same graph returning its four tensors as
    a flat list (the transform's cached graph does, and rebuilds the tree). Under vmap the
    difference of the two graphs is what vmap charges for unwrapping a nested output; what
    fxviews adds is the transform over the tree graph. Each is a ``forward`` called directly,
    as the transform calls its graph (``nn.Module.__call__`` would add its own overhead).

    A last line calls a transformed ``nn.Module`` (:func:`guarded_model`) beside its graph:
    the cache's guard checks the process state and every module's ``training`` flag on each
    hit (Note [The state a graph bakes in]).

    The differences are microseconds: timings are the minimum CPU time over many short
    interleaved repeats (:func:`min_cpu_seconds`), not medians.
    """
    transform, why = transform_or_reason()
    args = seed_args()
    graph = rewritten(fxviews.trace(push_jvp, *args))
    flat_graph = rewritten(fxviews.trace(flat_push_jvp, *args))
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
    model, x = guarded_model(), torch.randn(8)
    calls = {"graph": functools.partial(rewritten(fxviews.trace(model, x)).forward, x)}
    if transform is not None:
        calls["tf"] = functools.partial(transform(model), x)
        calls["tf"]()
    times = {"tf": None}
    times.update(min_cpu_seconds(calls, settings.repeats * 15, settings.min_repeat_seconds / 10))
    table.append(
        {
            "call": f"{len(list(model.modules()))} modules",
            "tf_s": times["tf"],
            "graph_s": times["graph"],
            "flat_graph_s": None,
            "overhead_s": above(times["tf"], times["graph"]),
            "overhead_flat_s": None,
            "tree_cost_s": None,
            "tf/graph": ratio(times["tf"], times["graph"]),
            "note": why,
        }
    )
    return table
