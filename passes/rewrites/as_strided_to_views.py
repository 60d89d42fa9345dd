"""AsStridedToViews: replace each provably safe ``as_strided`` with the view ops it came from.

Note [AsStridedToViews]
-----------------------
Semantics: each ``as_strided(x, S, T, O)`` in a traced graph is read relative to the layout
``x`` had when the graph was traced (its ``meta["val"]``). The pass replaces it with a chain of
view ops that gives exactly that geometry *from that layout*; because view ops are defined on
logical dims, the chain then stays right when ``x`` arrives batched (vmap) or non-contiguous.

Per as_strided node, in graph order, candidates are tried in this order and the first one that
verifies wins (see ``chain_verification.verify_chain``: the chain is run on a meta tensor with the
input's exact geometry and must reproduce the target's geometry):

1. identity    - the target equals the input's geometry: an ``alias``;
2. provenance  - the graph already views a base of the input's geometry into the target's
                 geometry (``ViewIndex``): replay those ops on the input;
3. scatter     - the input is a flat buffer that a sibling as_strided restores to a dense base:
                 unflatten to that base, then provenance or synthesis relative to it;
4. synthesized - derive a chain from the two geometries (``synthesis.synthesize``); with
                 symbolic shapes, last, a chain over the flat buffer of a dense input, proven
                 where the as_strided reads inside it and asserting that at run time
                 (Note [Rewrites that assert their reads stay inside the input]);
5. rebased     - static ``as_strided``/``as_strided_copy`` only: the input does not expose
                 what the node reads, so provenance or synthesis relative to a tensor the input
                 is a view of (Note [Rewrites relative to a base] in ``exposing_bases.py``).

If none verifies, the node is kept with the reason: a witness address when it reads memory the
input does not expose (unsafe), or "no view form" when it may be safe but no view op chain
reproduces it. ``strict=True`` raises ``UnsafeAsStridedError`` instead of keeping, and is atomic:
it rewrites a copy of the graph and installs it only when no node had to be kept, so the
caller's graph is untouched when the error is raised (also inside a ``PassManager``).

Failed candidates: a chain that does not apply to the input raises a torch error (a
``RuntimeError`` or ``IndexError``) during verification, or fails to compute the new nodes'
metadata; only those are caught, and the candidate is dropped. Any other exception is a bug and
surfaces. No safety decision rests on a caught exception: dropping a candidate only ever keeps
a node.

Opset: a verified chain is written in the pass's opset and verified again before it is emitted
(Note [Chains for an opset]); a node no candidate of which can be is kept, with the reason.

Variants: ``as_strided_copy`` becomes the chain plus a contiguous ``clone``;
``as_strided_scatter`` becomes nested ``select_scatter``/``slice_scatter``/``diagonal_scatter``
(see ``scatter.py``); ``as_strided_`` restrides its input in place, so it becomes the chain
only where nothing uses its input after it (later uses would expect the new layout).

Cost: one pass to build the view index, then O(dims^2) per as_strided node: linear in the graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sympy
import torch
import torch.fx

from ..analysis.aliasing import written_arguments
from ..analysis.as_strided_calls import (
    as_strided_op,
    bind_as_strided,
    feeds_as_strided,
    requested_geometry,
)
from ..analysis.example_inputs import check_example_inputs, ensure_metadata
from ..analysis.exposing_bases import exposing_bases
from ..analysis.layout_truth import LayoutTruth, chain_for_any_layout
from ..chains.chain import ViewChain, apply_chain, describe_chain, eager
from ..chains.copied_windows import WindowsByCopies
from ..chains.emission import GraphEmitter, with_size_nodes
from ..chains.opsets import Opset, as_opset, chain_for_opset
from ..chains.provenance import ViewIndex, node_geometry
from ..chains.symbolic_synthesis import synthesize_symbolic
from ..chains.symbolic_verification import apply_symbolic, verify_symbolic_chain
from ..chains.synthesis import synthesize
from ..chains.verification import verify_chain
from ..compat.torch_internals import (
    LazyGraphModule,
    OpOverload,
    disable_current_modes,
    install_graph,
)
from ..errors import UnsafeAsStridedError
from ..geometry.concrete import Geometry, equivalent, find_exposed_address, is_one_to_one
from ..geometry.symbolic import (
    ShapeFacts,
    SymbolicGeometry,
    Unproven,
    equivalent_symbolic,
    is_one_to_one_symbolic,
)
from ..graph_edits import OutputDeferringReplacer, copy_graph, describe_call, op_name
from ..op_tables import METADATA_MUTATIONS
from ..schema import MADE_FOR, Record, RecordedPassResult, RecordKind
from ..source_lines import source_line
from .bounded_reads import InBounds, bounded_candidates, why_not_asserted
from .pass_base import RecordingPass
from .scatter import (
    base_geometries,
    base_view_step,
    build_scatter,
    has_scatter_form,
    symbolic_base_geometries,
    symbolic_base_view_step,
    views_split_one_dim,
)

aten = torch.ops.aten
log = logging.getLogger("fxviews")


@dataclass(frozen=True)
class _GraphContext:
    """What the pass knows about the graph it rewrites, built once per call."""

    graph: torch.fx.Graph
    index: ViewIndex
    replacer: OutputDeferringReplacer
    position: dict[torch.fx.Node, int]  # of the original nodes, for "used after" questions
    # Per input node, its users that change its layout in place: found once per input, since
    # one base can feed thousands of as_strided nodes (a scan per node would be quadratic).
    layout_mutators: dict[torch.fx.Node, list[torch.fx.Node]]
    opset: Opset
    functional: bool  # no node writes a tensor in place: a copy cannot be told from a view
    #: Why a node's traced input layout is not eager PyTorch's (Note [Layouts are facts to
    #: check]): such a node is kept, or proven against the eager layout (against_eager).
    layout_doubts: dict[torch.fx.Node, str]
    truth: LayoutTruth
    against_eager: bool

    def layout_mutation(self, node: torch.fx.Node, source: torch.fx.Node) -> torch.fx.Node | None:
        """A user of ``source`` other than ``node`` that changes its layout in place, or None.

        The pass adds no such user (it emits views, clones and scatters), so the users found
        once stay the only candidates; a replaced one is no longer among ``source``'s users.
        """
        if source not in self.layout_mutators:
            self.layout_mutators[source] = [
                u for u in source.users if u.target in METADATA_MUTATIONS
            ]
        return next(
            (u for u in self.layout_mutators[source] if u is not node and u in source.users),
            None,
        )


@dataclass(frozen=True)
class _Symbolic:
    """The geometries of a call whose sizes are symbolic, and what the ShapeEnv knows."""

    facts: ShapeFacts
    source: SymbolicGeometry
    target: SymbolicGeometry
    #: The condition a chain proven under it asserts at run time (see bounded_reads).
    assertion: InBounds | None = None


@dataclass(frozen=True)
class _Call:
    """An as_strided-family node, its parsed arguments and geometries.

    With symbolic shapes, ``symbolic`` holds the geometries for every size, and
    ``source_geometry``/``target`` are those at the trace-time sizes (the hints).
    """

    node: torch.fx.Node
    op: OpOverload  # the aten op, however the node spells it
    source: torch.fx.Node
    src: torch.fx.Node | None  # the values scattered, for as_strided_scatter
    source_geometry: Geometry
    target: Geometry
    symbolic: _Symbolic | None = None
    #: The node's own input, when ``source`` is a base of it that a chain reads instead.
    rebased_from: torch.fx.Node | None = None
    #: Why the input's traced layout is not eager's, when ``source_geometry`` is eager's.
    eager_layout_doubt: str | None = None

    def describe(self) -> str:
        src = [] if self.src is None else [self.src]
        t = self.target if self.symbolic is None else self.symbolic.target
        own_input = self.source if self.rebased_from is None else self.rebased_from
        args = [own_input, *src, list(t.sizes), list(t.strides), t.offset]
        return describe_call(self.op, args)

    def rebased(self, base: torch.fx.Node, geometry: Geometry) -> _Call:
        """This call read from ``base`` (of trace-time ``geometry``) instead of its input."""
        return dataclasses.replace(
            self, source=base, source_geometry=geometry, rebased_from=self.source
        )

    def verifies(self, chain: ViewChain) -> bool:
        """Whether ``chain`` gives the target from the input, at every size if symbolic."""
        if self.symbolic is None:
            return verify_chain(chain, self.source_geometry, self.target)
        sym = self.symbolic
        return verify_symbolic_chain(chain, sym.source, sym.target, sym.facts)

    def in_opset(self, chain: ViewChain, context: _GraphContext) -> tuple[ViewChain | None, str]:
        """A verified ``chain`` written in the graph's opset and verified again, or None and
        why not (see Note [Chains for an opset])."""
        return chain_for_opset(
            chain,
            self.source_geometry,
            self.target,
            context.opset,
            static=self.symbolic is None,
            verifies=self.verifies,
            copy_refusal=lambda: self.copy_refusal(context),
        )

    def copy_refusal(self, context: _GraphContext) -> str | None:
        """Why a copy may not stand in for this node's view, or None if it may."""
        if not context.functional:
            return "the graph writes tensors in place"
        if self.op not in _COPYABLE:
            return f"{op_name(self.op)} must stay a view"
        if feeds_as_strided(self.node):
            return "a later as_strided reads its memory"
        return None


