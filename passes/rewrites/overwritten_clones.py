"""OverwrittenClones: a clone whose every element is overwritten before it is read.

Note [Overwritten clones]
-------------------------
``x.clone()`` followed by ``x.copy_(y)`` (the push_jvp example, and any "start from a copy, then
fill it" code) traces to::

    clone = aten.clone(a)
    view = aten.select.int(clone, 0, 0)     # views taken before the write see it too
    copy_ = aten.copy_(clone, b)

Copying ``a`` is dead work: ``copy_`` overwrites every element before anything reads one. So
``clone(b)`` in the clone's place computes the same values, and the ``copy_`` goes (its users
read the clone, which is the tensor it returned). Under ``vmap`` each op pays a batching rule,
so one op less is measurable. The rewrite is made only when each of these is proven:

1. Graph values with metadata: ``clone`` is ``aten.clone.default`` of one graph value ``a``
   (``memory_format`` its only keyword), ``copy_`` is ``aten.copy_.default(clone, b)`` with
   ``non_blocking`` unset or False, and both, ``a`` and ``b`` carry a tensor ``meta["val"]``.
2. Every element is overwritten, with no conversion: ``b``'s sizes equal the clone's exactly
   (no broadcasting; symbolic sizes proven equal for every size, see
   Note [Proofs over symbolic shapes]), same dtype (``copy_`` would cast), same device, and no
   lazy conjugate or negative bit on ``b``.
3. Nothing reads the clone's data before the ``copy_``: every user of the clone placed before
   the ``copy_`` is a pure re-indexing view (:data:`~.op_tables.LAYOUT_VIEWS`: no as_strided,
   no ``_reshape_alias``, no dtype or conjugate view), and so is every user of those views
   placed before it. Their results stay views of the same memory, so from the ``copy_`` on
   they show ``b``'s values in both graphs. Users placed after the ``copy_`` read the data
   after the overwrite, whatever they are.
4. ``clone(b)`` copies the value the ``copy_`` copied: ``b`` is defined before the clone
   (nothing is moved; otherwise the clone is kept), and nothing writes ``b``'s memory (its
   alias class, :class:`~.aliasing.AliasAnalysis`) strictly between the clone and the ``copy_``.
   The rewrite reads ``b`` earlier, before those writes, so "``b``'s memory" must hold all
   memory ``b`` may share when the graph runs, not only what the trace linked it to. Graph
   inputs and ``get_attr`` constants are the caller's tensors, traced as separate tensors but
   free to overlap on any call (``f(t, t)``, ``f(t, t[:])``, an argument viewing a tensor ``fn``
   closes over): the analysis puts them, and every view of them, in one class, so a write to
   any of them keeps the clone of any other (Note [Alias analysis], step 2). A ``b`` the graph
   allocated (a clone, an out-of-place result) no caller can alias: writes to the inputs leave
   it alone, and its clone is still rewritten.
5. The layout is the same where anything can tell. ``clone`` without ``memory_format`` (or
   with ``preserve_format``) takes its input's layout: ``b``'s, where it took ``a``'s.
   a. At trace time: ``b``'s strides equal the traced clone's on every dim of size > 1. The
      traced clone is dense and non-overlapping, so ``b`` is too, and ``clone(b)`` gets those
      strides: every traced value keeps its metadata (torch.compile regenerates outputs that
      alias intermediates from the traced strides).
   b. At run time the inputs may have any layout (under ``vmap`` each sample's depends on
      where its batch dim sits), so ``a``'s and ``b``'s may differ. Nothing downstream of the
      clone may depend on a layout: no layout-bound node (:func:`~.pinning.layout_dependence`:
      merging views, ``view_as_complex``, baked strides, layout-assuming kernels), no
      ``view.dtype``, no metadata mutation, no query that returns anything but sizes
      (``sym_stride``, ``is_contiguous``, ...), no call whose schema cannot be read. Layout
      flows through out-of-place ops too, so this is every node reachable from the clone.
   ``clone(memory_format=contiguous_format)`` (as the layout-pinning step makes it) gives the
   same layout from any input of the same sizes, on every sample under ``vmap``: 5 holds.
   What a caller sees of the outputs' strides at run time follows ``b`` instead of ``a``; the
   values, and which outputs alias which, are the same.

Under ``grad`` and ``jvp`` the two graphs agree too: ``copy_``'s derivative routes ``b``'s
gradient (and tangent) into the clone and gives ``a`` none; ``clone(b)`` does the same (equal
dtypes and sizes: no cast, no reduction of a broadcast). Graphs from torch.compile's backend
and exported programs are functionalized: the overwrite is an out-of-place ``copy(clone, b)``,
not this pattern, and a ``copy_`` there writes back into a graph input, not into a clone. Where
such a graph does hold the pattern the same proof applies, and a returned ``copy_`` becomes
its clone in the output list, the position export's signature follows.

Every candidate (a ``copy_`` whose destination is a clone node) gets a record: method
``"reclone"`` with the clone's new call, or ``"kept"`` with the first condition that failed.
Facts are gathered once, on the graph as it came; a rewrite only moves a read of ``b`` earlier
over a stretch where nothing writes memory ``b`` may share (4) and keeps every value, so it
makes no other candidate's conditions false.

Cost: one scan for candidates; with any, one numbering of the nodes, then, only when a
candidate gets that far, one alias analysis (4) and one reverse sweep (5b).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

from ..analysis.aliasing import AliasAnalysis, is_opaque
from ..compat.torch_internals import OpOverload, op_schema
from ..geometry.symbolic import ShapeFacts, Unproven
from ..graph_edits import OutputDeferringReplacer, describe_call, tensor_val, traced_tensor
from ..op_tables import LAYOUT_VIEWS, METADATA_MUTATIONS
from ..schema import Record, RecordedPassResult, RecordKind
from .pass_base import RecordingPass
from .pinning import layout_dependence

aten = torch.ops.aten

#: Memory formats under which a clone's layout follows its input's (None: the default).
_LAYOUT_FOLLOWS_INPUT = (None, torch.preserve_format)
#: Metadata queries whose answer is the same for any layout of the same sizes.
_SIZE_QUERIES = frozenset(
    {
        aten.sym_size.int,
        aten.sym_size.default,
        aten.sym_numel.default,
        aten.is_same_size.default,
    }
)


class OverwrittenClones(RecordingPass):
    """A torch.fx pass making ``clone(a)`` then ``copy_(clone, b)`` into ``clone(b)``.

    Only where Note [Overwritten clones] proves it; mutates its input. Its result's ``records``
    hold one :class:`Record` per clone overwritten by a ``copy_``: ``"reclone"`` or ``"kept"``.

    Run it after the dead metadata checks are gone (``_has_same_storage_numel`` reads a
    layout, which keeps every clone it is downstream of), as ``fxviews.rewrite`` does.

    Example::

        >>> gm = fxviews.trace(push_jvp, x, y, yt); remove_dead_pure_nodes(gm)
        >>> [(r.before, r.after) for r in OverwrittenClones()(gm).records]
        [('clone(x_1); copy_(clone, alias)', 'clone(alias)')]
    """

    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        graph = graph_module.graph
        candidates = [
            (copy.args[0], copy)
            for copy in graph.find_nodes(op="call_function", target=aten.copy_.default)
            if _is_clone(copy.args[0])
        ]
        if not candidates:
            return RecordedPassResult(graph_module, False)
        proof = _Proof(graph)
        replacer = OutputDeferringReplacer(graph)
        records = []
        rewritten = []
        for clone, copy in candidates:
            before = f"{_describe(clone)}; {_describe(copy)}"
            why = proof.why_kept(clone, copy)
            if why is not None:
                records.append(_record(clone, before, "", "kept", why))
                continue
            clone.replace_input_with(clone.args[0], copy.args[1])
            replacer.replace(copy, clone)
            rewritten.append(copy)
            reason = f"{copy.name} overwrites every element before anything reads one"
            records.append(_record(clone, before, _describe(clone), "reclone", reason))
        replacer.finish()
        for copy in rewritten:
            graph.erase_node(copy)
        if rewritten:
            graph.lint()
            if self.recompile:
                graph_module.recompile()
        return RecordedPassResult(graph_module, bool(rewritten), records)


class _Proof:
    """The facts of one graph the conditions read, each gathered once: positions at once, the
    alias analysis and the layout sweep when a candidate first gets that far."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.position = {node: i for i, node in enumerate(graph.nodes)}

    @functools.cached_property
    def aliases(self) -> AliasAnalysis:
        return AliasAnalysis(self.graph)

    def why_kept(self, clone: torch.fx.Node, copy: torch.fx.Node) -> str | None:
        """The first condition of Note [Overwritten clones] that fails, or None if all hold."""
        source = copy.args[1] if len(copy.args) > 1 else None
        if not isinstance(source, torch.fx.Node):
            return f"{copy.name} copies {source!r}, not a graph value"
        return (
            _unreadable_call(clone, copy, source)
            or _overwrite_mismatch(clone, source)
            or self._read_before(clone, copy)
            or self._source_changes(clone, copy, source)
            or self._layout_mismatch(clone, source)
        )

    def _read_before(self, clone: torch.fx.Node, copy: torch.fx.Node) -> str | None:
        """Condition 3: only pure views of the clone before the copy, and only views of those."""
        end = self.position[copy]
        views, stack = {clone}, [clone]
        while stack:
            node = stack.pop()
            for user in node.users:
                if user is copy or self.position[user] > end:
                    continue
                is_view = user.op == "call_function" and user.target in LAYOUT_VIEWS
                if not (is_view and user.args[0] is node):
                    return f"{_describe(user)} uses {node.name} before {copy.name} overwrites it"
                if user not in views:
                    views.add(user)
                    stack.append(user)
        return None

    def _source_changes(
        self, clone: torch.fx.Node, copy: torch.fx.Node, source: torch.fx.Node
    ) -> str | None:
        """Condition 4: ``source`` exists at the clone and keeps its value until the copy."""
        if self.position[source] > self.position[clone]:
            return f"{source.name} is made after {clone.name}"
        writer = self.aliases.written_between(source, clone, copy)
        if writer is not None:
            return f"{_describe(writer)} writes {source.name} between {clone.name} and {copy.name}"
        return None

    def _layout_mismatch(self, clone: torch.fx.Node, source: torch.fx.Node) -> str | None:
        """Condition 5: the clone's layout is the same from ``source`` as from its input."""
        if clone.kwargs.get("memory_format") is torch.contiguous_format:
            return None
        if clone.kwargs.get("memory_format") not in _LAYOUT_FOLLOWS_INPUT:
            return f"{clone.name} asks for {clone.kwargs['memory_format']}"
        traced, val = traced_tensor(clone), traced_tensor(source)
        facts = ShapeFacts.of([traced, val])
        for dim, (size, a, b) in enumerate(
            zip(traced.shape, traced.stride(), val.stride(), strict=True)
        ):
            if not (_proven_equal(a, b, facts) or _proven_equal(size, 1, facts)):
                return f"{source.name} has another layout than {clone.name} (dim {dim})"
        bound = self._layout_bound_below.get(clone)
        if bound is not None:
            return f"{_describe(bound)}, downstream of {clone.name}, depends on its layout"
        return None

    @functools.cached_property
    def _layout_bound_below(self) -> dict[torch.fx.Node, torch.fx.Node]:
        """Node -> a layout-dependent node reachable from it (itself included), where any is."""
        below: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in reversed(self.graph.nodes):
            if _depends_on_layout(node):
                below[node] = node
                continue
            found = next((below[u] for u in node.users if u in below), None)
            if found is not None:
                below[node] = found
        return below


