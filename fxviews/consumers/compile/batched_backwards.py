"""Windows under ``vmap(grad(f))``: an as_strided whose backward vmap batches stays one, over
its input pinned to the per-sample loop's layout.

Note [Windows whose backward vmap batches]
------------------------------------------
The first stage writes overlapping windows as ``unfold``. Under ``vmap(grad(f))`` their backward
runs under vmap too, and ``unfold_backward`` has no batching rule (torch 2.13): functorch's
fallback, which AOTAutograd traces as one ``unfold_backward`` per sample. Measured (bench row
11, B=64): compiles 2-8x Inductor's and, for log-mel framing, 1.3x its run time. ``as_strided``
has a batching rule for its backward, and vmap's ``as_strided`` reads what the per-sample loop
reads wherever each sample is laid out as the loop lays it out. So for such an as_strided,
once the engine has proven its windows (a chain holding ``unfold``), the stage writes instead:

- the as_strided itself, where vmap already lays each sample out as the loop does (the batch
  dim first in memory, each sample at the loop's strides and offset): nothing to pin;
- else the as_strided of ``clone(x, memory_format=torch.contiguous_format)``, whose batching rule
  gives each sample the loop's contiguous layout at offset 0 (the request's offset moved by the
  input's own): one copy of the input, which the windows read several times over anyway.

Only where that is the loop's reading exactly: the input's per-sample layout in the loop is
contiguous, the request is static and reads only the input's own elements, and nothing in
the graph writes in place (a copy would not receive the writes a view does). Elsewhere the
chain stays, right and slower. The node's record says ``pinned`` and why.

Example::

    >>> candidates = pin_candidates(gm, values)    # vmap(grad(windows's loss)), batch dim 1
    >>> records = pin_windows(gm, candidates, result.records)
    >>> records[0].after
    "as_strided(clone(diff_args), [6, 3], [1, 1], 0)"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.fx

from fxviews.consumers.compile.dynamo_values import DynamoValues, grad_over_vmap
from fxviews.consumers.compile.write_hazards import written_nodes
from fxviews.passes.analysis.as_strided_calls import as_strided_op, bind_as_strided, static_request
from fxviews.passes.compat.torch_internals import make_contiguous_strides_for
from fxviews.passes.geometry.concrete import Geometry, equivalent, find_exposed_address
from fxviews.passes.schema import MADE_FOR, Record


@dataclass(frozen=True)
class PinCandidate:
    """An as_strided under ``vmap(grad)`` that may read a pinned input (see the Note)."""

    node: torch.fx.Node
    source: torch.fx.Node
    request: Geometry  # relative to the input's per-sample layout in the loop
    loop_layout: Geometry
    vmap_reads_alike: bool  # vmap's per-sample layout of the input is already the loop's
    users: tuple[torch.fx.Node, ...]


def pin_candidates(gm: torch.fx.GraphModule, values: DynamoValues) -> list[PinCandidate]:
    """The as_strided nodes of ``gm`` whose input is a grad-tracked per-sample value with the
    loop's contiguous layout, while ``values`` are in place (see the Note)."""
    if any(written_nodes(n) for n in gm.graph.nodes):
        return []
    candidates = []
    for node in gm.graph.nodes:
        source = bind_as_strided(node)["self"] if as_strided_op(node) is not None else None
        if not isinstance(source, torch.fx.Node) or source in values.unknown:
            continue
        loop, vmaps = source.meta.get("val"), values.physical.get(source)
        if vmaps is None or not grad_over_vmap(source.meta.get("example_value")):
            continue
        loop_layout = _static(loop)
        request = None if loop_layout is None else static_request(node, loop_layout.offset)
        if loop_layout is None or request is None or not _contiguous(loop_layout):
            continue
        if find_exposed_address(loop_layout, request) is not None:
            continue
        vmap_layout = _static(vmaps)
        alike = vmap_layout is not None and equivalent(vmap_layout, loop_layout)
        candidates.append(
            PinCandidate(node, source, request, loop_layout, alike, tuple(node.users))
        )
    return candidates


def pin_windows(
    gm: torch.fx.GraphModule, candidates: list[PinCandidate], records: list[Record]
) -> list[Record]:
    """``records``, after writing each candidate the engine made windows of (a chain with
    ``unfold``) as an as_strided of its pinned input (see the Note), in place."""
    by_name = {c.node.name: c for c in candidates}
    out = []
    for record in records:
        candidate = by_name.get(record.node)
        replacement = None if candidate is None else _chain_output(candidate)
        if candidate is None or replacement is None or "unfold(" not in record.after:
            out.append(record)
            continue
        out.append(_pin(gm.graph, candidate, replacement, record))
    if len(out) != len(records) or any(a is not b for a, b in zip(out, records, strict=True)):
        gm.recompile()
    return out


def _pin(
    graph: torch.fx.Graph, c: PinCandidate, replacement: torch.fx.Node, record: Record
) -> Record:
    r = c.request
    offset = r.offset if c.vmap_reads_alike else r.offset - c.loop_layout.offset
    with graph.inserting_before(replacement):
        pinned = c.source
        if not c.vmap_reads_alike:
            pinned = graph.call_method(
                "clone", (c.source,), {"memory_format": torch.contiguous_format}
            )
        windows = graph.call_method("as_strided", (pinned, list(r.sizes), list(r.strides), offset))
    for made in (pinned, windows):
        if made is not c.source and "stack_trace" in c.node.meta:
            made.meta["stack_trace"] = c.node.meta["stack_trace"]
    replacement.replace_all_uses_with(windows)
    for dead in reversed(list(graph.nodes)):  # the chain's nodes, now unread
        if dead.meta.get(MADE_FOR) == c.node.name and not dead.users:
            graph.erase_node(dead)
    read = c.source.name if c.vmap_reads_alike else f"clone({c.source.name})"
    why = (
        "each sample is already laid out as the per-sample loop lays it out"
        if c.vmap_reads_alike
        else "a contiguous clone lays each sample out as the per-sample loop does"
    )
    return dataclasses.replace(
        record,
        after=f"as_strided({read}, {list(r.sizes)}, {list(r.strides)}, {offset})",
        method="pinned",
        reason=(
            f"windows whose backward vmap batches ({record.after} was proven; unfold's backward "
            f"has no batching rule): vmap's as_strided reads what the loop reads, as {why}"
        ),
    )


def _chain_output(c: PinCandidate) -> torch.fx.Node | None:
    """The node the engine put where the candidate was: what its former users now read."""
    for user in c.users:
        for argument in user.all_input_nodes:
            if argument.meta.get(MADE_FOR) == c.node.name:
                return argument
    return None


def _static(value: object) -> Geometry | None:
    if not isinstance(value, torch.Tensor):
        return None
    g = Geometry.of(value)
    return g if all(type(v) is int for v in (*g.sizes, *g.strides, g.offset)) else None


def _contiguous(g: Geometry) -> bool:
    expected = make_contiguous_strides_for(g.sizes)
    return all(s <= 1 or a == b for s, a, b in zip(g.sizes, g.strides, expected, strict=True))