class AsStridedToViews(RecordingPass):
    """A torch.fx pass rewriting as_strided nodes into verified view ops (mutates its input).

    Its result's ``records`` hold one :class:`Record` per as_strided node seen.
    ``recompile=False`` leaves ``graph_module.recompile()`` to the caller. ``leave`` names
    as_strided nodes the pass leaves as they are, unseen (no record): a later stage rewrites
    them.

    Example::

        >>> result = AsStridedToViews()(gm)   # RecordedPassResult(graph_module, modified)
        >>> [r.method for r in result.records]
        ['provenance']
    """

    def __init__(
        self,
        strict: bool = False,
        example_inputs: Sequence[Any] | None = None,
        recompile: bool = True,
        opset: Opset | str = Opset.ATEN,
        against_eager_layouts: bool = False,
        leave: frozenset[str] = frozenset(),
    ) -> None:
        # A caller running several passes may recompile once at the end (it is most of the
        # cost of a pass on a large graph).
        super().__init__(recompile)
        self.strict = strict
        self.example_inputs = example_inputs
        self.opset = as_opset(opset)
        self.against_eager_layouts = against_eager_layouts
        self.leave = leave

    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        check_example_inputs(graph_module, self.example_inputs)
        if not any(_is_as_strided(n) for n in graph_module.graph.nodes):
            return RecordedPassResult(graph_module, False)
        # Verification runs ops on meta tensors: a tracer or transform active around the pass
        # (e.g. rewrite called inside make_fx) must neither record nor intercept them.
        with disable_current_modes():
            if not self.strict:
                modified, records = self._rewrite_all(graph_module)
                if modified and self.recompile:
                    graph_module.recompile()
                return RecordedPassResult(graph_module, modified, records)
            # Atomic: the copy absorbs every edit until the last node is known to be rewritten.
            work = LazyGraphModule(graph_module, copy_graph(graph_module.graph))
            modified, records = self._rewrite_all(work)
            if modified:
                install_graph(graph_module, work.graph)
                if self.recompile:
                    graph_module.recompile()
            return RecordedPassResult(graph_module, modified, records)

    def _rewrite_all(self, graph_module: torch.fx.GraphModule) -> tuple[bool, list[Record]]:
        """Rewrite every as_strided node of ``graph_module`` in place: whether any changed, and
        one record per node."""
        graph = graph_module.graph
        nodes = [n for n in graph.nodes if _is_as_strided(n) and n.name not in self.leave]
        ensure_metadata(graph_module, nodes, self.example_inputs)
        facts = ShapeFacts.of(v for n in nodes for v in (*n.args, *n.kwargs.values()))
        if facts is not None:
            facts.bind_size_inputs(graph)
        truth = LayoutTruth(graph_module)
        context = _GraphContext(
            graph=graph,
            index=ViewIndex(graph, facts),
            replacer=OutputDeferringReplacer(graph),
            position={node: i for i, node in enumerate(graph.nodes)},
            layout_mutators={},
            opset=self.opset,
            functional=self.opset is Opset.ATEN
            or not any(written_arguments(n) for n in graph.nodes),
            layout_doubts=truth.doubts(nodes),
            truth=truth,
            against_eager=self.against_eager_layouts,
        )
        records = []
        for node in nodes:
            record = self._rewrite_node(node, context)
            records.append(record)
            if record.method == "kept" and self.strict:
                raise UnsafeAsStridedError(
                    record.node, requested_geometry(node), record.reason, source=record.source
                )
        for replaced in context.replacer.finish():
            graph.erase_node(replaced)
        modified = any(r.method != "kept" for r in records)
        if modified:
            graph.lint()
        return modified, records

    def _rewrite_node(self, node: torch.fx.Node, context: _GraphContext) -> Record:
        call, problem = _parse(node, context.index.facts)
        if call is None:
            before = describe_call(as_strided_op(node) or node.target, node.args, node.kwargs)
            return Record(
                node.name,
                before,
                "",
                "kept",
                problem,
                kind=RecordKind.AS_STRIDED,
                source=source_line(node),
            )
        graph, position = context.graph, context.position
        if call.symbolic is not None and call.op in _STATIC_ONLY:
            return _kept(
                call,
                f"{call.op.__name__.split('.')[0]} with symbolic sizes is not rewritten "
                "(only as_strided and as_strided_copy are, for every size)",
            )
        if call.op is aten.as_strided_.default:
            if call.source.op in ("placeholder", "get_attr"):
                # The restrided tensor outlives the graph: the caller's argument, or a tensor
                # the graph reads as a constant. A view would leave its layout as it was.
                return _kept(
                    call,
                    f"as_strided_ restrides {call.source.name!r} in place, a tensor from "
                    "outside the graph whose new layout its owner sees after the call",
                )
            later = [u for u in call.source.users if position[u] > position[node]]
            if later:
                return _kept(
                    call,
                    f"as_strided_ restrides its input in place and {later[0].name!r} uses the "
                    "input afterwards, expecting the new layout",
                )
            # make_fx and FakeTensorProp record a snapshot per node. Metadata that holds the
            # restrided tensor itself on the input node has lost the input's old layout.
            if call.source.meta.get("val") is node.meta.get("val"):
                return _kept(
                    call,
                    "as_strided_ restrides its input in place and the graph's "
                    "metadata records only the layout after it",
                )
        mutation = context.layout_mutation(node, call.source)
        if mutation is not None:
            return _kept(
                call,
                f"the input's layout changes in place at {mutation.name!r}, so "
                "its trace-time layout is ambiguous",
            )
        if node in context.layout_doubts and context.against_eager and call.symbolic:
            # Eager's layout is known at the hints alone: where the sizes may be pinned to
            # them, the node is static (Note [Proofs over symbolic shapes], 4).
            sym = call.symbolic
            if sym.facts.pinned_at_hints(sym.source.free_symbols() | sym.target.free_symbols()):
                call = _parse(node, context.index.facts)[0] or call
        if node in context.layout_doubts:
            eager = context.truth.eager_layout(call.source) if context.against_eager else None
            if eager is None or call.symbolic is not None or feeds_as_strided(node):
                return _kept(call, context.layout_doubts[node])
            doubt = context.layout_doubts[node]
            call = dataclasses.replace(call, source_geometry=eager, eager_layout_doubt=doubt)
        unwritten = ""  # why the first verified chain has no form in the opset
        for method, view_chain, chosen in _candidates(call, context):
            if not chosen.verifies(view_chain):
                continue
            chain, why = chosen.in_opset(view_chain, context)
            if chain is not None and chosen.eager_layout_doubt is not None:
                chain, why = chain_for_any_layout(chain, node)
            if chain is None:
                described = describe_chain(view_chain, call.source.name)
                unwritten = unwritten or (
                    f"{described} gives it, but not in the {context.opset.value} opset: {why}"
                )
                continue
            before_chain = node.prev  # the chain's nodes go between it and the node
            emitted = _emit(graph, chosen, chain, context.opset)
            if emitted is None:
                continue
            after, out = emitted
            reason = _reason(chosen, method)
            assertion = None if chosen.symbolic is None else chosen.symbolic.assertion
            if assertion is not None:  # checked before the chain's views can raise or clamp
                for made in assertion.emit(graph, node, before=before_chain.next):
                    made.meta[MADE_FOR] = node.name
                reason = f"{_BOUNDED}, and asserts at run time that {assertion}"
            context.replacer.replace(node, out)
            if not node.users:  # else the output still holds it: erased after finish()
                graph.erase_node(node)
            return _record(chosen, after, method, reason)
        if unwritten:
            return _kept(call, unwritten)
        return _kept(call, _why_kept(call))


