"""LayoutPinning: give every layout-bound node, at run time, the layout it had at trace time.

Note [Layout pinning]
---------------------
After the rewrite some nodes still depend on the memory layout their input had when the graph
was traced. Under ``vmap`` the batch dim may sit physically anywhere, so each sample's layout
differs from the traced one and these nodes raise or, worse, return wrong numbers:

- a ``view``/``_unsafe_view`` that merges dims (kept by the reshape step because its aliasing
  is observable): "view size is not compatible" when the batch dim sits between merged dims;
- ``view_as_complex``: needs a last dim of stride 1;
- ``_reshape_alias`` and every kept ``as_strided`` variant: they bake strides and an offset,
  read relative to the traced layout, and are silently wrong on another one;
- kernels that assume a layout (:data:`LAYOUT_KERNELS`, found by measurement): raise or are
  silently wrong on non-contiguous samples.

The fix rests on one fact: vmap's batching rule for ``clone(memory_format=contiguous_format)``
moves the batch dim to the front, so every sample is contiguous; ``permute(p)``, that clone and
``permute(p^-1)`` give every sample any dense layout. The algorithm, per layout-bound node:

1. A kernel gets a contiguous clone of each tensor argument at the call. Kernels are
   out-of-place, so nobody can tell the copy from the argument.
2. Any other node reads memory through its first argument. Follow its alias edges upwards
   (:meth:`~.aliasing.AliasAnalysis.ancestry`) to the nodes that made that memory. The view
   ops, in-place ops and metadata changes in between are functions of their input's layout, so
   making the memory at its traced layout makes the node's input have its traced layout too.
   Each origin must be
   - a buffer the graph allocates itself: ``clone`` gets ``memory_format=contiguous_format``
     (no extra copy); ``empty_like``/``zeros_like``/``ones_like``/``full_like`` become the
     matching ``new_*`` op, whose batching rule already puts the batch dim first; any other
     allocation (``*_like`` of another kind, outputs of out-of-place ops) gets a contiguous
     ``clone`` right after it, standing in for it everywhere. A buffer made ``new_*`` or by a
     factory without tensor inputs already has its traced layout on every sample.
   - Never a graph input (placeholder or ``get_attr``): the caller chooses its layout and its
     aliasing is observable, so the node is kept, with the reason. So are nodes whose memory
     passes through an opaque call or an in-place ``set_``/``resize_`` (their layout cannot be
     followed), and buffers whose traced layout is not dense.
3. Each pin is verified before it is emitted: on meta tensors, the pinned buffer must have the
   traced buffer's exact sizes, strides (dims of size > 1) and offset.
4. A kept ``as_strided``/``as_strided_copy`` that reads outside its input (vmap refuses that
   on any layout) reads the pinned buffer instead, when that buffer is its whole storage:
   ``as_strided`` addresses the storage, so it reads the same elements.

A call that decides view or copy by its input's layout (``reshape``, ``contiguous``, ...,
kept as the user wrote it by fxviews' tracer: ``meta[LAYOUT_DECISION]``, Note [Layout decisions
at run time]) is layout-bound where its choice is observable (its memory is written afterwards,
or returned aliasing an input) and its memory is a buffer the graph makes: under ``vmap`` vmap's
rules lay out such a buffer otherwise than eager lays out one sample's, so the buffer is pinned
as above and the call decides as on one sample. Over a graph input the caller's layout decides,
as in eager: nothing is done.

Kept ``as_strided_`` and ``as_strided_scatter`` are not pinned: torch's vmap gets the first
wrong and refuses the second on every layout. They are kept, with that reason.

Buffers are pinned once, however many layout-bound nodes read them, and only when one does:
a graph without layout-bound nodes is left untouched.

Cost: one alias analysis, then per layout-bound node a walk over its ancestry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..analysis.aliasing import AliasAnalysis, is_opaque
from ..analysis.as_strided_calls import bind_as_strided
from ..chains.emission import GraphEmitter
from ..compat.torch_internals import (
    embedding_bag,
    embedding_bag_forward_only,
    flash_attention_cpu,
    flash_attention_cpu_backward,
    linalg_det,
    linalg_slogdet,
    pdist_backward,
    pdist_forward,
    reshape_alias,
    unsafe_view,
)
from ..errors import FxViewsError
from ..geometry.concrete import Geometry, equivalent
from ..graph_edits import (
    argument_nodes,
    describe_call,
    input_node,
    op_name,
    tensor_val,
    traced_tensor,
)
from ..op_tables import AS_STRIDED_OPS
from ..schema import LAYOUT_DECISION, LAYOUT_DOUBT, Record, RecordedPassResult, RecordKind
from ..source_lines import source_line
from .pass_base import RecordingPass

aten = torch.ops.aten

#: Kernels that assume their inputs' layout, with what they do on a non-contiguous sample.
#: Measured, not guessed: ``python -m tests.kernel_layout_sweep`` runs every aten call of the
#: OpInfo samples (forward and vjp, CPU float32) and of the scaled-dot-product-attention family
#: under vmap with each sample contiguous (batch dim first) and non-contiguous (batch dim last);
#: these are the out-of-place overloads right in the first case and wrong or raising in the
#: second (451 overloads measured on torch 2.13; ``_embedding_bag``, the differentiable twin of
#: ``_embedding_bag_forward_only``, was checked by hand). ``_linalg_det``/``_linalg_slogdet``
#: return the right determinant but the LU factors of another layout, which their backward
#: reads. The sweep also lists ``view_as_complex``, ``as_strided`` and ``as_strided_copy``
#: (layout-bound views: their buffers are pinned instead) and ``resize_`` (an in-place metadata
#: change whose batching rule needs the batch dim first: no copy can help).
LAYOUT_KERNELS: dict[Any, str] = {
    flash_attention_cpu: "silently wrong numbers",
    flash_attention_cpu_backward: "silently wrong numbers",
    embedding_bag_forward_only: "silently wrong numbers",
    embedding_bag: "silently wrong numbers",
    aten.fractional_max_pool2d_backward.default: "silently wrong numbers",
    linalg_det: "silently wrong LU factors",
    linalg_slogdet: "silently wrong LU factors",
    aten.native_group_norm.default: "raises: Expected X.is_contiguous(memory_format)",
    pdist_forward: "raises: _pdist_forward requires contiguous input",
    pdist_backward: "raises: _pdist_backward requires self to be contiguous",
}


#: Views that fail when they merge dims the layout does not let them merge.
_MERGING_VIEWS = (aten.view.default, unsafe_view)
#: Nodes that bake strides (and an offset) relative to their input's traced layout.
BAKED_STRIDES = (reshape_alias, *AS_STRIDED_OPS)
#: Layout-bound nodes vmap gets wrong whatever the layout (torch 2.13): pinning cannot help.
VMAP_REFUSES = {
    aten.as_strided_.default: "vmap has no rule for in-place as_strided_ and its fallback "
    "leaves the batched tensor's sizes as they were: wrong under vmap on any layout",
    aten.as_strided_scatter.default: "as_strided_scatter has no batching rule: vmap refuses it",
}
#: Kept ``as_strided`` variants that read a buffer's storage and can read it from the buffer.
_REBASABLE = (aten.as_strided.default, aten.as_strided_copy.default)
#: ``*_like`` allocations and the ``new_*`` op with the same values and a batch-first rule.
_LIKE_TO_NEW = {
    aten.empty_like.default: aten.new_empty.default,
    aten.zeros_like.default: aten.new_zeros.default,
    aten.ones_like.default: aten.new_ones.default,
    aten.full_like.default: aten.new_full.default,
}
#: Allocations whose batching rule makes every sample at the requested (traced) layout.
_BATCH_FIRST_ALLOCATIONS = {
    aten.new_empty.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty_strided.default,
}
#: In-place ops that replace a tensor's storage: the layout of its memory is not followed.
STORAGE_RESETS = {
    aten.set_.source_Tensor,
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
    aten.resize_.default,
    aten.resize_as_.default,
}
_KWARGS_NOT_FOR_NEW = ("memory_format",)


def layout_dependence(node: torch.fx.Node) -> str | None:
    """Why ``node``'s result depends on its inputs' traced layout, or None if it does not.

    Example::

        >>> layout_dependence(view_node)  # view(clone, [12]) of a (3, 4) clone
        'merges dims [3, 4] -> [12]'
    """
    if node.op != "call_function":
        return None
    if node.target in LAYOUT_KERNELS:
        return f"a kernel that assumes its inputs' layout ({LAYOUT_KERNELS[node.target]})"
    if node.target in BAKED_STRIDES:
        return "bakes strides relative to its input's traced layout"
    if node.target is aten.view_as_complex.default:
        return "needs a last dim of stride 1"
    if node.target in _MERGING_VIEWS:
        before, after = tensor_val(node.args[0]), tensor_val(node)
        if before is None or after is None:
            return "merges dims, as far as anyone can tell without tensor metadata"
        if merges_dims(list(before.shape), list(after.shape)):
            return f"merges dims {list(before.shape)} -> {list(after.shape)}"
    return None


def merges_dims(before: list[Any], after: list[Any]) -> bool:
    """Whether viewing sizes ``before`` as ``after`` joins two dims of size > 1 into one.

    Splitting dims and adding or removing dims of size 1 is viewable on any layout; joining
    is not. Symbolic sizes count as joining (the answer could depend on their values).

    Example::

        >>> merges_dims([3, 4], [12]), merges_dims([12], [3, 1, 4])
        (True, False)
    """
    if not all(isinstance(s, int) for s in [*before, *after]):
        return True
    old = [s for s in before if s != 1]
    new = [s for s in after if s != 1]
    i = j = 0
    while i < len(old) and j < len(new):
        covered = new[j]
        j += 1
        while covered < old[i] and j < len(new):  # old[i] is split into new[j_start:j]
            covered *= new[j]
            j += 1
        if covered != old[i]:
            return True
        i += 1
    return False


@dataclass
class _Pin:
    """How one buffer gets its traced layout: a description, and the edit (None: no edit)."""

    after: str
    edit: Any = None  # a callable(graph) -> bool: whether it changed the graph


class LayoutPinning(RecordingPass):
    """A torch.fx pass giving layout-bound nodes their traced layout (mutates its input).

    Its result's ``records`` hold one :class:`Record` per layout-bound node: method
    ``"pinned"`` with what was done, or ``"kept"`` with why its layout cannot be pinned.

    Example::

        >>> def f(x, y):
        ...     base = x.clone(); flat = base.view(-1); base.mul_(y); return flat
        >>> gm = make_fx(f)(torch.randn(2, 3), torch.randn(2, 3))
        >>> result = LayoutPinning()(gm)
        >>> result.modified
        True
        >>> result.records[0].after
        'clone(x_1, memory_format=torch.contiguous_format)'
    """

    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        graph = graph_module.graph
        bound = [(n, why) for n in graph.nodes if (why := layout_dependence(n)) is not None]
        decided = [n for n in graph.nodes if LAYOUT_DECISION in n.meta]
        if not bound and not decided:
            return RecordedPassResult(graph_module, False)
        analysis = AliasAnalysis(graph)
        pins: dict[torch.fx.Node, _Pin | str] = {}  # origin -> its pin, or why it has none
        kernels: list[tuple[torch.fx.Node, str]] = []
        planned: list[tuple[Record, list[torch.fx.Node]]] = []
        for node, why in bound:
            if node.target in LAYOUT_KERNELS:
                kernels.append((node, why))
            else:
                planned.append(_plan_node(node, why, analysis, pins))
        for node in decided:
            why = _observed_decision(node, analysis)
            if why is not None:
                planned.append(_plan_node(node, why, analysis, pins))
        records = [record for record, _ in planned]
        # Only buffers of pinned nodes: a node kept for another origin needs no copy.
        needed = dict.fromkeys(o for r, origins in planned if r.method == "pinned" for o in origins)
        modified = False
        for origin in needed:
            pin = pins[origin]
            modified = (isinstance(pin, _Pin) and pin.edit is not None and pin.edit(graph)) or (
                modified
            )
        for node, why in kernels:
            record = _pin_kernel_arguments(graph, node, why)
            modified = modified or record.method == "pinned"
            records.append(record)
        if modified:
            graph.lint()
            if self.recompile:
                graph_module.recompile()
        return RecordedPassResult(graph_module, modified, records)


def _plan_node(
    node: torch.fx.Node,
    why: str,
    analysis: AliasAnalysis,
    pins: dict[torch.fx.Node, _Pin | str],
) -> tuple[Record, list[torch.fx.Node]]:
    """Plan pins for the origins of ``node``'s memory: its record, and the origins to pin."""
    before = describe_call(node.target, node.args)
    source = node.args[0]
    if node.target in VMAP_REFUSES:
        return _kept(node, before, f"{why}; {VMAP_REFUSES[node.target]}"), []
    if LAYOUT_DOUBT in node.meta:  # pinning would give its memory the layout eager lacks
        return _kept(node, before, f"{why}; {node.meta[LAYOUT_DOUBT]}"), []
    if not isinstance(source, torch.fx.Node):
        return _kept(node, before, f"{why}; its input is not a graph value"), []
    reason = _unfollowable(analysis.ancestry(source))
    if reason is not None:
        return _kept(node, before, f"{why}; {reason}"), []
    origins = analysis.origins(source)
    for origin in origins:
        if origin not in pins:
            pins[origin] = _plan_pin(origin)
    chosen = [pins[o] for o in origins]
    refused = [pin for pin in chosen if isinstance(pin, str)]
    if refused:
        return _kept(node, before, f"{why}; {refused[0]}"), []
    after = "; ".join(pin.after for pin in chosen if isinstance(pin, _Pin))
    reason = f"{why}: its memory is made as traced"
    if len(origins) == 1 and _rebase_onto_buffer(node, origins[0]):
        after += f"; reads {origins[0].name} itself"
        reason += ", and it reads that whole buffer, not just its input"
    return _pinned(node, before, after, reason), origins


