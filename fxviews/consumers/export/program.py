"""``fxviews.rewrite`` for ``torch.export`` programs: a new ExportedProgram, signature kept valid.

Note [Rewriting an ExportedProgram]
-----------------------------------
An ExportedProgram is a graph plus a signature naming its placeholders (user inputs, lifted
parameters, buffers, constants) and, in order, what its output node returns (user outputs,
buffer and user-input mutations). The rewrite keeps that contract:

1. IR. torch.export's default IR (dialect ``TRAINING``) keeps forward AD and autograd as ops
   (``_make_dual``, ``_unpack_dual``): the as_strided they produce only appears once they are
   lowered. A training-IR program is therefore lowered with ``run_decompositions({})``: an
   empty table, so only what must change does (functionalization, autograd and forward-AD ops,
   which have no inference form); every other op (``linear``, ``conv2d``, ``layer_norm``,
   ``scaled_dot_product_attention``, ...) comes out as it went in, and each consumer's own
   decomposition (ONNX's, ExecuTorch's ``to_edge`` with the ops its partitioner keeps) sees
   the ops it would see without fxviews. A program already decomposed is used as it is, and
   one the steps leave alone comes out exactly as it was.
2. A copy of its graph module goes through the same steps as a GraphModule (engine, reshape
   step, hygiene). Placeholders are never touched, so the input specs stay valid.
3. The rewrite and hygiene replace returned nodes (an as_strided by its view chain, an alias by
   its input), so the names the output specs hold change; the output node's arguments keep
   their positions. The i-th output spec gets the i-th returned value's new name, and module
   call signatures get the same renaming.
4. A new ExportedProgram is built from the copy, the remapped signature and the original's
   state dict, constants, range constraints, module call graph and verifiers; its constructor
   validates it. The caller's program is never modified.

Dynamic dims: a node whose geometry is symbolic is rewritten only with a chain the engine
proves for every value the dims can take (export's shape environment, its ranges and guards),
and the ops it emits take plain ints (constants, positions counted from a dim's end, ``-1``),
so nothing emitted bakes a size a dynamic dim controls. Other symbolic nodes are kept with the
reason (``strict=True`` raises).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind, OutputSpec

from fxviews.consumers.export.decisions import settle_decisions, training_decisions
from fxviews.passes import FxViewsError, Opset
from fxviews.passes.compat.torch_internals import set_grad_enabled, wrap_with_set_grad_enabled
from fxviews.passes.graph_edits import pytree_spec_copies
from fxviews.rewriting.steps import RewriteResult, RewriteSteps, rewrite_graph

__all__ = ["ExportRewriteResult", "rewrite_exported"]


@dataclass
class ExportRewriteResult(RewriteResult):
    """:class:`~fxviews.RewriteResult` of an ExportedProgram.

    ``exported_program`` is the new program (``graph_module`` is its graph module);
    ``decomposed`` says whether the input was first decomposed out of the training IR.
    """

    exported_program: ExportedProgram = field(kw_only=True)
    decomposed: bool = field(default=False, kw_only=True)


def rewrite_exported(
    program: ExportedProgram,
    strict: bool = False,
    example_inputs: Sequence[Any] | None = None,
    steps: RewriteSteps = RewriteSteps(),  # noqa: B008 - frozen: one shared default is safe
    *,
    inference: bool = False,
) -> ExportRewriteResult:
    """Rewrite every provably safe ``as_strided`` of an exported program, into a new program.

    Called by :func:`fxviews.rewrite` for an ``ExportedProgram``; the options are its own
    (``steps``: the opset and layout steps its arguments ask for). A training-IR program
    (``torch.export.export``'s default) is lowered first, with an empty decomposition table,
    since that IR hides the as_strided of forward AD and autograd. Lowering inlines grad-mode
    regions, so a program holding one is refused unless ``inference`` says no gradient will be
    taken of the result (the ONNX and ExecuTorch consumers).

    Example::

        >>> ep = torch.export.export(module, args)
        >>> res = fxviews.rewrite(ep)
        >>> torch.export.save(res.exported_program, "model.pt2")   # validates, saves, loads
    """
    if example_inputs is not None:
        raise ValueError(
            "example_inputs is for GraphModules without metadata; an ExportedProgram has it"
        )
    decomposed = program.dialect == "TRAINING"
    if decomposed and not inference:
        _refuse_grad_mode_regions(program)
    # Note [Layout decisions in exported programs], read where the training IR still has them;
    # for the aten opset only: a core-ATen program goes to an edge runtime, whose tensors have
    # one layout, and has no reshape or contiguous to put back.
    layouts = steps.opset is Opset.ATEN
    returned = training_decisions(program.graph) if decomposed and layouts else None
    source = _run_decompositions(program) if decomposed else program
    # A program the steps leave alone stays exactly as it was (no dead code or alias dropped):
    # its compiler then sees what it would without fxviews.
    untouched_as_is = dataclasses.replace(steps, tidy_untouched=False)
    settled, put_back = (
        settle_decisions(source.graph_module, returned, _mutated_placeholders(source))
        if layouts
        else (source.graph_module, [])
    )
    result = rewrite_graph(settled, strict, steps=untouched_as_is)
    renames = _returned_renames(source.graph_module.graph, result.graph_module.graph)
    new_program = ExportedProgram(
        root=result.graph_module,
        graph=result.graph_module.graph,
        graph_signature=_remap_signature(source.graph_signature, result.graph_module.graph),
        state_dict=dict(source.state_dict),
        range_constraints=copy.deepcopy(source.range_constraints),
        module_call_graph=_remap_module_call_graph(source, result.graph_module.graph, renames),
        example_inputs=source.example_inputs,
        constants=dict(source.constants),
        verifiers=list(source.verifiers),
    )
    return ExportRewriteResult(
        graph_module=new_program.graph_module,
        records=result.records,
        modified=result.modified or bool(put_back),
        code_before=result.code_before,
        seconds=result.seconds,
        view_records=[*put_back, *result.view_records],
        pin_records=result.pin_records,
        clone_records=result.clone_records,
        unfold_records=result.unfold_records,
        exported_program=new_program,
        decomposed=decomposed,
    )


def _refuse_grad_mode_regions(program: ExportedProgram) -> None:
    """Refuse a training-IR program holding a grad-mode region (``with torch.no_grad():`` in the
    exported code): lowering it out of the training IR inlines the region, and the rewritten
    program's module would differentiate what the exported one does not (Note [What autograd
    sees is part of the trace] in ``fxviews/tracing/autograd.py``)."""
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.target in (wrap_with_set_grad_enabled, set_grad_enabled):
                raise FxViewsError(
                    f"fxviews.rewrite cannot rewrite this exported program: its training IR "
                    f"keeps a grad-mode region (node {node.name!r}), which lowering it out of that "
                    f"IR (run_decompositions, which the rewrite needs to see the as_strided of "
                    f"autograd) inlines, so the rewritten program's gradients would differ. For "
                    f"inference, lower it yourself (ep.run_decompositions()) and rewrite that."
                )


def _run_decompositions(program: ExportedProgram) -> ExportedProgram:
    """``program`` out of the training IR with nothing decomposed that need not be (see the
    Note), which copies pytree specs (see pytree_spec_copies)."""
    with pytree_spec_copies():
        return program.run_decompositions(decomp_table={})


def _mutated_placeholders(program: ExportedProgram) -> dict[str, str]:
    """Each returned value a program writes into a user input or buffer -> that placeholder."""
    signature = program.graph_signature
    placeholders = {
        spec.target: spec.arg.name
        for spec in signature.input_specs
        if spec.kind == InputKind.BUFFER and hasattr(spec.arg, "name")
    }
    placeholders.update({name: name for name in signature.user_inputs if isinstance(name, str)})
    return {
        spec.arg.name: placeholders[spec.target]
        for spec in signature.output_specs
        if spec.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)
        and hasattr(spec.arg, "name")
        and spec.target in placeholders
    }


def _returned(graph: torch.fx.Graph) -> list[Any]:
    """The values the graph's output node returns, one per output spec, in order."""
    returned = graph.output_node().args[0]
    if not isinstance(returned, (list, tuple)):  # export graphs return a tuple of outputs
        raise FxViewsError(f"the program's graph returns {returned!r}, not a tuple of outputs")
    return list(returned)


