"""The backend's first stage: rewrite the user's as_strided in Dynamo's graph, before vmap's
batching rules and AOTAutograd read it.

Note [The backend's first stage]
--------------------------------
AOTAutograd lowers Dynamo's graph by running it: by the time the aten graphs reach the second
stage (``compile_backend._rewrite_in_place``) vmap's ``as_strided`` batching rule has read a
user's ``as_strided`` against the physical layout of each sample, and functionalization has
replayed in-place writes through it. Neither can be undone in the aten graph. Dynamo's graph
is the first place fxviews can act: it holds the user's own calls (torch-level
``x.as_strided(...)``, views, in-place methods), and inside ``torch.func.vmap`` the calls on
the logical per-sample tensor between ``_add_batch_dim`` and ``_remove_batch_dim``.

What an ``as_strided`` means here (the semantics of ``fxviews.transform``):

- **outside every vmap region** it reads relative to the layout its input has in the call:
  the caller's layout for inputs (Dynamo guards it), eager's for computed values (layout truth
  checks the fake layouts against eager kernels; where they differ the node is kept and reads
  what the kernels really produce, as eager does);
- **inside a vmap region** it reads relative to the layout each sample would have in the
  per-sample loop, each sample a fresh contiguous tensor: ``compile(vmap(f))`` equals
  ``vmap(fxviews.transform(f))`` and the loop ``torch.stack([f(s) for s in samples])``,
  wherever the batch dim lies in memory (Note [Per-sample values of Dynamo's graph]).

In a graph whose as_strided nodes are all outside vmap, those with symbolic sizes (or sizes
the graph computes, such as Longformer's ``torch.div`` chunk counts) and not differentiated
are left to the second stage, which reads the same layouts and emits its chains after
AOTAutograd has traced (here AOTAutograd's fake kernels would trace them and guard on their
sizes: a bounded chain's run-time assertion would become a recompile); the static ones are
rewritten here. So is one AOTAutograd differentiates (its value requires grad): the backward it
derives from an ``as_strided`` is an ``as_strided_scatter`` into the gradient's buffer, which
has no scatter form where the region's chain takes windows (``unfold``), so the second stage
would hand it to the inner compiler; the backward of view ops holds none. The price is the
recompile those fake kernels may add.

The stage puts those values in ``meta["val"]`` and runs the same engine as every other entry
point (:class:`~fxviews.passes.AsStridedToViews`: provenance, synthesis, verification, layout
truth, records), then takes the values out again. A node the engine keeps inside a vmap region
is read by vmap's own rule, against the layout vmap gives each sample:

- where that layout is the per-sample one (the caller's batch dim outermost, each sample
  contiguous), the rule reads what the loop reads: the node stays;
- where the node's input is a vmap input (a transform's wrapper of one, or a view of one,
  whose layout view kernels compute alike in fake and eager) and the request reads only that
  sample's own elements in the layout vmap gives it, the request was written for that layout
  (strides read with ``.stride()`` inside vmap, which Dynamo bakes in as numbers): it is
  rewritten relative to it, proven the same way (a second engine run on those
  nodes alone), and reads what the loop over samples of that layout reads;
- otherwise vmap would read other memory than the loop: :class:`~fxviews.FxViewsError`,
  naming the node and the user's line (``strict=True`` raises for every kept node anyway).

Cost: nothing for a graph without as_strided; otherwise one pass over the graph for the values,
the per-sample calls of batched nodes in the fake mode (no kernel runs), and the engine.

Example::

    >>> result = rewrite_dynamo_graph(gm, strict=False)   # gm: Dynamo's graph of vmap(windows)
    >>> [(r.method, r.after) for r in result.records]
    [('synthesized', 'unfold(_add_batch_dim, 0, 3, 1)')]
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import sympy
import torch.fx

from fxviews.consumers.compile.batched_backwards import pin_candidates, pin_windows
from fxviews.consumers.compile.dynamo_values import DynamoValues, assign_values, clear_values
from fxviews.consumers.compile.storage_bounds import StorageNeed, storage_needs
from fxviews.consumers.compile.write_hazards import node_storage, write_hazard
from fxviews.consumers.compile.written_windows import rewrite_written_windows
from fxviews.passes import AsStridedToViews
from fxviews.passes.analysis.as_strided_calls import as_strided_op, bind_as_strided, static_request
from fxviews.passes.errors import FxViewsError
from fxviews.passes.geometry.concrete import Geometry, find_exposed_address
from fxviews.passes.geometry.symbolic import guarding_unproven_bounds
from fxviews.passes.rewrites.as_strided_to_views import engine_made_nodes
from fxviews.passes.schema import LAYOUT_FACT, LayoutFact
from fxviews.passes.source_lines import describe_node
from fxviews.rewriting.printouts import logger, report_rewrite
from fxviews.rewriting.steps import RewriteResult, rewrite_in_place


@dataclasses.dataclass(frozen=True)
class PreparedGraph:
    """Dynamo's graph after the first stage: why it cannot go to AOTAutograd whole (None: it
    can), the nodes it is split around instead (Note [Splitting the graph around what
    AOTAutograd gets wrong]: kept reads of written memory it is split before, writes that run
    alone as eager PyTorch; neither: it runs as eager PyTorch whole), and the storage each
    kept as_strided needs of a graph input."""

    runs_eagerly: str | None
    storage_needs: list[StorageNeed]
    split_before: tuple[torch.fx.Node, ...] = ()
    run_alone: tuple[torch.fx.Node, ...] = ()

    @property
    def splits(self) -> bool:
        """Whether the graph is split around the nodes AOTAutograd would get wrong."""
        return bool(self.split_before or self.run_alone)


def prepare_dynamo_graph(gm: torch.fx.GraphModule, strict: bool, name: str) -> PreparedGraph:
    """Everything the backend does to Dynamo's graph ``gm`` (called ``name`` in messages), in
    place, before AOTAutograd: the as_strided rewrite (see the Note), windows written in place
    made of views (Note [Windows written in place]), and what AOTAutograd or a compiled
    as_strided would get wrong (Notes [In-place writes AOTAutograd gets wrong] and [Reads past
    the storage]).

    Example::

        >>> prepare_dynamo_graph(gm, strict=False, name="Dynamo graph of compile 0/0")
        PreparedGraph(runs_eagerly=None, storage_needs=[])
    """
    result = rewrite_dynamo_graph(gm, strict)
    if result is not None:
        report_rewrite(result, source=f"backend, {name}")
    for window in rewrite_written_windows(gm):
        logger.debug(
            "backend, %s: unfold %r, written in place, is now views whose writes "
            "functionalization inverts exactly",
            name,
            window,
        )
    hazard = write_hazard(gm)
    needs, past_storage = storage_needs(gm)
    if hazard is None:
        return PreparedGraph(past_storage, needs)
    if past_storage is not None:  # a read past the storage: no split makes it eager's
        return PreparedGraph(hazard.reason, needs)
    return PreparedGraph(hazard.reason, needs, hazard.split_before, hazard.run_alone)


def rewrite_dynamo_graph(gm: torch.fx.GraphModule, strict: bool) -> RewriteResult | None:
    """Rewrite the as_strided nodes of Dynamo's graph ``gm`` in place (see the Note); None for
    a graph without any."""
    nodes = [n for n in gm.graph.nodes if as_strided_op(n) is not None]
    if not nodes:
        return None
    values = assign_values(gm)
    try:
        if not _all_inputs_valued(gm):
            return None  # a value Dynamo did not record: the aten graphs' stage has them all
        # Outside vmap the aten graphs' stage reads the same layouts, and there the view ops of
        # a chain proven for every size are emitted after AOTAutograd has traced: here its fake
        # kernels would trace them and guard on their sizes (a recompile). Those nodes are left
        # to it, but for one AOTAutograd differentiates (its backward would be an
        # as_strided_scatter); the rest are rewritten here, before functionalization reads them.
        symbolic = frozenset(n.name for n in nodes if _symbolic(n) and not _differentiated(n))
        leave = frozenset() if any(n in values.batched for n in nodes) else symbolic
        if len(leave) == len(nodes):
            return None
        pinnable = pin_candidates(gm, values)
        result = rewrite_in_place(
            gm,
            strict=strict,
            reshape_views=False,
            pin_layouts=False,
            guard_kept=False,
            against_eager_layouts=True,
            leave=leave,
        )
        kept_names = {r.node for r in result.records if r.method == "kept"}
        kept = [k for k in _kept_under_vmap(gm, values) if k.node.name in kept_names]
        retried = [k for k in kept if not k.read_alike]
        if retried:  # a second proof, where vmap's reading of the kept node is not the loop's
            for k in retried:
                if k.fits_vmap_layout:
                    k.source.meta["val"] = k.physical
                    k.source.meta[LAYOUT_FACT] = LayoutFact(trusted=True)
            with guarding_unproven_bounds():
                rerun = AsStridedToViews(recompile=False, against_eager_layouts=True)(gm)
            again = {r.node: r for r in rerun.records}
            names = {k.node.name for k in retried}
            result.records = [again[r.node] if r.node in names else r for r in result.records]
            result.modified = result.modified or any(again[n].method != "kept" for n in names)
            gm.recompile()
        result.records = pin_windows(gm, pinnable, result.records)
        still_kept = {r.node: r.reason for r in result.records if r.method == "kept"}
        for k in kept:
            if k.node.name in still_kept and not k.read_alike:
                raise _misread_under_vmap(k, still_kept[k.node.name])
        _give_example_values(gm, values)
    finally:
        clear_values(gm, values)
    return result


def _symbolic(node: torch.fx.Node) -> bool:
    """Whether an as_strided-family node's request or input has symbolic sizes."""
    source = bind_as_strided(node)["self"]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    geometry = Geometry.of(value) if isinstance(value, torch.Tensor) else None
    request = static_request(node, geometry.offset if geometry is not None else 0)
    return (
        request is None
        or geometry is None
        or not all(type(v) is int for v in (*geometry.sizes, *geometry.strides, geometry.offset))
    )


