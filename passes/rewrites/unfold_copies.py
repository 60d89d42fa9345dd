"""A model's own ``unfold`` written as copies, for consumers without it (opt in).

Note [A model's own unfold]
---------------------------
Core ATen has no ``unfold``: ExecuTorch's ``to_edge`` refuses a program holding one, and TVM
Relax has no converter for it. The windows the engine writes for an as_strided are copies there
(Note [Windows in core ATen]); :class:`UnfoldCopies` writes a model's own ``unfold`` (patches,
frames) the same way, where the caller asks (``fxviews.rewrite(ep, opset="core_aten",
copy_unfolds=True)``). For each ``aten.unfold.default`` node:

1. its input has static sizes (its fake value), and the windows are one
   :class:`~.copied_windows.WindowsByCopies` step of its ``(dim, size, step)``: slices of
   blocks joined by ``cat``, or one ``index_select`` for long windows;
2. the step is verified like a copied chain (``verify_chain_reads``): run on a tensor of the
   input's traced geometry whose storage holds each element's address, it must return the
   addresses the unfold's own result (its traced geometry) reads, index for index;
3. a copy is emitted only where no node can tell it from the view: in a graph that writes no
   tensor in place (export's functional programs), and where no later as_strided reads the
   unfold's memory with strides meant for the view;
4. its nodes replace the unfold, with the unfold's sizes. A node left as it was gets a
   ``"kept"`` record saying why.

Example::

    >>> result = UnfoldCopies()(gm)   # gm: image.permute(0, 2, 3, 1).unfold(1, 4, 4)
    >>> [(r.method, r.after) for r in result.records]
    [('copied', 'permute(view(permute, [1, 2, 4, 8, 3]), [0, 1, 3, 4, 2])')]
"""

from __future__ import annotations

from typing import cast

import torch
import torch.fx

from ..analysis.aliasing import written_arguments
from ..analysis.as_strided_calls import feeds_as_strided
from ..chains.copied_windows import WindowsByCopies
from ..chains.emission import GraphEmitter
from ..chains.verification import verify_chain_reads
from ..compat.torch_internals import disable_current_modes
from ..geometry.concrete import Geometry
from ..graph_edits import describe_call
from ..schema import Record, RecordedPassResult, RecordKind
from .pass_base import RecordingPass

aten = torch.ops.aten

__all__ = ["UnfoldCopies"]


class UnfoldCopies(RecordingPass):
    """A torch.fx pass writing each ``unfold`` node as verified copies (mutates its input).

    Its result's ``records`` hold one :class:`Record` (kind ``unfold``) per unfold node:
    method ``"copied"``, or ``"kept"`` with the reason. ``recompile=False`` leaves
    ``graph_module.recompile()`` to the caller.

    Example::

        >>> UnfoldCopies()(gm).records[0].method
        'copied'
    """

    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        graph = graph_module.graph
        nodes = [n for n in graph.nodes if n.op == "call_function" and n.target is _UNFOLD]
        if not nodes:
            return RecordedPassResult(graph_module, False)
        writes = next((n for n in graph.nodes if written_arguments(n)), None)
        # Verification and the new nodes' values run ops on real and fake tensors: a tracer
        # active around the pass must neither record nor intercept them.
        with disable_current_modes():
            records = [_copied(graph, node, writes) for node in nodes]
        return self.finished(graph_module, records)


_UNFOLD = aten.unfold.default


def _copied(graph: torch.fx.Graph, node: torch.fx.Node, writes: torch.fx.Node | None) -> Record:
    """Replace ``node`` by its windows' copies (see the Note), or keep it; its record."""
    before = describe_call(node.target, node.args, node.kwargs)

    def kept(reason: str) -> Record:
        return Record(node.name, before, before, "kept", reason, kind=RecordKind.UNFOLD)

    source, *numbers = node.args
    if node.kwargs or not isinstance(source, torch.fx.Node) or len(numbers) != 3:
        return kept("its arguments are not a tensor and three ints, positional, as export writes")
    if not all(type(n) is int for n in numbers):
        return kept("its dim, size and step are not ints")
    dim, size, step = cast(list[int], numbers)
    value, out = source.meta.get("val"), node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(out, torch.Tensor):
        return kept("its input or result has no tensor metadata")
    geometries = [Geometry.of(value), Geometry.of(out)]
    if not all(type(i) is int for g in geometries for i in (*g.sizes, *g.strides, g.offset)):
        return kept("its windows are copied for static sizes only")
    if writes is not None:
        return kept(f"the graph writes tensors in place ({writes.name!r}): a copy is no view")
    if feeds_as_strided(node):
        return kept("a later as_strided reads its memory")
    windows = WindowsByCopies(_UNFOLD, (dim % value.ndim, size, step), tuple(value.shape))
    if not verify_chain_reads((windows,), *geometries):
        return kept("its copies could not be verified (a storage over the limit)")
    emitter = GraphEmitter(graph, node)
    with graph.inserting_before(node):
        replacement = windows.apply(source, emitter)
    node.replace_all_uses_with(replacement)
    graph.erase_node(node)
    after = windows.describe(source.name)
    reason = "verified by its reads"
    return Record(node.name, before, after, "copied", reason, kind=RecordKind.UNFOLD)