def engine_made_nodes(graph: torch.fx.Graph) -> dict[str, str]:
    """Names of the nodes the pass emitted, each with the as_strided node it replaced."""
    return {n.name: n.meta[MADE_FOR] for n in graph.nodes if MADE_FOR in n.meta}


def credit_engine(records: list[Record], made: dict[str, str]) -> list[Record]:
    """``records`` of a later step, saying which of their nodes the pass made, and for what.

    Example::

        >>> credit_engine([Record("view_default", ...)], {"view_default": "as_strided"})[0].reason
        "made by fxviews for 'as_strided'; ..."
    """
    return [
        dataclasses.replace(r, reason=f"made by fxviews for {made[r.node]!r}; {r.reason}")
        if r.node in made
        else r
        for r in records
    ]


def _reason(call: _Call, method: str) -> str:
    if call.eager_layout_doubt is not None:
        return (
            f"view ops proven against the layout eager PyTorch gives its input "
            f"({call.source_geometry}), not the traced one: {call.eager_layout_doubt}"
        )
    if call.rebased_from is None:
        return _REASONS[method]
    return (
        f"its input {call.rebased_from.name!r} does not expose all it reads; view ops from "
        f"{call.source.name!r} ({call.source_geometry}), which it is a view of, verified"
    )


_REASONS = {
    "identity": "same geometry as its input",
    "provenance": "replays the graph's own view ops from a base of the same geometry",
    "scatter": "relative to the dense base view of its flat buffer",
    "synthesized": "view ops derived from the input and target geometries, verified",
}
#: The reason of a synthesized chain that asserts its input bounds (see bounded_reads).
_BOUNDED = "view ops over its input's flat buffer, proven wherever it reads inside its input"