def _returned_renames(before: torch.fx.Graph, after: torch.fx.Graph) -> dict[str, str]:
    """Old name -> new name of every returned node the rewrite replaced."""
    return {
        old.name: new.name
        for old, new in zip(_returned(before), _returned(after), strict=True)
        if isinstance(old, torch.fx.Node)
        and isinstance(new, torch.fx.Node)
        and old.name != new.name
    }


def _remap_signature(
    signature: ExportGraphSignature, graph: torch.fx.Graph
) -> ExportGraphSignature:
    """``signature`` with each output spec naming the value now returned at its position."""
    returned = _returned(graph)
    if len(returned) != len(signature.output_specs):
        raise FxViewsError(
            f"the rewritten graph returns {len(returned)} values where the program's signature "
            f"has {len(signature.output_specs)} outputs"
        )
    specs = [
        _remap_output(spec, value)
        for spec, value in zip(signature.output_specs, returned, strict=True)
    ]
    return ExportGraphSignature(
        input_specs=copy.deepcopy(signature.input_specs), output_specs=specs
    )


def _remap_output(spec: OutputSpec, value: Any) -> OutputSpec:
    if not isinstance(value, torch.fx.Node):
        return copy.deepcopy(spec)  # a constant output: nothing was renamed
    if not hasattr(spec.arg, "name") or not dataclasses.is_dataclass(spec.arg):
        raise FxViewsError(
            f"output spec {spec} now returns node {value.name!r}, which it cannot name"
        )
    return dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name=value.name))


def _remap_module_call_graph(
    program: ExportedProgram, graph: torch.fx.Graph, renames: dict[str, str]
) -> list[Any]:
    """The program's module call graph with returned nodes renamed; every name must exist.

    Preserved module call signatures (``preserve_module_call_signature``) name nodes inside
    the graph; one the rewrite erased would leave the program unflattenable.
    """
    with pytree_spec_copies():
        entries = copy.deepcopy(program.module_call_graph)
    present = {node.name for node in graph.nodes}
    for entry in entries:
        if entry.signature is None:
            continue
        for arg in (*entry.signature.inputs, *entry.signature.outputs):
            name = getattr(arg, "name", None)
            if name is None:
                continue
            name = renames.get(name, name)
            if name not in present:
                raise FxViewsError(
                    f"the rewrite removed node {name!r}, which the preserved call signature of "
                    f"module {entry.fqn!r} refers to"
                )
            arg.name = name
    return entries
