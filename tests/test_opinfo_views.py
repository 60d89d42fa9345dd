"""Differential corpus driven by PyTorch's OpInfo database: its view ops and their samples.

Where ``test_engine_differential.py`` hand-writes the view ops, this file takes the view-op
entries of ``op_db`` and the arguments of their float64 ``sample_inputs`` on the test device
(:data:`tests.reference.TEST_DEVICE`: CPU unless ``FXVIEWS_TEST_DEVICE`` names another). Each
sample gives ``f(x, y)``::

    base = x.clone(); v = op(base, *sample.args, **sample.kwargs)  # element 0 if a sequence
    base.mul_(y); return v * 1, base

and the traced function is ``push(x, y, yt) = jvp(partial(f, x), (y,), (yt,))``: forward AD
propagates ``y``'s tangent from the base to the view with ``as_strided``. For each case we
trace ``push`` on one sample with :func:`fxviews.trace`, rewrite it, and check that

1. every as_strided node the rewrite keeps says why (unsafe, or no view form);
2. ``vmap`` of the rewritten graph, with the batch dim of every input physically at every
   position (:func:`tests.reference.stack_batched`), equals eager ``push`` run per sample.

The comparison is strict: wrong numbers or an error on any layout fail (merging views whose
aliasing is observable stay views, over buffers pinned to their traced layout). Samples that
eager PyTorch itself refuses are skipped; samples whose output does not alias the input (OpInfo
entries that copy, or samples that do on float64) are left out at collection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

# OpInfo lives in torch.testing._internal, which needs numpy and expecttest (test extras).
from fxviews.passes.compat.torch_internals import op_db
from tests.device_checks import raise_if_test_device_failed
from tests.differential import (
    Prepared,
    assert_every_layout_matches,
    assert_raw_graph_is_wrong,
    prepare,
    push_in_y,
)
from tests.reference import (
    TEST_DEVICE,
    as_strided_nodes,
    in_dims_sweep,
    make_samples,
    stable_seed,
)

BATCH = 3
DTYPE = torch.float64
SAMPLES_PER_OP = 4
MAX_NUMEL = 256

#: OpInfo names of ops that return views of their input (every variant of each is taken).
VIEW_OP_NAMES: frozenset[str] = frozenset(
    {
        "select",
        "narrow",
        "diagonal",
        "unfold",
        "expand",
        "expand_as",
        "permute",
        "t",
        "transpose",
        "movedim",
        "squeeze",
        "unsqueeze",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "ravel",
        "split",
        "split_with_sizes",
        "unsafe_split",
        "chunk",
        "unbind",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "as_strided",
        "T",
        "mT",
        "H",
        "mH",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
        "__getitem__",
        "real",
    }
)

#: OpInfo entries near the view ops that are not views on float64 (checked by a test below).
NOT_VIEWS: dict[str, str] = {
    "contiguous": "returns the input itself or a copy, never a new view",
    "conj": "a view only for complex dtypes; float64 returns the input itself",
    "imag": "complex dtypes only",
    "view_as_real": "complex dtypes only",
    "diag_embed": "allocates a new tensor",
    "narrow_copy": "copy variant",
    "split_with_sizes_copy": "copy variant",
    "unbind_copy": "copy variant",
    "select_scatter": "scatter op, returns a new tensor",
    "index_select": "gathers into a new tensor",
    "take_along_dim": "gathers into a new tensor",
    "nn.functional.unfold": "im2col, allocates a new tensor",
}


def _is_view_entry(op: Any) -> bool:
    return bool(getattr(op, "is_view", False)) or op.name in VIEW_OP_NAMES


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value


def _aliases(out: Any, base: torch.Tensor) -> bool:
    """Whether ``out`` is a tensor sharing ``base``'s storage (i.e. the op returned a view)."""
    if not isinstance(out, torch.Tensor):
        return False
    return out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


@dataclass(frozen=True)
class Case:
    """One OpInfo sample of a view op; ``id`` names the tests."""

    op_label: str
    op_name: str
    index: int
    op: Callable[..., Any]
    shape: tuple[int, ...]
    args: tuple
    kwargs: dict

    @property
    def id(self) -> str:
        shape = "x".join(map(str, self.shape))
        return f"{self.op_label}-s{self.index}-{shape}"

    def primal(
        self, write: Callable[[torch.Tensor, torch.Tensor], Any] = torch.Tensor.mul_
    ) -> Callable[..., tuple]:
        """``f(x, y)``: clone ``x``, view it with the op, then ``write(base, y)`` in place.

        Example::

            >>> f = CASES[0].primal(torch.Tensor.copy_)  # the view then shows y's values
        """

        def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            base = x.clone()
            view = _first(self.op(base, *self.args, **self.kwargs))
            write(base, y)
            return view * 1, base

        return f

    def function(self) -> Callable[..., Any]:
        """``push(x, y, yt)``: the jvp of ``f(x, .)`` at ``y`` along ``yt``; traced and vmapped."""
        return push_in_y(self.primal())


def _usable(op: Any, sample: Any) -> bool:
    """A small float tensor input with ndim >= 1 on which the op returns a view of it."""
    t = sample.input
    if not isinstance(t, torch.Tensor) or t.dtype != DTYPE:
        return False
    if t.dim() < 1 or t.numel() > MAX_NUMEL or t.numel() == 0:
        return False
    try:
        base = t.detach().clone()
        return _aliases(_first(op.op(base, *sample.args, **sample.kwargs)), base)
    except Exception as err:  # a sample the plain op refuses has no view to test
        raise_if_test_device_failed(err, f"OpInfo {op.name} on a sample")
        return False