def _is_as_strided(node: torch.fx.Node) -> bool:
    return as_strided_op(node) is not None


def _record(call: _Call, after: str, method: str, reason: str) -> Record:
    return Record(
        call.node.name,
        call.describe(),
        after,
        method,
        reason,
        kind=RecordKind.AS_STRIDED,
        source=source_line(call.node),
    )


def _kept(call: _Call, reason: str) -> Record:
    return _record(call, "", "kept", reason)


def _parse(node: torch.fx.Node, facts: ShapeFacts | None) -> tuple[_Call | None, str]:
    kwargs = bind_as_strided(node)
    source, src = kwargs["self"], kwargs.get("src")
    op = as_strided_op(node)
    assert op is not None
    source_geometry = node_geometry(source)
    sizes, strides, offset = requested_geometry(node)
    values = (*sizes, *strides, offset)
    if source_geometry is not None and all(type(v) is int for v in values):
        ints = cast(tuple[int, ...], values)
        target = Geometry(ints[: len(sizes)], ints[len(sizes) : -1], ints[-1])
        return _Call(node, op, source, src, source_geometry, target), ""
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if facts is None or not isinstance(val, torch.Tensor):
        return None, "the input's trace-time layout is not strided, or its sizes are unknown"
    try:
        sym_source = SymbolicGeometry.of(val, facts)
        sym_offset = sym_source.offset if offset is None else offset
        sym_target = SymbolicGeometry.from_values(sizes, strides, sym_offset, facts)
    except (Unproven, RuntimeError) as err:  # RuntimeError: a layout without strides
        return None, f"the geometry cannot be read as sizes of the graph's shape environment: {err}"
    hint_source, hint_target = (g.at(facts.hints) for g in (sym_source, sym_target))
    if hint_source is None or hint_target is None:
        return None, "symbolic geometry whose symbols have no trace-time values"
    if sym_source.is_static() and sym_target.is_static():
        # SymInts pinned by guards (Eq(s26, 9)) are ints.
        return _Call(node, op, source, src, hint_source, hint_target), ""
    symbolic = _Symbolic(facts, sym_source, sym_target)
    return _Call(node, op, source, src, hint_source, hint_target, symbolic), ""