def _is_clone(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is aten.clone.default
    )


def _unreadable_call(
    clone: torch.fx.Node, copy: torch.fx.Node, source: torch.fx.Node
) -> str | None:
    """Condition 1: the two calls are the plain ones, and every value has tensor metadata."""
    if len(clone.args) != 1 or set(clone.kwargs) - {"memory_format"}:
        return f"{clone.name} has arguments other than its input and memory_format"
    if len(copy.args) > 3 or set(copy.kwargs) - {"non_blocking"}:
        return f"{copy.name} has unexpected arguments"
    non_blocking = copy.args[2] if len(copy.args) > 2 else copy.kwargs.get("non_blocking", False)
    if non_blocking is not False:
        return f"{copy.name} is non_blocking"
    for node in (clone.args[0], clone, source):
        if not isinstance(node, torch.fx.Node) or tensor_val(node) is None:
            return f"{getattr(node, 'name', node)} has no tensor metadata"
    return None


def _overwrite_mismatch(clone: torch.fx.Node, source: torch.fx.Node) -> str | None:
    """Condition 2: the copy writes every element, converting nothing."""
    traced, val = traced_tensor(clone), traced_tensor(source)
    if traced.dtype != val.dtype:
        return f"{source.name} is {val.dtype}, {clone.name} {traced.dtype}: copy_ casts"
    if traced.device != val.device:
        return f"{source.name} is on {val.device}, {clone.name} on {traced.device}"
    if val.is_conj() or val.is_neg():
        return f"{source.name} has a lazy conjugate or negative bit"
    facts = ShapeFacts.of([traced, val])
    if traced.dim() != val.dim() or not all(
        _proven_equal(a, b, facts) for a, b in zip(traced.shape, val.shape, strict=True)
    ):
        return (
            f"{source.name} has sizes {list(val.shape)}, {clone.name} {list(traced.shape)}: "
            "copy_ broadcasts"
        )
    return None


