"""AsStridedToViews: replace each provably safe ``as_strided`` with the view ops it came from.

Note [AsStridedToViews]
-----------------------
Semantics: each ``as_strided(x, S, T, O)`` in a traced graph is read relative to the layout
``x`` had when the graph was traced (its ``meta["val"]``). The pass replaces it with a chain of
view ops that gives exactly that geometry *from that layout*; because view ops are defined on
logical dims, the chain then stays right when ``x`` arrives batched (vmap) or non-contiguous.

Per as_strided node, in graph order, candidates are tried in this order and the first one that
verifies wins (see ``view_chain.verify_chain``: the chain is run on a meta tensor with the
input's exact geometry and must reproduce the target's geometry):

1. identity    - the target equals the input's geometry: an ``alias``;
2. provenance  - the graph already views a base of the input's geometry into the target's
                 geometry (``ViewIndex``): replay those ops on the input;
3. scatter     - the input is a flat buffer that a sibling as_strided restores to a dense base:
                 unflatten to that base, then provenance or synthesis relative to it;
4. synthesized - derive a chain from the two geometries (``synthesis.synthesize``).

If none verifies, the node is kept with the reason: a witness address when it reads memory the
input does not expose (unsafe), or "no view form" when it may be safe but no view op chain
reproduces it. ``strict=True`` raises ``UnsafeAsStridedError`` instead of keeping.

Variants: ``as_strided_copy`` becomes the chain plus a contiguous ``clone``;
``as_strided_scatter`` becomes nested ``select_scatter``/``slice_scatter``/``diagonal_scatter``
(see ``scatter.py``); ``as_strided_`` restrides its input in place, so it becomes the chain
only where nothing uses its input after it (later uses would expect the new layout).

Cost: one pass to build the view index, then O(dims^2) per as_strided node: linear in the graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.fx

from .errors import FxViewsError, UnsafeAsStridedError
from .geometry import Geometry, equivalent, find_exposed_address
from .graph_edits import OutputDeferringReplacer
from .provenance import ViewIndex, node_geometry
from .records import Record
from .scatter import base_geometries, base_view_step, build_scatter, has_scatter_form
from .synthesis import synthesize
from .torch_internals import OpOverload, PassBase, PassResult, disable_current_modes
from .view_chain import (
    METADATA_MUTATIONS,
    GraphEmitter,
    ViewChain,
    apply_chain,
    as_strided_op,
    bind_as_strided,
    describe_chain,
    eager,
    verify_chain,
)

aten = torch.ops.aten


@dataclass(frozen=True)
class _GraphContext:
    """What the pass knows about the graph it rewrites, built once per call."""

    graph: torch.fx.Graph
    index: ViewIndex
    replacer: OutputDeferringReplacer
    position: dict[torch.fx.Node, int]  # of the original nodes, for "used after" questions


@dataclass(frozen=True)
class _Call:
    """An as_strided-family node, its parsed arguments and geometries."""

    node: torch.fx.Node
    op: OpOverload  # the aten op, however the node spells it
    source: torch.fx.Node
    src: torch.fx.Node | None  # the values scattered, for as_strided_scatter
    source_geometry: Geometry
    target: Geometry

    def describe(self) -> str:
        name = self.op.__name__.split(".")[0]
        src = f", {self.src.name}" if self.src is not None else ""
        t = self.target
        return f"{name}({self.source.name}{src}, {list(t.sizes)}, {list(t.strides)}, {t.offset})"


class AsStridedToViews(PassBase):
    """A torch.fx pass rewriting as_strided nodes into verified view ops (mutates its input).

    After a call, ``records`` holds one :class:`Record` per as_strided node seen.
    ``recompile=False`` leaves ``graph_module.recompile()`` to the caller.

    Example::

        >>> engine = AsStridedToViews()
        >>> result = engine(gm)           # PassResult(graph_module, modified)
        >>> [r.method for r in engine.records]
        ['provenance']
    """

    def __init__(
        self,
        strict: bool = False,
        example_inputs: Sequence[Any] | None = None,
        recompile: bool = True,
    ) -> None:
        super().__init__()
        self.strict = strict
        self.example_inputs = example_inputs
        # A caller running several passes may recompile once at the end (it is most of the
        # cost of a pass on a large graph).
        self.recompile = recompile
        self.records: list[Record] = []

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        self.records = []
        nodes = [n for n in graph_module.graph.nodes if _is_as_strided(n)]
        if not nodes:
            return PassResult(graph_module, False)
        # Verification runs ops on meta tensors: a tracer or transform active around the pass
        # (e.g. rewrite called inside make_fx) must neither record nor intercept them.
        with disable_current_modes():
            return self._rewrite_all(graph_module, nodes)

    def _rewrite_all(
        self, graph_module: torch.fx.GraphModule, nodes: list[torch.fx.Node]
    ) -> PassResult:
        _ensure_metadata(graph_module, nodes, self.example_inputs)
        graph = graph_module.graph
        context = _GraphContext(
            graph=graph,
            index=ViewIndex(graph),
            replacer=OutputDeferringReplacer(graph),
            position={node: i for i, node in enumerate(graph.nodes)},
        )
        modified = False
        for node in nodes:
            record = self._rewrite_node(node, context)
            self.records.append(record)
            if record.method == "kept" and self.strict:
                raise UnsafeAsStridedError(record.node, record.before, record.reason)
            modified = modified or record.method != "kept"
        for replaced in context.replacer.finish():
            graph.erase_node(replaced)
        if modified:
            graph_module.graph.lint()
            if self.recompile:
                graph_module.recompile()
        return PassResult(graph_module, modified)

    def _rewrite_node(self, node: torch.fx.Node, context: _GraphContext) -> Record:
        call, problem = _parse(node)
        if call is None:
            return Record(node.name, node.format_node(), "", "kept", problem)
        graph, position = context.graph, context.position
        if call.op is aten.as_strided_.default:
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
                return _kept(call, "as_strided_ restrides its input in place and the graph's "
                             "metadata records only the layout after it")
        mutation = next(
            (u for u in call.source.users if u.target in METADATA_MUTATIONS and u is not node),
            None,
        )
        if mutation is not None:
            return _kept(call, f"the input's layout changes in place at {mutation.name!r}, so "
                         "its trace-time layout is ambiguous")
        for method, chain in _candidates(call, context.index):
            if not verify_chain(chain, call.source_geometry, call.target):
                continue
            emitted = _emit(graph, call, chain)
            if emitted is None:
                continue
            after, out = emitted
            context.replacer.replace(node, out)
            if not node.users:  # else the output still holds it: erased after finish()
                graph.erase_node(node)
            return Record(node.name, call.describe(), after, method, _REASONS[method])
        return _kept(call, _why_kept(call))


_REASONS = {
    "identity": "same geometry as its input",
    "provenance": "replays the graph's own view ops from a base of the same geometry",
    "scatter": "relative to the dense base view of its flat buffer",
    "synthesized": "view ops derived from the input and target geometries, verified",
}


def _is_as_strided(node: torch.fx.Node) -> bool:
    return as_strided_op(node) is not None


def _kept(call: _Call, reason: str) -> Record:
    return Record(call.node.name, call.describe(), "", "kept", reason)


def _ensure_metadata(
    gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], example_inputs: Sequence[Any] | None
) -> None:
    """Make sure every as_strided input carries its trace-time tensor value.

    A value with symbolic sizes is metadata too: such nodes are kept later, with that reason.
    """

    def missing() -> torch.fx.Node | None:
        return next((n.args[0] for n in nodes if not _has_tensor_value(n.args[0])), None)

    node = missing()
    if node is None:
        return
    if example_inputs is not None:
        from .torch_internals import FakeTensorMode, FakeTensorProp

        try:
            # Parameters and constants of the module stay real: the mode must accept them.
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            FakeTensorProp(gm, mode=mode).propagate(*example_inputs)
        except Exception as err:  # any failure here means the inputs do not fit the graph
            raise FxViewsError(
                f"could not compute tensor metadata for the graph from example_inputs: {err}"
            ) from err
        node = missing()
        if node is None:
            return
    raise FxViewsError(
        f"node {getattr(node, 'name', node)!r} feeds an as_strided but has no tensor metadata "
        "(meta['val']); trace with fxviews.trace or make_fx, or pass example_inputs so "
        "fxviews can compute it"
    )


def _has_tensor_value(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _parse(node: torch.fx.Node) -> tuple[_Call | None, str]:
    kwargs = bind_as_strided(node)
    source, src = kwargs["self"], kwargs.get("src")
    sizes, strides, offset = kwargs["size"], kwargs["stride"], kwargs["storage_offset"]
    source_geometry = node_geometry(source)
    if source_geometry is None:
        return None, "the input's trace-time layout is symbolic (dynamic shapes) or not strided"
    if offset is None:
        offset = source_geometry.offset
    values = (*sizes, *strides, offset)
    if not all(type(v) is int for v in values):
        return None, "symbolic sizes, strides or offset"
    target = Geometry(tuple(sizes), tuple(strides), offset)
    return _Call(node, as_strided_op(node), source, src, source_geometry, target), ""


def _candidates(call: _Call, index: ViewIndex) -> Iterator[tuple[str, ViewChain]]:
    """Candidate chains, best first; each is verified by the caller. Lazily computed."""
    source, target = call.source_geometry, call.target
    if equivalent(source, target):
        yield "identity", ()
    chain = index.lookup(source, target)
    if chain is not None:
        yield "provenance", chain
    for base in base_geometries(call.source, source):
        relative = index.lookup(base, target) or synthesize(base, target)
        if relative is not None:
            yield "scatter", (base_view_step(base), *relative)
    chain = synthesize(source, target)
    if chain is not None:
        yield "synthesized", chain


def _emit(graph: torch.fx.Graph, call: _Call, chain: ViewChain) -> tuple[str, torch.fx.Node] | None:
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
        if not call.node.meta["val"].is_contiguous():
            return None
        described = f"clone({described})"
    emitter = GraphEmitter(graph, call.node)
    try:
        with graph.inserting_before(call.node):
            out = _build(emitter, call, chain)
    except (RuntimeError, IndexError, ValueError, TypeError):
        _erase_dead(graph, emitter.created)
        return None
    _erase_dead(graph, [n for n in emitter.created if n is not out])
    return described, out


def _build(emitter: GraphEmitter, call: _Call, chain: ViewChain) -> torch.fx.Node:
    op = call.op
    if op is aten.as_strided_scatter.default:
        out = build_scatter(emitter, call.source, call.src, chain)
        # When the region is all of self the chain is empty: still return a fresh tensor.
        return emitter(aten.clone.default, out) if out is call.src else out
    out = apply_chain(chain, call.source, emitter) if chain else emitter(
        aten.alias.default, call.source
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
    """The scatter form must give the node's exact layout and, on a small sample, its values."""
    expected = call.node.meta["val"]
    src_geometry = node_geometry(call.src)
    if src_geometry is None:
        return False
    try:
        out = build_scatter(
            eager, call.source_geometry.meta_tensor(), src_geometry.meta_tensor(), chain
        )
        if out.shape != expected.shape or out.stride() != expected.stride():
            return False
        if call.source_geometry.storage_extent() > 100_000:
            return True
        base = _numbered(call.source_geometry)
        src = -_numbered(src_geometry)  # distinct from every value of `base`
        target = call.target
        want = aten.as_strided_scatter.default(
            base, src, list(target.sizes), list(target.strides), target.offset
        )
        got = build_scatter(eager, base, src, chain)
        return bool(torch.equal(want, got))
    except (RuntimeError, IndexError, ValueError):
        return False


def _numbered(geometry: Geometry) -> torch.Tensor:
    """A real tensor of ``geometry`` over storage ``1, 2, ...``: distinct positive values."""
    storage = torch.arange(1, max(geometry.storage_extent(), 1) + 1, dtype=torch.float64)
    return storage.as_strided(geometry.sizes, geometry.strides, geometry.offset)


def _why_kept(call: _Call) -> str:
    if call.op is aten.as_strided_scatter.default:
        chain = synthesize(call.source_geometry, call.target)
        if chain is not None:
            ops = sorted({step.name() for step in chain})
            return f"its region needs {', '.join(ops)}, which have no exact scatter form here"
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