#: Variants rewritten only for static shapes.
_STATIC_ONLY = (aten.as_strided_.default,)
#: Variants whose result may be a copy with the as_strided's values, in a functional graph.
_COPYABLE = (aten.as_strided.default, aten.as_strided_copy.default)
#: Variants whose result is the memory they read and nothing else, so any tensor holding that
#: memory may stand in for their input (not ``as_strided_``, which restrides the input itself,
#: nor ``as_strided_scatter``, whose output has the input's shape).
_REBASABLE = _COPYABLE


def _candidates(call: _Call, context: _GraphContext) -> Iterator[tuple[str, ViewChain, _Call]]:
    """Candidate chains, best first, each with the call to verify and emit it for (the call
    itself, one whose facts assume what the chain asserts, or one reading a base of the
    input); lazily computed."""
    index = context.index
    sym = call.symbolic
    if sym is not None:
        for method, found in _symbolic_candidates(call, sym, index):
            yield method, found, call
        for flat, facts, assertion in bounded_candidates(sym.source, sym.target, sym.facts):
            settled = (facts.settled(sym.source), facts.settled(sym.target))
            bounded = _Symbolic(facts, *settled, assertion)
            yield "synthesized", flat, dataclasses.replace(call, symbolic=bounded)
        return
    source, target = call.source_geometry, call.target
    if equivalent(source, target):
        yield "identity", (), call
    chain = index.lookup(source, target)
    if chain is not None:
        yield "provenance", chain, call
    for base in base_geometries(call.source, source):
        relative = index.lookup(base, target) or synthesize(base, target)
        if relative is not None:
            yield "scatter", (base_view_step(base), *relative), call
    chain = synthesize(source, target)
    if chain is not None:
        yield "synthesized", chain, call
    if call.op not in _REBASABLE or call.eager_layout_doubt is not None:
        return  # a base's layout is the traced one
    for holder, geometry in exposing_bases(
        call.source, lambda n: context.layout_mutation(call.node, n)
    ):
        relative = index.lookup(geometry, target) or synthesize(geometry, target)
        if relative is not None:
            yield "rebased", relative, call.rebased(holder, geometry)


