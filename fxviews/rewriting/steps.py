"""Rewriting a GraphModule: the engine and the steps after it, on a copy or in place.

:func:`fxviews.rewrite` (:mod:`fxviews.rewriting`) calls :func:`rewrite_graph` for a GraphModule;
the export consumer (:mod:`fxviews.consumers.export`) calls it on an exported program's graph;
``transform`` and the compile backend, which own their graphs, call :func:`rewrite_in_place`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxviews.passes import (
    AsStridedToViews,
    LayoutPinning,
    Opset,
    OverwrittenClones,
    Record,
    RecordedPassResult,
    UnfoldCopies,
    ViewToReshape,
    drop_redundant_aliases,
    remove_dead_pure_nodes,
)
from fxviews.passes.chains.opsets import as_opset
from fxviews.passes.compat.torch_internals import LazyGraphModule
from fxviews.passes.graph_edits import collector_paused, copy_graph, describe_call
from fxviews.passes.rewrites.as_strided_to_views import credit_engine, engine_made_nodes
from fxviews.passes.rewrites.vmap_guards import guard_kept_nodes
from fxviews.passes.runtime.bound_calls import bind_calls, bind_constants
from fxviews.passes.runtime.constant_folding import fold_input_free_results
from fxviews.passes.schema import AUTOGRAD_KEPT, LAYOUT_DECISION, TRACED_WITH, RecordKind
from fxviews.passes.source_lines import source_line
from fxviews.rewriting.printouts import debug_enabled, format_result, format_summary

aten = torch.ops.aten


@dataclass
class RewriteResult:
    """The outcome of :func:`fxviews.rewrite`.

    ``graph_module`` is a new GraphModule (the input is never mutated); ``records`` holds one
    :class:`~fxviews.passes.Record` per as_strided node seen; ``view_records`` one per
    layout-bound view (``view``, ``_unsafe_view``, ``_reshape_alias``, ``view_as_complex``)
    that the reshape step saw, method ``"reshape"`` or ``"kept"``; ``pin_records`` one per
    layout-bound node the pinning step saw, method ``"pinned"`` or ``"kept"``; ``clone_records``
    one per clone a ``copy_`` overwrites, method ``"reclone"`` or ``"kept"``
    (:class:`fxviews.passes.OverwrittenClones`); ``unfold_records`` one per ``unfold`` node
    when the rewrite copies them (``copy_unfolds=True``), method ``"copied"`` or ``"kept"``
    (:class:`fxviews.passes.UnfoldCopies`); ``modified`` says whether the graph changed.
    ``print(result)`` shows the graph-diff printout.
    """

    graph_module: torch.fx.GraphModule
    records: list[Record]
    modified: bool
    code_before: str
    seconds: float = 0.0
    view_records: list[Record] = field(default_factory=list)
    pin_records: list[Record] = field(default_factory=list)
    clone_records: list[Record] = field(default_factory=list)
    unfold_records: list[Record] = field(default_factory=list)
    #: How the graph was traced, when fxviews traced it (``"fake mode"``, ``"recorded on a
    #: sample"`` or ``"real mode (fake mode failed: ...)"``); None for graphs made elsewhere.
    traced_with: str | None = None
    #: What the trace kept of the function's autograd structure (grad-mode switches, custom
    #: autograd.Functions kept as one node), one line each with the user's source line (Note
    #: [What autograd sees is part of the trace]); empty for graphs made elsewhere.
    autograd_kept: tuple[str, ...] = ()

    @property
    def code_after(self) -> str:
        return self.graph_module.code

    def __repr__(self) -> str:
        # What a REPL shows: the summary line, not a dataclass dump of graphs and code.
        return f"<RewriteResult {format_summary(self)}; print() it for the table and diff>"

    def __str__(self) -> str:
        return format_result(self)


@dataclass(frozen=True)
class RewriteSteps:
    """What a rewrite emits: the opset of its chains, whether the layout steps run, and
    whether the model's own ``unfold`` nodes become copies (for an opset without ``unfold``).

    ``guard_kept=True`` puts a run-time guard before each kept node that bakes strides (Note
    [Kept nodes under vmap]): for graphs fxviews runs itself, where a guard is a Python call.
    ``tidy_untouched=False`` leaves a graph the steps did not change exactly as it was (no dead
    code or redundant alias removed): an exported program without as_strided then reaches its
    compiler unchanged. ``against_eager_layouts=True`` proves an as_strided whose input's traced
    layout is not eager's against eager's layout instead of keeping it (for graphs another
    compiler runs, which may lay that input out either way; see AsStridedToViews).
    ``bind_calls=True`` calls each op through its Python binding where that is the same call
    (Note [Calling ops through their Python bindings]): for graphs fxviews only runs, never for
    one another compiler reads. ``leave`` names as_strided nodes the engine leaves to a later
    stage (the backend's first stage leaves those of symbolic sizes to AOTAutograd's graphs).

    Example::

        >>> RewriteSteps.of("core_aten", None, None)
        RewriteSteps(opset=<Opset.CORE_ATEN: 'core_aten'>, reshape_views=False, ...)
    """

    opset: Opset = Opset.ATEN
    reshape_views: bool = True
    pin_layouts: bool = True
    tidy_untouched: bool = True
    guard_kept: bool = False
    copy_unfolds: bool = False
    against_eager_layouts: bool = False
    bind_calls: bool = False
    leave: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        opset: Opset | str,
        reshape_views: bool | None,
        pin_layouts: bool | None,
        copy_unfolds: bool = False,
    ) -> RewriteSteps:
        """The steps :func:`fxviews.rewrite`'s arguments ask for (None: the opset's default);
        a ValueError for a layout step asked of a core-ATen rewrite (they emit ``reshape`` and
        ``new_*``, which core ATen lacks, and serve vmap, which edge programs never see), and
        for copied unfolds asked of an opset that has ``unfold``."""
        opset = as_opset(opset)
        if copy_unfolds and opset.has(aten.unfold.default):
            raise ValueError(
                f"copy_unfolds=True is for an opset without unfold; {opset.value!r} has it, so "
                "the model's unfold stays a view there"
            )
        layout_steps = opset is Opset.ATEN
        for name, asked in (("reshape_views", reshape_views), ("pin_layouts", pin_layouts)):
            if asked and not layout_steps:
                raise ValueError(
                    f"{name}=True emits ops outside the {opset.value} opset; it serves vmap of "
                    "batched layouts, which an edge program never sees: leave it out"
                )
        return cls(
            opset,
            layout_steps if reshape_views is None else reshape_views,
            layout_steps if pin_layouts is None else pin_layouts,
            copy_unfolds=copy_unfolds,
        )


def rewrite_graph(
    gm: torch.fx.GraphModule,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
    steps: RewriteSteps = RewriteSteps(),  # noqa: B008 - frozen: one shared default is safe
) -> RewriteResult:
    """Rewrite every provably safe ``as_strided`` of ``gm`` into view ops, on a copy.

    What :func:`fxviews.rewrite` does for a GraphModule (the options are documented there);
    ``gm`` itself is never modified.

    Example::

        >>> res = rewrite_graph(fxviews.trace(push_jvp, x, y, yt))
        >>> [r.method for r in res.records]
        ['provenance']
    """
    start = time.perf_counter()
    # The steps rewrite a copy of the graph, in a lazy module that generates no code; the module
    # returned is built over it once they are done: one copy and one code generation in all.
    # The caller's graph stays as it was, while parameters, buffers and tensor constants stay
    # shared (gradients still reach them).
    # FX's code generation, like the copy and the steps, runs with the cyclic collector paused
    # (Note [Graph edits and the cyclic collector]): on a 100k-node graph its full collections
    # made code generation grow faster than the graph.
    with collector_paused():
        work = LazyGraphModule(gm, copy_graph(gm.graph))
        work.meta = dict(gm.meta)
        result = _rewrite_steps(work, gm.code, strict, example_inputs, steps)
        own = torch.fx.GraphModule(work, work.graph, class_name=type(gm).__name__)
    own.meta = work.meta
    result.graph_module = own
    result.seconds = time.perf_counter() - start
    return result


def rewrite_in_place(
    gm: torch.fx.GraphModule,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
    reshape_views: bool = True,
    pin_layouts: bool = True,
    guard_kept: bool = True,
    against_eager_layouts: bool = False,
    bind_calls: bool = False,
    fx_code: bool = True,
    leave: frozenset[str] = frozenset(),
) -> RewriteResult:
    """:func:`rewrite_graph` for a caller that owns ``gm`` (transform, backend): no copy is made.

    ``guard_kept`` puts the run-time guards of kept nodes in the graph (a Python call each, see
    :class:`RewriteSteps`): False where the graph goes on to another compiler (the backend);
    ``bind_calls`` calls its ops through their Python bindings (transform, which only runs it).

    ``gm`` itself is rewritten and becomes ``result.graph_module``, its code generated: the
    callers run it next (a lazy module, such as a recorded trace, would otherwise answer each
    call through a stub). ``fx_code=False`` leaves a lazy module's FX code to whatever reads
    it first, for a caller that runs the graph through code of its own
    (:func:`fxviews.calls.graph_code.run_only_forward`). ``result.code_before`` is kept only where
    a printout may show it (``FXVIEWS_DEBUG=1``), else empty: generating a large graph's code
    costs as much as a third of the rewrite, and a lazy ``gm`` then generates it once, after
    the rewrite.

    Example::

        >>> gm = fxviews.trace(push_jvp, x, y, yt)
        >>> rewrite_in_place(gm).graph_module is gm
        True
    """
    steps = RewriteSteps(
        reshape_views=reshape_views,
        pin_layouts=pin_layouts,
        guard_kept=guard_kept,
        against_eager_layouts=against_eager_layouts,
        bind_calls=bind_calls,
        leave=leave,
    )
    with collector_paused():  # as in rewrite_graph
        code_before = gm.code if debug_enabled() else ""
        result = _rewrite_steps(gm, code_before, strict, example_inputs, steps)
        if fx_code:
            LazyGraphModule.force_recompile(gm)
        return result


def _rewrite_steps(
    gm: torch.fx.GraphModule,
    code_before: str,
    strict: bool,
    example_inputs: Sequence[Any] | None,
    steps: RewriteSteps,
) -> RewriteResult:
    """Run the engine and the later steps on ``gm`` in place; ``code_before`` is its code now."""
    start = time.perf_counter()
    decided = decision_records(gm.graph)  # what the trace kept deciding at run time
    # Each step edits the graph; the module is recompiled once, after the last one.
    engine = AsStridedToViews(
        strict=strict,
        example_inputs=example_inputs,
        recompile=False,
        opset=steps.opset,
        against_eager_layouts=steps.against_eager_layouts,
        leave=steps.leave,
    )(gm)
    made = engine_made_nodes(gm.graph)  # before the reshape step replaces any of them
    skipped = RecordedPassResult(gm, False)  # a step not asked for: no change, no records
    # After the engine: an as_strided it rewrote no longer reads the unfold's memory.
    unfolds = UnfoldCopies(recompile=False)(gm) if steps.copy_unfolds else skipped
    reshaped = ViewToReshape(recompile=False)(gm) if steps.reshape_views else skipped
    pinned = LayoutPinning(recompile=False)(gm) if steps.pin_layouts else skipped
    modified = engine.modified or unfolds.modified or reshaped.modified or pinned.modified
    reclones = skipped
    if modified or steps.tidy_untouched:
        modified = remove_dead_pure_nodes(gm, recompile=False) or modified
        modified = drop_redundant_aliases(gm, recompile=False) or modified
        # After pinning (a clone it pins, contiguous_format, has one layout from any source) and
        # after the dead metadata checks are gone (one reading strides would keep every clone).
        reclones = OverwrittenClones(recompile=False)(gm)
        if reclones.modified:  # the overwritten clone's old input may have no reader left
            remove_dead_pure_nodes(gm, recompile=False)
            modified = True
    # Last: a guard is a Python call, which the alias analysis of every step would find opaque.
    guarded = guard_kept_nodes(gm, pinned.records) if steps.guard_kept else {}
    tuned = 0
    if steps.bind_calls:  # a graph only run (Note [Results that depend on no input] and
        # [Calling ops through their Python bindings]): constants first, then bindings of
        # the aten overloads every step reads. Each is checked op by op against the graph
        # before it (tests/test_opinfo_steps.py, which fails where a step here is not its own)
        tuned = fold_input_free_results(gm) + bind_calls(gm)
        bind_constants(gm)
    modified = modified or bool(guarded) or bool(tuned)
    if modified:
        gm.recompile()
    return RewriteResult(
        graph_module=gm,
        records=engine.records,
        modified=modified,
        code_before=code_before,
        seconds=time.perf_counter() - start,
        view_records=[*decided, *credit_engine(reshaped.records, made)],
        pin_records=credit_engine(_note_guards(pinned.records, guarded), made),
        clone_records=reclones.records,
        unfold_records=unfolds.records,
        traced_with=gm.meta.get(TRACED_WITH),
        autograd_kept=gm.meta.get(AUTOGRAD_KEPT, ()),
    )


def _note_guards(records: list[Record], guarded: dict[str, str]) -> list[Record]:
    """``records``, saying what the guard of each guarded kept node does."""
    return [
        dataclasses.replace(r, reason=f"{r.reason}; {guarded[r.node]}") if r.node in guarded else r
        for r in records
    ]


def decided_nodes(graph: torch.fx.Graph) -> Iterator[torch.fx.Node]:
    """The composite nodes :class:`LayoutDecisions` recorded in ``graph``."""
    return (node for node in graph.nodes if LAYOUT_DECISION in node.meta)


def decision_records(graph: torch.fx.Graph) -> list[Record]:
    """One record per layout-deciding call kept as its aten op: what the traced layout made
    (``before``) and the node that decides when the graph runs (``after``).

    Example::

        >>> [r.method for r in decision_records(fxviews.trace(lambda x: x.flatten(), x).graph)]
        ['runtime']
    """
    records = []
    for node in decided_nodes(graph):
        kind, traced = node.meta[LAYOUT_DECISION]
        records.append(
            Record(
                node.name,
                traced,
                describe_call(node.target, node.args, node.kwargs),
                "runtime",
                f"decides view or copy on the layout each call has, as eager does (on the traced "
                f"layout: {kind})",
                kind=RecordKind.VIEW,
                source=source_line(node),
            )
        )
    return records