def _observed_decision(node: torch.fx.Node, analysis: AliasAnalysis) -> str | None:
    """Why a layout-deciding call (see the Note) needs its buffer's traced layout, or None: its
    choice is not observable, or its memory is a graph input, whose layout decides as in eager."""
    observed = analysis.why_observed(node)
    source = node.args[0]
    if observed is None or not isinstance(source, torch.fx.Node):
        return None
    if any(n.op in ("placeholder", "get_attr") for n in analysis.ancestry(source)):
        return None
    return f"decides view or copy by its input's layout, and {observed}"


def _kept(node: torch.fx.Node, before: str, reason: str) -> Record:
    return _layout_record(node, before, "", "kept", reason)


def _pinned(node: torch.fx.Node, before: str, after: str, reason: str) -> Record:
    return _layout_record(node, before, after, "pinned", reason)


def _layout_record(
    node: torch.fx.Node, before: str, after: str, method: str, reason: str
) -> Record:
    return Record(
        node.name,
        before,
        after,
        method,
        reason,
        kind=RecordKind.LAYOUT_BOUND,
        source=source_line(node),
    )


def _rebase_onto_buffer(node: torch.fx.Node, buffer: torch.fx.Node) -> bool:
    """Point an ``as_strided`` that reads outside its input at the buffer holding that memory.

    ``as_strided`` addresses its input's storage, so on a buffer that is its whole storage it
    reads exactly the same elements. vmap refuses an ``as_strided`` that reaches outside its
    input; over the whole pinned buffer it is inside. Returns whether ``node`` was changed.
    """
    if node.target not in _REBASABLE:
        return False
    bound = bind_as_strided(node)
    source, held = tensor_val(bound["self"]), tensor_val(buffer)
    if source is None or held is None:
        return False
    offset = bound["storage_offset"]
    offset = source.storage_offset() if offset is None else offset
    numbers = [*bound["size"], *bound["stride"], offset]
    if not all(isinstance(n, int) for n in numbers):
        return False
    low, high = Geometry(tuple(bound["size"]), tuple(bound["stride"]), int(offset)).bounds()
    exposed_low, exposed_high = Geometry.of(source).bounds()
    if exposed_low <= low and high <= exposed_high:
        return False  # inside its input already: vmap accepts it as it is
    whole = held.storage_offset() == 0 and held.untyped_storage().nbytes() == (
        held.numel() * held.element_size()
    )
    if not whole or low < 0 or high >= held.numel():
        return False
    node.args = (buffer, list(bound["size"]), list(bound["stride"]), offset)
    node.kwargs = {}
    return True


