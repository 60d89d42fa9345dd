"""Every OpInfo op through ``fxviews.transform``: called directly, under ``vmap`` with the batch
dim first and last, and under ``jvp``, against eager PyTorch, as PyTorch's own ``test_ops.py``
and functorch's ``test_vmap.py`` run their transforms.

Each op of the OpInfo database with a float32 CPU dtype gives its first samples as programs
(:mod:`tests.opinfo_programs`: the op as a function of a sample's tensors, with samples of one
structure to batch). For each program:

- **directly**, ``transform(fn)`` on a sample returns eager's outputs and leaves its arguments
  as eager leaves them (the random stream reset before each, for random ops);
- **under vmap**, with every argument's batch dim physically first, then physically last
  (``torch.stack``), ``vmap(transform(fn))`` equals the per-sample loop of eager ``fn``;
- **under jvp** (ops that support forward AD), ``jvp(transform(fn))`` along random tangents of
  its floating arguments equals eager's ``jvp(fn)``.

The rule is PyTorch's own behaviour: where eager is right (a direct call, eager ``vmap``
matching the loop, eager ``jvp``), fxviews must be right. Where eager fails (eager ``vmap``
raises, having no batching rule, or gives the same other numbers), fxviews may fail the same
way, raising or giving eager ``vmap``'s numbers; never other numbers. :data:`ALLOWED` lists
what is left where eager is right and fxviews is not, each with PyTorch's reason. A sample
eager refuses tests nothing and is passed over.

``make test`` takes the ops in a fixed 1-in-:data:`SHARE` sample by name
(:func:`tests.databases.in_share`); ``make fuzz`` takes every op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.func import jvp, vmap

import fxviews
from tests.databases import in_share
from tests.opinfo_programs import OPS, Outcome, Program, op_labels, programs
from tests.reference import per_sample_reference, stable_seed, stack_batched

#: ``make test`` takes one op in SHARE (``make fuzz`` every one).
SHARE = 4
#: Programs (samples) per op.
SAMPLES_PER_OP = 2
#: Tolerances of float32 results computed in other orders (a batched kernel, a graph).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

#: (label, check): why eager PyTorch is right and fxviews is not, PyTorch's own failure in
#: each case. An entry that no longer fails fails its test, so the list stays true.
ALLOWED: dict[tuple[str, str], str] = {}

LABELS = [label for label in op_labels() if in_share(label, SHARE)]


@functools.cache
def _programs(label: str) -> list[Program]:
    return programs(OPS[label], SAMPLES_PER_OP)


def _clones(sample: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in sample)


def _direct(program: Program) -> list[str]:
    """A direct call of ``transform(fn)`` returns eager's outputs and leaves the arguments as
    eager leaves them."""
    sample = program.samples[0]

    def run(fn: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> Any:
            args = _clones(sample)
            return fn(*args), args

        return call

    expected = Outcome.of(run(program.fn))
    if expected.error is not None:
        return []  # eager refuses the sample: nothing to compare
    actual = Outcome.of(run(fxviews.transform(program.fn)))
    if actual.matches(expected, program.values_defined, **TOLERANCE):
        return []
    return [f"direct: {actual.describe()}"]


def _in_dims(program: Program, where: str) -> tuple[int, ...]:
    return tuple(0 if where == "first" else t.dim() for t in program.samples[0])


def _under_vmap(program: Program, where: str) -> list[str]:
    """``vmap(transform(fn))`` with the batch dim physically ``where`` against the per-sample
    loop, where eager ``vmap`` matches the loop; elsewhere only eager's own failure."""
    in_dims = _in_dims(program, where)
    # Each sample a tensor of its own: an as_strided reads a sample's own memory in the loop,
    # as under vmap (an OpInfo sample may be a view into a larger tensor).
    samples = [
        tuple(t.clone(memory_format=torch.contiguous_format) for t in s) for s in program.samples
    ]
    loop = Outcome.of(lambda: per_sample_reference(program.fn, samples, in_dims))
    defined = program.values_defined
    if loop.error is not None:
        return []  # eager refuses a sample

    def batched(fn: Callable[..., Any]) -> Outcome:
        args = stack_batched(samples, in_dims)
        return Outcome.of(lambda: vmap(fn, in_dims=in_dims)(*args))

    actual = batched(fxviews.transform(program.fn))
    if actual.matches(loop, defined, **TOLERANCE):
        return []
    eager = batched(program.fn)
    if not eager.matches(loop, defined, **TOLERANCE) and (
        actual.error is not None or actual.matches(eager, defined, **TOLERANCE)
    ):
        return []  # eager vmap fails too, and fxviews fails as it does
    return [f"vmap, batch dim {where}: {actual.describe()} (eager vmap: right)"]


def _under_jvp(program: Program) -> list[str]:
    """``jvp(transform(fn))`` along tangents of the floating arguments equals eager's."""
    sample, floating = program.samples[0], program.floating()
    if not any(floating):
        return []
    generator = torch.Generator().manual_seed(stable_seed(program.label))
    primals = tuple(t for t, f in zip(sample, floating, strict=True) if f)
    tangents = tuple(torch.randn(t.shape, generator=generator) for t in primals)

    def of_floating(fn: Callable[..., Any]) -> Callable[..., Any]:
        def partial(*floats: torch.Tensor) -> Any:
            values = iter(floats)
            return fn(*(next(values) if f else t for t, f in zip(sample, floating, strict=True)))

        return partial

    expected = Outcome.of(lambda: jvp(of_floating(program.fn), primals, tangents))
    if expected.error is not None:
        return []  # eager refuses: no forward AD for this sample
    transformed = fxviews.transform(of_floating(program.fn))
    actual = Outcome.of(lambda: jvp(transformed, primals, tangents))
    if actual.matches(expected, program.values_defined, **TOLERANCE):
        return []
    return [f"jvp: {actual.describe()}"]


def failures(label: str, check: str) -> list[str]:
    """What fxviews gets wrong on ``label``'s programs where eager is right, for one check
    (``"direct"``, ``"vmap first"``, ``"vmap last"`` or ``"jvp"``), one line each."""
    found = []
    for program in _programs(label):
        if check == "direct":
            lines = _direct(program)
        elif check == "jvp":
            lines = _under_jvp(program)
        else:
            lines = _under_vmap(program, check.split()[1])
        found.extend(f"{program.label}: {line}" for line in lines)
    return found


def _check(label: str, check: str) -> None:
    found = failures(label, check)
    allowed = ALLOWED.get((label, check))
    if allowed is None:
        assert not found, "\n".join(found)
    elif not found:
        pytest.fail(f"{label}, {check}: allowed to fail ({allowed}), and now right: drop it")
    else:
        pytest.xfail(f"PyTorch's own failure: {allowed}")


@pytest.mark.parametrize("label", LABELS)
def test_direct_call_gives_eagers_results(label: str) -> None:
    _check(label, "direct")


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("label", LABELS)
def test_vmap_matches_the_per_sample_loop(label: str, where: str) -> None:
    _check(label, f"vmap {where}")


@pytest.mark.parametrize("label", [label for label in LABELS if OPS[label].supports_forward_ad])
def test_jvp_gives_eagers_tangents(label: str) -> None:
    _check(label, "jvp")


def test_the_database_is_not_emptied() -> None:
    """An OpInfo change cannot silently leave nothing to test: the ops and their samples."""
    assert len(OPS) > 500 and len(LABELS) >= len(OPS) // SHARE // 2
    assert all(_programs(label) for label in ("sin", "add", "matmul", "cat"))
    assert {label for label, _ in ALLOWED} <= set(OPS)