def _symbolic_candidates(
    call: _Call, sym: _Symbolic, index: ViewIndex
) -> Iterator[tuple[str, ViewChain]]:
    """Candidates for every size: the input itself, the graph's own chain, one relative to
    the dense base of a flat buffer, a synthesized one."""
    if equivalent_symbolic(sym.source, sym.target, sym.facts):
        yield "identity", ()
    chain = index.lookup_symbolic(sym.source, sym.target)
    if chain is not None:
        yield "provenance", chain
    for base in symbolic_base_geometries(call.source, sym.source, sym.facts):
        step = symbolic_base_view_step(base, sym.facts)
        if step is None:
            continue
        provenance = index.lookup_symbolic(base, sym.target)
        if provenance is not None:
            yield "scatter", (step, *provenance)
        for relative in synthesize_symbolic(base, sym.target, sym.facts):
            yield "scatter", (step, *relative)
    for chain in synthesize_symbolic(sym.source, sym.target, sym.facts):
        yield "synthesized", chain


def _emit(
    graph: torch.fx.Graph, call: _Call, chain: ViewChain, opset: Opset
) -> tuple[str, torch.fx.Node] | None:
    """Insert the replacement for ``call`` before it; None if this variant cannot use ``chain``.

    All checks come first; if computing the new nodes' metadata still fails, the nodes made so
    far are erased, so a failed attempt never leaves the graph half-edited.
    """
    op = call.op
    described = describe_chain(chain, call.source.name) if chain else f"alias({call.source.name})"
    if op is aten.as_strided_scatter.default:
        if not has_scatter_form(chain) or not _scatter_matches(call, chain):
            return None
        described = f"scatter into {described}"
    if op is aten.as_strided_copy.default:
        if not _output_is_contiguous(call):
            return None
        described = f"clone({described})"
    emitter = GraphEmitter(graph, call.node)
    try:
        # The new nodes' fake values may ask the ShapeEnv what the proof already settled; the
        # graph's ShapeEnv is the caller's, and it gets no guard from us. Their metadata is
        # then checked against the node's for every size (_same_metadata).
        quiet = contextlib.nullcontext() if call.symbolic is None else call.symbolic.facts.quiet()
        with graph.inserting_before(call.node), quiet:
            out = _build(emitter, call, chain)
    except RuntimeError as err:  # a verified chain whose nodes' fake metadata cannot be computed
        log.debug("%s: dropped candidate %s: %s", call.node.name, described, err)
        _erase_dead(graph, emitter.created)
        return None
    # Later nodes read the replacement's metadata as the layout they were traced against: it
    # must be the node's own, whatever the fake kernels computed. A copy has its own layout
    # and the node's sizes; no as_strided reads it (see _Call.in_opset).
    copied = any(isinstance(step, WindowsByCopies) for step in chain)
    # Proven against eager's layout, the chain's fake layout is the traced input's: only the
    # sizes can agree (no later as_strided reads it: see _rewrite_node).
    loose = copied or call.eager_layout_doubt is not None
    if not (_same_sizes(call, out) if loose else _same_metadata(call, out)):
        log.debug(
            "%s: dropped candidate %s: its metadata differs from the node's",
            call.node.name,
            described,
        )
        _erase_dead(graph, emitter.created)
        return None
    outside = [n.target for n in emitter.created if not opset.has(cast(Any, n.target))]
    if outside:  # a variant's own op (a scatter of a diagonal) the opset lacks
        log.debug("%s: dropped candidate %s: %s", call.node.name, described, outside[0])
        _erase_dead(graph, emitter.created)
        return None
    _erase_dead(graph, [n for n in emitter.created if n is not out])
    for made in emitter.created:
        if made is out or made.users:  # not erased: later steps must not take it for the user's
            made.meta[MADE_FOR] = call.node.name
    return described, out