def _unfollowable(ancestry: list[torch.fx.Node]) -> str | None:
    for node in ancestry:
        if is_opaque(node):
            return f"its memory passes through the opaque call {node.name!r}"
        if node.target in STORAGE_RESETS:
            return f"its storage is replaced in place at {node.name!r}"
        if node.op in ("placeholder", "get_attr"):
            return (
                f"its memory is graph input {node.name!r}, whose layout and aliasing the "
                "caller owns: it cannot be pinned"
            )
    return None


def _plan_pin(origin: torch.fx.Node) -> _Pin | str:
    """How the buffer ``origin`` makes its memory at its traced layout, or why it cannot."""
    val = tensor_val(origin)
    if val is None:
        return f"buffer {origin.name!r} has no tensor metadata"
    if not argument_nodes((origin.args, origin.kwargs)):
        return _Pin(f"{origin.name} (a factory: unbatched, at its traced layout)")
    if origin.target in _BATCH_FIRST_ALLOCATIONS:
        return _Pin(f"{origin.name} (its batching rule makes each sample at its traced layout)")
    order = dense_order(val)
    if order is None:
        return f"buffer {origin.name!r} has a traced layout that is not dense: {Geometry.of(val)}"
    if origin.target is aten.clone.default:
        return _Pin(_pinned_text(origin), lambda graph: _pin_clone(graph, origin, order))
    if origin.target in _LIKE_TO_NEW and _is_identity(order):
        new_op = _LIKE_TO_NEW[origin.target]
        text = describe_call(new_op, [input_node(origin), list(val.shape)])
        return _Pin(text, lambda graph: _like_to_new(graph, origin, new_op))
    text = f"{_pinned_text(origin, copy_of=origin.name)} after {origin.name}"
    return _Pin(text, lambda graph: _pin_after(graph, origin, order))