def _depends_on_layout(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result, or its effect, may differ with its inputs' layout (5b)."""
    if node.op != "call_function":
        return False  # placeholders, get_attr, output: the output's strides are Note's last word
    if is_opaque(node) or node.target in METADATA_MUTATIONS:
        return True
    if node.target is aten.view.dtype or layout_dependence(node) is not None:
        return True
    if isinstance(node.target, OpOverload) and node.target not in _SIZE_QUERIES:
        returns = op_schema(node.target).returns
        return not all(_is_tensor_type(r.type) for r in returns)
    return False


def _is_tensor_type(kind: Any) -> bool:
    """A schema return type made of tensors: ``Tensor``, ``Tensor?``, ``Tensor[]``."""
    text = str(kind)
    return text.startswith("Tensor") or text in ("List[Tensor]", "Optional[Tensor]")


def _proven_equal(a: Any, b: Any, facts: ShapeFacts | None) -> bool:
    """``a == b`` for every size the graph runs at (ints compare; SymInts need a proof)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if facts is None:
        return False
    try:
        return facts.equal(facts.expression(a), facts.expression(b))
    except Unproven:
        return False


def _describe(node: torch.fx.Node) -> str:
    assert callable(node.target)
    return describe_call(node.target, node.args, node.kwargs)


def _record(node: torch.fx.Node, before: str, after: str, method: str, reason: str) -> Record:
    return Record(node.name, before, after, method, reason, kind=RecordKind.OVERWRITTEN_CLONE)
