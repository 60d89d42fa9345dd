"""The steps ``transform`` runs after the rewrite, each against the graph it replaces, op by op
over PyTorch's OpInfo database.

A transformed function's graph is only run, never read by another compiler, so after the
rewrite ``transform`` makes it cheaper to run: results that depend on no input are computed
once (Note [Results that depend on no input], ``passes/runtime/constant_folding.py``), ops
are called through PyTorch's Python bindings (Note [Calling ops through their Python
bindings], ``passes/runtime/bound_calls.py``), and the code that runs it is written by
fxviews, not FX (Note [The code of a graph only run], ``fxviews/calls/graph_code.py``). None
of them may change a number.

For each OpInfo program (:mod:`tests.opinfo_programs`), its graph is captured as ``transform``
captures it and rewritten without those steps; then each step is applied in ``transform``'s
order, and the graph after it must give exactly what the graph before it gives, bit for bit
(or raise the same error): on the traced sample, on another sample of the same signature, and
under ``vmap`` with the batch dim physically last. :func:`test_the_steps_are_transforms_own`
checks that these are all the steps ``transform`` runs, so a new one cannot go unchecked.

``make test`` takes the ops in a fixed 1-in-:data:`SHARE` sample by name; ``make fuzz`` every
op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.func import vmap

from fxviews.calls.graph_code import run_only_forward
from fxviews.passes.compat.torch_internals import pytree
from fxviews.passes.graph_edits import copy_graph
from fxviews.passes.runtime.bound_calls import bind_calls, bind_constants
from fxviews.passes.runtime.constant_folding import fold_input_free_results
from fxviews.rewriting.steps import rewrite_in_place
from fxviews.tracing.capture import capture
from fxviews.tracing.failures import TracingError
from tests.databases import in_share
from tests.opinfo_programs import OPS, Outcome, Program, op_labels, programs
from tests.reference import stack_batched

#: ``make test`` takes one op in SHARE (``make fuzz`` every one).
SHARE = 4
LABELS = [label for label in op_labels() if in_share(label, SHARE)]


def _tensor_outputs(fn: Callable[..., Any]) -> Callable[..., list[torch.Tensor]]:
    """``fn``'s tensor outputs as one list, as ``transform`` traces a function."""

    def flat(*tensors: torch.Tensor) -> list[torch.Tensor]:
        return [o for o in pytree.tree_leaves(fn(*tensors)) if isinstance(o, torch.Tensor)]

    return flat


def _graph(program: Program) -> torch.fx.GraphModule | None:
    """The program's graph as ``transform`` captures and rewrites it, before the run-only
    steps; None where it has none (a function traced by its values runs eagerly)."""
    flat = _tensor_outputs(program.fn)
    try:
        gm = capture(flat, program.samples[0], fresh=True, caller="test", name=program.label)
    except TracingError:
        return None
    rewrite_in_place(gm, bind_calls=False)
    return gm


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(gm, copy_graph(gm.graph))


def _folded(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    gm = _copy(gm)
    fold_input_free_results(gm)
    gm.recompile()
    return gm


def _bound(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    gm = _copy(gm)
    bind_calls(gm)
    bind_constants(gm)
    gm.recompile()
    return gm


def _differences(
    before: Callable[..., Any], after: Callable[..., Any], program: Program
) -> list[str]:
    """Where ``after`` gives other than ``before``: a sample, another, vmap at the last dim."""
    samples = program.samples
    in_dims = tuple(t.dim() for t in samples[0])

    def fresh(index: int) -> tuple[torch.Tensor, ...]:  # a run may write its arguments
        return tuple(t.clone() for t in samples[index])

    runs: dict[str, Callable[[Callable[..., Any]], Any]] = {
        "traced sample": lambda f: f(*fresh(0)),
        "another sample": lambda f: f(*fresh(1)),
    }
    if samples[0]:  # vmap needs an input to batch
        runs["vmap, batch dim last"] = lambda f: vmap(f, in_dims=in_dims)(
            *stack_batched(samples, in_dims)
        )
    found = []
    for name, run in runs.items():
        expected = Outcome.of(functools.partial(run, before))
        actual = Outcome.of(functools.partial(run, after))
        if expected.error is not None or actual.error is not None:
            if actual.error != expected.error:
                found.append(f"{name}: {actual.describe()} where before: {expected.describe()}")
        elif not actual.matches(expected, program.values_defined, rtol=0, atol=0):
            found.append(f"{name}: other numbers than the graph before gives")
    return found


#: The steps after the rewrite, in ``transform``'s order: each is given the graph of the
#: steps before it and returns what runs in its place.
STEPS: dict[str, Callable[[torch.fx.GraphModule], Any]] = {
    "results computed once": _folded,
    "calls through bindings": _bound,
    "written code": run_only_forward,
}


@functools.cache
def _stages(label: str) -> list[tuple[Program, list[tuple[str, Any]]]]:
    """Per program of ``label`` with a graph: what runs after each step, in order, first the
    rewritten graph."""
    made = []
    for program in programs(OPS[label], 1):
        gm = _graph(program)
        if gm is None:
            continue
        stages: list[tuple[str, Any]] = [("rewritten graph", gm)]
        for name, step in STEPS.items():
            stages.append((name, step(stages[-1][1])))
        made.append((program, stages))
    return made


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("label", LABELS)
def test_step_gives_what_the_graph_before_it_gives(label: str, step: str) -> None:
    found = []
    for program, stages in _stages(label):
        names = [name for name, _ in stages]
        position = names.index(step)
        before, after = stages[position - 1][1], stages[position][1]
        found += [f"{program.label}: {line}" for line in _differences(before, after, program)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "label", ["sin", "masked.var", "cat", "matmul", "nn.functional.pad.reflect"]
)
def test_the_steps_are_transforms_own(label: str) -> None:
    """The steps above make the code ``transform``'s rewrite makes: a step added there and
    not here changes it."""
    for program, stages in _stages(label):
        ours = stages[-2][1]  # the graph of the last step before the written code
        theirs = _tensor_outputs(program.fn)
        gm = capture(theirs, program.samples[0], fresh=True, caller="test", name=program.label)
        rewrite_in_place(gm, bind_calls=True)
        assert gm.code == ours.code