def dense_order(val: torch.Tensor) -> list[int] | None:
    """A permutation ``p`` such that ``val.permute(p)`` is contiguous, or None if none is.

    Verified on a meta tensor: the contiguous tensor permuted back must have ``val``'s exact
    geometry (offset included), so a pin built from ``p`` reproduces the traced layout.

    Example::

        >>> dense_order(torch.empty(2, 3).t())
        [1, 0]
    """
    sizes, strides = list(val.shape), list(val.stride())
    if not all(isinstance(s, int) for s in [*sizes, *strides, val.storage_offset()]):
        return None
    order = sorted(range(val.dim()), key=lambda d: (-strides[d], d))
    permuted = torch.empty([sizes[d] for d in order], device="meta")
    rebuilt = permuted.permute(_inverse(order))
    return order if equivalent(Geometry.of(rebuilt), Geometry.of(val)) else None


def _is_identity(order: list[int]) -> bool:
    return order == list(range(len(order)))


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse


def _pinned_text(origin: torch.fx.Node, copy_of: str | None = None) -> str:
    source = copy_of or input_node(origin)
    return describe_call(aten.clone.default, [source], {"memory_format": torch.contiguous_format})


def _contiguous_copy(
    emit: GraphEmitter,
    source: torch.fx.Node,
    order: list[int],
    op: Any = aten.clone.default,
    **kwargs: Any,
) -> torch.fx.Node:
    """``op(source)`` with each sample at ``source``'s traced dense layout (``order``)."""
    identity = _is_identity(order)
    permuted = source if identity else emit(aten.permute.default, source, order)
    made = emit(op, permuted, **{**kwargs, "memory_format": torch.contiguous_format})
    return made if identity else emit(aten.permute.default, made, _inverse(order))