def _collect() -> tuple[list[Case], dict[str, str]]:
    """The cases, and a reason for every view-op entry that contributed none."""
    cases: list[Case] = []
    unused: dict[str, str] = {}
    for op in op_db:
        if not _is_view_entry(op):
            continue
        label = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if not op.supports_dtype(DTYPE, TEST_DEVICE.type):
            unused[label] = f"no float64 support on {TEST_DEVICE.type}"
            continue
        taken = 0
        for sample in op.sample_inputs(str(TEST_DEVICE), DTYPE):
            if taken == SAMPLES_PER_OP:
                break
            if _usable(op, sample):
                cases.append(
                    Case(
                        label,
                        op.name,
                        taken,
                        op.op,
                        tuple(sample.input.shape),
                        tuple(sample.args),
                        dict(sample.kwargs),
                    )
                )
                taken += 1
        if not taken:
            unused[label] = "no sample with a small tensor input that the op returns a view of"
    return cases, unused


CASES, UNUSED_VIEW_ENTRIES = _collect()
CASES_BY_ID: dict[str, Case] = {c.id: c for c in CASES}
assert len(CASES_BY_ID) == len(CASES), "case ids must be unique"
CASE_IDS = [c.id for c in CASES]


@functools.cache
def prepared(case_id: str) -> Prepared:
    """Trace and rewrite one case; cached so every test of it shares the work."""
    case = CASES_BY_ID[case_id]
    samples = make_samples([case.shape] * 3, BATCH, seed=stable_seed(case_id), dtype=DTYPE)
    return prepare(case_id, case.function(), samples)


def _layouts(case: Case) -> list[tuple]:
    """Every batch position for every argument (aligned and staggered), plus ``y`` unbatched."""
    return in_dims_sweep([len(case.shape)] * 3, unbatched=(1,))


#: Substrings of the reasons for which the rewrite may keep an as_strided node.
KEPT_REASONS = ("unsafe", "no view form")


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_kept_as_strided_nodes_say_why(case_id: str) -> None:
    """One record per as_strided node; a kept node's reason is "unsafe" or "no view form"."""
    prep = prepared(case_id).or_skip()
    res = prep.result
    assert sorted(r.node for r in res.records) == sorted(n.name for n in as_strided_nodes(prep.gm))
    bad = [
        (r.node, r.before, r.reason)
        for r in res.records
        if r.method == "kept" and not any(word in r.reason for word in KEPT_REASONS)
    ]
    assert not bad, f"as_strided nodes kept without an unsafe/no-view-form reason: {bad}"
    kept = {r.node for r in res.records if r.method == "kept"}
    left = {n.name for n in as_strided_nodes(res.graph_module)}
    assert left <= kept, f"as_strided nodes left in the graph without a kept record: {left - kept}"


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_vmap_of_rewritten_graph_matches_eager(case_id: str) -> None:
    """vmap(rewritten graph) equals eager per sample, the batch dim physically anywhere."""
    prep = prepared(case_id).or_skip()
    assert_every_layout_matches(
        prep.result.graph_module,
        prep.fn,
        prep.samples,
        layouts=_layouts(CASES_BY_ID[case_id]),
        label=case_id,
    )


#: Ops whose first case must show the bug in the un-rewritten graph (harness self-check).
RAW_BUG_OPS = ("select", "narrow", "diagonal", "unfold", "split", "transpose", "expand")


@pytest.mark.parametrize("op_name", RAW_BUG_OPS)
def test_harness_detects_wrong_numbers_of_raw_graph(op_name: str) -> None:
    """The un-rewritten graph is silently wrong on some non-batch-first layout: the corpus
    exercises the bug and the comparison can fail. Batch-first layouts are right even raw."""
    case = next(c for c in CASES if c.op_name == op_name)
    assert_raw_graph_is_wrong(prepared(case.id).or_skip(), _layouts(case))


def test_corpus_covers_the_view_ops() -> None:
    """The corpus is not silently emptied by an OpInfo change, and exercises as_strided."""
    covered = {c.op_name for c in CASES}
    for name in (
        "select",
        "narrow",
        "diagonal",
        "unfold",
        "permute",
        "transpose",
        "split",
        "unbind",
        "expand",
        "as_strided",
        "__getitem__",
    ):
        assert name in covered, f"OpInfo gave no usable sample of {name}"
    with_as_strided = [
        c.id
        for c in CASES[::5]
        if prepared(c.id).gm is not None and as_strided_nodes(prepared(c.id).gm)
    ]
    assert with_as_strided, "no traced case holds an as_strided node: the corpus tests nothing"


def test_listed_non_views_are_not_views() -> None:
    """The OpInfo entries left out as non-views really return no view of a float64 input."""
    for op in op_db:
        if op.name not in NOT_VIEWS or not op.supports_dtype(DTYPE, TEST_DEVICE.type):
            continue
        for sample in op.sample_inputs(str(TEST_DEVICE), DTYPE):
            t = sample.input
            if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.numel() == 0:
                continue
            base = t.detach().clone()
            out = _first(op.op(base, *sample.args, **sample.kwargs))
            assert out is base or not _aliases(out, base), (op.name, NOT_VIEWS[op.name])
