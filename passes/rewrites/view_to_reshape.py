"""ViewToReshape: turn ``view`` into ``reshape`` where nobody can tell the two apart.

Note [ViewToReshape]
--------------------
``aten.view`` (and ``_unsafe_view``, ``_reshape_alias``) bakes in that its input's layout can be
viewed at the requested sizes. A graph traced on contiguous examples holds such views; under
``vmap`` with the batch dim physically between two merged dims, or on a non-contiguous input,
they raise "view size is not compatible with input tensor's size and stride". ``reshape`` gives
the same values on every layout (a view where one exists, a copy otherwise); it differs from
``view`` only in whether the result shares memory with its input. Likewise ``view_as_complex``
needs a last dim of stride 1, which a contiguous ``clone`` of its input provides.

So a view is rewritten exactly where sharing memory is not observable. With the alias
classes and writes of :class:`~.aliasing.AliasAnalysis` (see Note [Alias analysis]), a view
node ``v`` at position ``p`` is *observed*, and kept, if

- its class is written at a position after ``p`` (a copy would miss that write, or the
  write would miss the copy's readers), or
- ``v`` or an alias derived from it is a graph output while the rest of its class holds a
  graph input or another output (a copy would break that output's aliasing).

Otherwise ``view``/``_unsafe_view``/``_reshape_alias`` become ``reshape`` and
``view_as_complex(x)`` becomes ``view_as_complex(clone(x, memory_format=contiguous))``.
Kept views stay layout-bound; layout pinning (:mod:`.pinning`) handles them next.

The classes are computed once, before any rewrite. Rewriting only removes sharing, so a class
can only shrink and every decision made on the original classes stays conservative.
``view_as_real`` accepts any layout of its complex input and is left alone.

Cost: the analysis's one scan of the graph, then per view a walk over the aliases derived
from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from ..analysis.aliasing import AliasAnalysis
from ..chains.emission import GraphEmitter
from ..compat.fake_modes import no_new_guards
from ..compat.torch_internals import reshape_alias, unsafe_view
from ..graph_edits import OutputDeferringReplacer, describe_call, input_node
from ..schema import Record, RecordedPassResult, RecordKind
from .pass_base import RecordingPass

aten = torch.ops.aten

#: View ops whose only layout assumption is that the input is viewable at the new sizes.
RESHAPEABLE = (aten.view.default, unsafe_view, reshape_alias)
#: View ops that need their input's last dim to have stride 1.
NEEDS_UNIT_LAST_STRIDE = (aten.view_as_complex.default,)


class ViewToReshape(RecordingPass):
    """A torch.fx pass making layout-bound views layout-portable (mutates its input).

    Its result's ``records`` hold one :class:`Record` per ``view``/``_unsafe_view``/
    ``_reshape_alias``/``view_as_complex`` node seen: method ``"reshape"`` if rewritten,
    ``"kept"`` with the reason its aliasing is observable otherwise.

    Example::

        >>> gm = make_fx(lambda x: x.clone().view(-1))(torch.randn(2, 3))
        >>> result = ViewToReshape()(gm)
        >>> result.modified
        True
        >>> result.records[0].after
        'reshape(clone, [-1])'
    """

    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        graph = graph_module.graph
        nodes = [n for n in graph.nodes if _is_target(n)]
        if not nodes:
            return RecordedPassResult(graph_module, False)
        analysis = AliasAnalysis(graph)
        replacer = OutputDeferringReplacer(graph)
        records = [_handle(graph, node, analysis.why_observed(node), replacer) for node in nodes]
        for replaced in replacer.finish():
            graph.erase_node(replaced)
        return self.finished(graph_module, records)


def _is_target(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (*RESHAPEABLE, *NEEDS_UNIT_LAST_STRIDE)


def _handle(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    observed: str | None,
    replacer: OutputDeferringReplacer,
) -> Record:
    """Rewrite ``node`` unless its aliasing is ``observed``; the record says which and why."""
    before = describe_call(node.target, node.args)
    if observed is not None:
        reason = f"aliasing is observable: {observed}"
        return Record(node.name, before, "", "kept", reason, kind=RecordKind.VIEW)
    source = input_node(node)
    # The view is valid at every size the graph allows (traced under its guards, or proven by
    # the as_strided pass), so reshape's fake kernel asks nothing new: it must guard nothing.
    with graph.inserting_before(node), no_new_guards(source.meta.get("val")):
        emit = _emitter(graph, node)
        if node.target in RESHAPEABLE:
            new = emit(aten.reshape.default, source, node.args[1])
            after = describe_call(aten.reshape.default, [source, node.args[1]])
            reason = "no alias observed: reshape gives the same values on any layout"
        else:
            contiguous_format = {"memory_format": torch.contiguous_format}
            contiguous = emit(aten.clone.default, source, **contiguous_format)
            new = emit(node.target, contiguous)
            copy = describe_call(aten.clone.default, [source], contiguous_format)
            after = describe_call(node.target, [copy])
            reason = "no alias observed: a contiguous copy gives the last dim stride 1"
    replacer.replace(node, new)
    if not node.users:  # else the output still holds it: erased after finish()
        graph.erase_node(node)
    return Record(node.name, before, after, "reshape", reason, kind=RecordKind.VIEW)


def _emitter(graph: torch.fx.Graph, like: torch.fx.Node) -> Callable[..., torch.fx.Node]:
    """GraphEmitter (fills ``meta['val']``) when the source has metadata, else bare nodes."""
    if "val" in input_node(like).meta:
        return GraphEmitter(graph, like)
    return lambda op, *args, **kwargs: graph.call_function(op, args, kwargs)