def _differentiated(node: torch.fx.Node) -> bool:
    """Whether AOTAutograd differentiates ``node``: its value requires grad."""
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.requires_grad


def _all_inputs_valued(gm: torch.fx.GraphModule) -> bool:
    """Whether every as_strided-family node's input has a tensor value to be proven against."""
    for node in gm.graph.nodes:
        if as_strided_op(node) is not None:
            source = bind_as_strided(node)["self"]
            if not isinstance(getattr(source, "meta", {}).get("val"), torch.Tensor):
                return False
    return True


@dataclasses.dataclass(frozen=True)
class _KeptUnderVmap:
    """An as_strided the engine kept whose input is batched: the layouts the loop and vmap give
    each sample of its input."""

    node: torch.fx.Node
    source: torch.fx.Node
    logical: torch.Tensor | None  # None where the per-sample value is unknown
    physical: torch.Tensor

    @property
    def read_alike(self) -> bool:
        """Whether vmap's rule reads what the per-sample loop reads: the two layouts agree
        (compared as expressions, so symbolic ones add no guard)."""
        if self.logical is None:
            return False
        vmaps, loops = Geometry.of(self.physical), Geometry.of(self.logical)
        if [_expr(s) for s in vmaps.sizes] != [_expr(s) for s in loops.sizes]:
            return False
        strides = zip(vmaps.sizes, vmaps.strides, loops.strides, strict=True)
        return _expr(vmaps.offset) == _expr(loops.offset) and all(
            _expr(a) == _expr(b) for size, a, b in strides if _expr(size) != 1
        )

    @property
    def fits_vmap_layout(self) -> bool:
        """Whether the request reads only the sample's own elements in the layout vmap gives
        the samples of a vmap input (see the Note); static layouts only."""
        if self.read_alike or not _views_a_vmap_input(self.source):
            return False
        geometry = Geometry.of(self.physical)
        target = static_request(self.node, self.physical.storage_offset())
        static = all(type(v) is int for v in (*geometry.sizes, *geometry.strides))
        return static and target is not None and find_exposed_address(geometry, target) is None