def _pin_clone(graph: torch.fx.Graph, origin: torch.fx.Node, order: list[int]) -> bool:
    """``clone(x)`` -> the same clone with contiguous samples, in its place: no extra copy."""
    if origin.kwargs.get("memory_format") == torch.contiguous_format and _is_identity(order):
        return False  # already pinned
    kwargs = {k: v for k, v in origin.kwargs.items() if k != "memory_format"}
    with graph.inserting_before(origin):
        pinned = _contiguous_copy(GraphEmitter(graph, origin), input_node(origin), order, **kwargs)
    _verify_and_replace(graph, origin, pinned)
    graph.erase_node(origin)
    return True


def _like_to_new(graph: torch.fx.Graph, origin: torch.fx.Node, new_op: Any) -> bool:
    """``zeros_like(x, ...)`` -> ``new_zeros(x, size, ...)`` (and the other ``*_like``)."""
    kwargs = {k: v for k, v in origin.kwargs.items() if k not in _KWARGS_NOT_FOR_NEW}
    size = list(traced_tensor(origin).shape)
    with graph.inserting_before(origin):
        pinned = GraphEmitter(graph, origin)(
            new_op, origin.args[0], size, *origin.args[1:], **kwargs
        )
    _verify_and_replace(graph, origin, pinned)
    graph.erase_node(origin)
    return True