def _output_is_contiguous(call: _Call) -> bool:
    val = call.node.meta["val"]
    if call.symbolic is None:
        return bool(val.is_contiguous())
    facts = call.symbolic.facts
    out = SymbolicGeometry.of(val, facts)
    expected = sympy.Integer(1)
    for size, stride in reversed(list(zip(out.sizes, out.strides, strict=True))):
        if not (facts.equal(size, 1) or facts.equal(stride, expected)):
            return False
        expected = expected * size
    return True


def _same_sizes(call: _Call, out: torch.fx.Node) -> bool:
    made, node = out.meta.get("val"), call.node.meta["val"]
    return isinstance(made, torch.Tensor) and (made.shape, made.dtype) == (node.shape, node.dtype)


def _same_metadata(call: _Call, out: torch.fx.Node) -> bool:
    """Whether the replacement's recorded layout is the node's own (for every size)."""
    emitted, original = node_geometry(out), node_geometry(call.node)
    if emitted is not None and original is not None:
        return equivalent(emitted, original)
    # Symbolic metadata, or SymInts a guard pinned (a static call in a dynamic graph).
    facts = call.symbolic.facts if call.symbolic is not None else ShapeFacts.of([out, call.node])
    if facts is None:
        return False
    try:
        made = SymbolicGeometry.of(out.meta["val"], facts)
        recorded = SymbolicGeometry.of(call.node.meta["val"], facts)
    except Unproven:
        return False
    return equivalent_symbolic(made, recorded, facts)


def _build(emitter: GraphEmitter, call: _Call, chain: ViewChain) -> torch.fx.Node:
    op = call.op
    chain = tuple(with_size_nodes(emitter, step) for step in chain)
    if op is aten.as_strided_scatter.default:
        out = build_scatter(emitter, call.source, call.src, chain)
        # When the region is all of self the chain is empty: still return a fresh tensor.
        return emitter(aten.clone.default, out) if out is call.src else out
    out = (
        apply_chain(chain, call.source, emitter)
        if chain
        else emitter(aten.alias.default, call.source)
    )
    if op is aten.as_strided_copy.default:
        out = emitter(aten.clone.default, out, memory_format=torch.contiguous_format)
    return out