def _kept_under_vmap(gm: torch.fx.GraphModule, values: DynamoValues) -> list[_KeptUnderVmap]:
    kept = []
    for node in gm.graph.nodes:
        if as_strided_op(node) is None:
            continue
        source = bind_as_strided(node)["self"]
        physical = values.physical.get(source) if isinstance(source, torch.fx.Node) else None
        if physical is None:
            continue  # its input is not batched: vmap runs it as it is
        logical = None if source in values.unknown else source.meta.get("val")
        kept.append(_KeptUnderVmap(node, source, logical, physical))
    return kept


def _misread_under_vmap(kept: _KeptUnderVmap, reason: str) -> FxViewsError:
    loop = "unknown" if kept.logical is None else str(Geometry.of(kept.logical))
    return FxViewsError(
        f"as_strided node {describe_node(kept.node)} under torch.func.vmap is kept ({reason}), "
        f"and vmap's as_strided rule would read each sample in the layout vmap gives it "
        f"({Geometry.of(kept.physical)}), not in the per-sample loop's ({loop}): other numbers "
        "than the loop. Write it as view ops, compute its strides from the tensor inside vmap, "
        "or call it outside vmap"
    )


def _views_a_vmap_input(node: torch.fx.Node) -> bool:
    """Whether ``node``'s tensor is a vmap input or a view of one (it shares its storage):
    its layout under vmap is then the caller's, which Dynamo guards, through view ops, whose
    layouts fake and eager kernels compute alike (HF Longformer's ``_chunk`` views its input
    before reading ``.stride()``)."""
    if _is_vmap_input(node):
        return True
    storage = node_storage(node)
    return storage is not None and any(
        _is_vmap_input(other) and node_storage(other) == storage for other in node.graph.nodes
    )