def _pin_after(graph: torch.fx.Graph, origin: torch.fx.Node, order: list[int]) -> bool:
    """A contiguous-sample copy right after ``origin``, standing in for it everywhere."""
    with graph.inserting_before(origin.next):
        emit = GraphEmitter(graph, origin)
        pinned = _contiguous_copy(emit, origin, order)
    created = set(emit.created)
    _verify_and_replace(graph, origin, pinned, replace_in=lambda user: user not in created)
    return True


def _verify_and_replace(
    graph: torch.fx.Graph, origin: torch.fx.Node, pinned: torch.fx.Node, replace_in: Any = None
) -> None:
    """Every use of ``origin`` (those ``replace_in`` accepts) becomes ``pinned``, which must
    have ``origin``'s traced geometry."""
    expected, made = traced_tensor(origin), tensor_val(pinned)
    if made is None or not equivalent(Geometry.of(made), Geometry.of(expected)):
        raise FxViewsError(f"internal: the pin of {origin.name!r} lost its traced layout")
    origin.replace_all_uses_with(pinned, delete_user_cb=replace_in or (lambda user: True))


def _pin_kernel_arguments(graph: torch.fx.Graph, node: torch.fx.Node, why: str) -> Record:
    """Give each tensor argument of a layout-assuming kernel a contiguous clone at the call."""
    before = describe_call(node.target, node.args)
    arguments = [a for a in argument_nodes((node.args, node.kwargs)) if tensor_val(a) is not None]
    cloned: dict[torch.fx.Node, torch.fx.Node] = {}
    with graph.inserting_before(node):
        for argument in dict.fromkeys(arguments):
            if traced_tensor(argument).dim() == 0:
                continue
            emit = GraphEmitter(graph, argument)
            cloned[argument] = emit(
                aten.clone.default, argument, memory_format=torch.contiguous_format
            )
    if not cloned:
        return _kept(node, before, f"{why}; no tensor argument to pin")
    node.args, node.kwargs = torch.fx.node.map_arg(
        (node.args, node.kwargs), lambda a: cloned.get(a, a)
    )
    names = ", ".join(a.name for a in cloned)
    after = f"{op_name(node.target)}(contiguous clones of {names})"
    reason = f"{why}: each tensor argument gets a contiguous clone at the call"
    return _pinned(node, before, after, reason)