def _erase_dead(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Erase ``nodes`` (made by an emitter, so side-effect free) that nothing reads."""
    for node in reversed(nodes):
        if not node.users:
            graph.erase_node(node)


def _scatter_matches(call: _Call, chain: ViewChain) -> bool:
    """Whether the scatter form of ``chain`` is exactly ``call``'s as_strided_scatter.

    Proven on geometry, whatever the size (see Note [Scatter along a chain] in scatter.py): the
    node's output must map indices to memory one-to-one, the chain must select the target from
    that output layout, and the scatter form must give the same output layout.
    """
    src_geometry = node_geometry(call.src)
    written = node_geometry(call.node)
    if call.symbolic is not None:
        return _symbolic_scatter_matches(call, call.symbolic, chain)
    if src_geometry is None or written is None or not is_one_to_one(written):
        return False
    if not verify_chain(chain, written, call.target):
        return False
    try:
        out = build_scatter(
            eager, call.source_geometry.meta_tensor(), src_geometry.meta_tensor(), chain
        )
    except RuntimeError:  # src does not fit the region
        return False
    # Offset included: a later as_strided of the result reads relative to its exact layout.
    return equivalent(Geometry.of(out), written)


#: Steps of a region chain whose scatter form needs no size: the nested ``*_scatter`` ops and
#: the permutations that undo themselves (``view`` would need the base's symbolic sizes).
_SYMBOLIC_SCATTER_STEPS = frozenset(
    {
        aten.select.int,
        aten.slice.Tensor,
        aten.diagonal.default,
        aten.permute.default,
        aten.t.default,
        aten.transpose.int,
        aten.alias.default,
        aten.view.default,  # only to unflatten a 1-D buffer: undone by view(..., [-1])
    }
)


def _symbolic_scatter_matches(call: _Call, sym: _Symbolic, chain: ViewChain) -> bool:
    """:func:`_scatter_matches` for every size: the output layout is proven one-to-one, the
    chain proven to select the target from it, and ``src`` proven to have the target's sizes.
    That the scatter form gives the node's output layout is checked on the emitted nodes'
    metadata, for every size (:func:`_same_metadata`)."""
    if call.src is None or not all(step.op in _SYMBOLIC_SCATTER_STEPS for step in chain):
        return False
    facts = sym.facts
    if not views_split_one_dim(chain, sym.source, facts):
        return False
    try:
        written = SymbolicGeometry.of(call.node.meta["val"], facts)
        src = SymbolicGeometry.of(call.src.meta["val"], facts)
    except (Unproven, KeyError, AttributeError):  # no fake value, or another ShapeEnv's
        return False
    if not is_one_to_one_symbolic(written, facts):
        return False
    if not verify_symbolic_chain(chain, written, sym.target, facts):
        return False
    return src.ndim == sym.target.ndim and all(
        facts.equal(a, b) for a, b in zip(src.sizes, sym.target.sizes, strict=True)
    )


def _why_kept(call: _Call) -> str:
    if call.symbolic is not None:
        return _why_kept_symbolic(call, call.symbolic)
    if call.op is aten.as_strided_scatter.default:
        chain = synthesize(call.source_geometry, call.target)
        if chain is not None:
            ops = sorted({step.name() for step in chain if not has_scatter_form((step,))})
            if ops:
                verb = "has" if len(ops) == 1 else "have"
                return f"its region needs {' and '.join(ops)}, which {verb} no scatter form"
            return (
                "its scatter form would not give the output layout, which later nodes read, "
                "or would not write where as_strided_scatter does"
            )
    witness = find_exposed_address(call.source_geometry, call.target)
    if witness is not None:
        return (
            f"unsafe: reads storage address {witness}, which its input "
            f"({call.source_geometry}) does not expose"
        )
    return (
        f"no chain of view ops gives this geometry from its input ({call.source_geometry}); "
        "it may be safe but has no view form"
    )


def _why_kept_symbolic(call: _Call, sym: _Symbolic) -> str:
    """Why no chain holds for every size: the step the proof fails at, or the hint's reason."""
    at_hint = synthesize(call.source_geometry, call.target)
    if at_hint is None:
        static = dataclasses.replace(call, symbolic=None)
        return f"at the trace-time sizes: {_why_kept(static)}"
    chain = next(synthesize_symbolic(sym.source, sym.target, sym.facts), at_hint)
    try:
        apply_symbolic(chain, sym.source, sym.facts)
        failure = "its result is not proven equal to the target for every size"
    except Unproven as err:
        failure = str(err)
    return (
        f"symbolic geometry (input {sym.source}): {describe_chain(at_hint, call.source.name)} "
        f"gives it at the trace-time sizes, but no view chain is proven to for every size the "
        f"symbols may take ({failure}){why_not_asserted(sym.source, sym.target, sym.facts)}"
    )