def _is_vmap_input(node: torch.fx.Node) -> bool:
    """Whether ``node`` is ``_add_batch_dim``'s result, directly or through wrappers."""
    fact = node.meta.get(LAYOUT_FACT)
    while fact is not None and fact.same_as is not None:
        node = fact.same_as
        fact = node.meta.get(LAYOUT_FACT)
    return getattr(node.target, "__name__", None) == "_add_batch_dim"


def _expr(value: Any) -> Any:
    """A size, stride or offset as a sympy expression (a SymInt's own, without a guard)."""
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)


def _give_example_values(gm: torch.fx.GraphModule, values: DynamoValues) -> None:
    """Emitted nodes outside vmap regions get Dynamo's ``example_value`` (their fake value):
    passes that read Dynamo graphs (Inductor's pre-grad ones) expect it."""
    made = engine_made_nodes(gm.graph)
    for node in gm.graph.nodes:
        if node.name not in made or "val" not in node.meta:
            continue
        if any(a in values.batched for a in node.all_input_nodes):
            values.batched.add(node)
        else:
            node.meta["example_value"] = node.meta["val"]


@contextlib.contextmanager
def unfold_backward_traced_per_sample() -> Iterator[None]:
    """AOTAutograd's trace without functorch's warning that ``unfold_backward`` has no batching
    rule.

    The windows the first stage writes under ``vmap(grad(f))`` are ``unfold``; its backward
    under vmap takes functorch's per-sample fallback, which the trace records as one
    ``unfold_backward`` per sample. Inductor fuses them (row 11 of the bench); the default
    inner compiler runs them one by one (docs/compile.md, Limits, says so). The warning, about
    eager ``vmap``'s loop, is not what the compiled graph does, so it is not shown.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNFOLD_BACKWARD_FALLBACK)
        yield


_UNFOLD_BACKWARD_FALLBACK = (
    "There is a performance drop because we have not yet implemented the batching rule for "
    "aten::unfold_backward"
)
