"""Differential corpus for the engine: hand-written views, in-place writes, transforms.

Every case is a function ``f(x, y)`` that clones a base ``x``, takes one or more views of it,
then mutates the base in place with ``y``, the operand that carries a tangent or a gradient::

    base = x.clone(); views = view_op(base); inplace_op(base, y); return (*views, base)

wrapped in a torch.func transform (jvp, grad, vjp, and for a subset jacfwd, jacrev, hessian).
Tracing such a function with make_fx bakes the trace-time strides of every view into
``aten.as_strided`` nodes (forward AD re-derives view tangents with as_strided; backward goes
through AsStridedBackward/CopySlices). For each case we:

1. trace it with :func:`fxviews.trace` on one unbatched, contiguous sample, rewrite it with
   :func:`fxviews.rewrite` and check that no as_strided-family node is left;
2. run ``torch.func.vmap`` of the rewritten graph on inputs stacked so the batch dim is
   *physically* at every position of every input, and compare with eager PyTorch applied to the
   original Python function one sample at a time;
3. run the rewritten graph (no vmap) on non-contiguous inputs and compare with eager;
4. check that the caller's GraphModule was not touched.

A harness self-check runs the *raw* traced graphs through the same comparison and requires
wrong numbers for some layouts: the comparison can fail, and the corpus does exercise the bug.
(Raw forward-mode graphs are wrong under vmap on every case of the corpus; raw reverse-mode ones
mostly read fresh ``new_zeros`` buffers and are right, so there the tests guard the rewrite
against breaking them.)

The comparisons are strict: a wrong number or an error on any layout fails the test. (Views
that merge dims become ``reshape`` where nobody can tell, and the buffers of those that must
stay views are pinned to their traced layout, so none may raise.) A case still expected to fail
would be an explicit ``xfail`` with its reason, and only for a graph input.

Eager PyTorch refuses some combinations, which the corpus therefore leaves out: reverse mode
through an in-place change to the base of a multi-output view (split, chunk, unbind), and
in-place writes into an expanded view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import fxviews
from tests.differential import (
    Prepared,
    assert_every_layout_matches,
    assert_raw_graph_is_wrong,
    failures,
    nonlinear_loss,
    prepare,
    pull_in_y,
    push_in_y,
)
from tests.reference import (
    TEST_DEVICE,
    as_strided_nodes,
    assert_tree_close,
    in_dims_id,
    in_dims_sweep,
    make_samples,
    nested_per_sample_reference,
    nested_stack_batched,
    noncontiguous_variants,
    stable_seed,
)

BATCH = 3
DTYPE = torch.float64

# --------------------------------------------------------------------------------------------
# The corpus: view ops, in-place ops, transforms.
# --------------------------------------------------------------------------------------------

ViewFn = Callable[[torch.Tensor], Any]


@dataclass(frozen=True)
class ViewCase:
    """A view op applied to the base. ``fn`` returns a tensor or a tuple of tensors (split...).

    ``overlapping``: the view aliases one element more than once (expand), so it cannot be
    written to in place. ``overlapping_windows``: its windows share elements (unfold with a
    step below the size); eager writes through it in place, in an order only CPU defines.
    ``multi_output``: the op returns several views (split, chunk, unbind).
    """

    name: str
    shape: tuple[int, ...]
    fn: ViewFn
    overlapping: bool = False
    multi_output: bool = False
    overlapping_windows: bool = False


S3 = (3, 4, 5)
S2 = (4, 5)

VIEWS: list[ViewCase] = [
    ViewCase("select", S3, lambda x: x.select(1, 2)),
    ViewCase("select_neg", S3, lambda x: x[-1]),
    ViewCase("slice_step", S3, lambda x: x[:, 1::2]),
    ViewCase("slice_step_last", S3, lambda x: x[..., ::3]),
    ViewCase("slice_neg_bounds", S3, lambda x: x[1:, -3:]),
    ViewCase("narrow", S3, lambda x: x.narrow(2, 1, 3)),
    ViewCase("transpose", S3, lambda x: x.transpose(0, 2)),
    ViewCase("permute", S3, lambda x: x.permute(2, 0, 1)),
    ViewCase("t", S2, lambda x: x.t()),
    ViewCase("mT", S3, lambda x: x.mT),
    ViewCase("diagonal", S2, lambda x: x.diagonal()),
    ViewCase("diagonal_offset", S3, lambda x: x.diagonal(offset=1, dim1=1, dim2=2)),
    ViewCase("diagonal_neg_offset", S2, lambda x: x.diagonal(-1)),
    ViewCase("unfold_overlap", S3, lambda x: x.unfold(2, 3, 1), overlapping_windows=True),
    ViewCase("unfold_tiling", S3, lambda x: x.unfold(1, 2, 2)),
    ViewCase("expand_new_dim", S2, lambda x: x.unsqueeze(1).expand(4, 3, 5), overlapping=True),
    ViewCase("expand_size1", (4, 1, 5), lambda x: x.expand(4, 3, 5), overlapping=True),
    ViewCase("unsqueeze", S3, lambda x: x.unsqueeze(1)),
    ViewCase("squeeze", (3, 1, 5), lambda x: x.squeeze(1)),
    ViewCase("view_split_dim", S3, lambda x: x.view(3, 2, 2, 5)),
    ViewCase("view_merge_dims", S3, lambda x: x.view(12, 5)),
    ViewCase("reshape_merge_dims", S3, lambda x: x.reshape(3, 20)),
    ViewCase("flatten", S3, lambda x: x.flatten(1)),
    ViewCase("flatten_all", S3, lambda x: x.flatten()),
    ViewCase("unflatten", S3, lambda x: x.unflatten(1, (2, 2))),
    ViewCase("movedim", S3, lambda x: x.movedim(0, -1)),
    ViewCase("split", S3, lambda x: x.split(2, dim=1), multi_output=True),
    ViewCase("split_uneven", S3, lambda x: x.split(2, dim=2), multi_output=True),
    ViewCase("chunk", S3, lambda x: x.chunk(3, dim=0), multi_output=True),
    ViewCase("unbind", S3, lambda x: x.unbind(1), multi_output=True),
    ViewCase("index_int_step", S3, lambda x: x[1, ::2]),
    ViewCase("index_none_int", S3, lambda x: x[:, None, 1:3, 2]),
    ViewCase("index_ellipsis", S3, lambda x: x[..., 1]),
    ViewCase("chain", S3, lambda x: x.transpose(0, 1)[1:, ::2].diagonal(0, 0, 2)),
]
VIEWS_BY_NAME = {v.name: v for v in VIEWS}


def _as_tuple(value: Any) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@dataclass(frozen=True)
class InplaceCase:
    """An in-place op that gives the base (or a view of it) ``y``'s tangent/gradient.

    ``fn(base, views, y, view)`` mutates ``base`` or one of ``views``; ``view`` is the
    :class:`ViewCase`, so an op on a view can build the matching view of ``y``.
    """

    name: str
    fn: Callable[[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor, ViewCase], None]
    writes_view: bool = False


def _mul_into_view(base, views, y, view):
    views[0].mul_(_as_tuple(view.fn(y))[0])


INPLACE: list[InplaceCase] = [
    InplaceCase("copy_", lambda base, views, y, view: base.copy_(y)),
    InplaceCase("mul_", lambda base, views, y, view: base.mul_(y)),
    InplaceCase("add_", lambda base, views, y, view: base.add_(y, alpha=0.5)),
    InplaceCase("addcmul_", lambda base, views, y, view: base.addcmul_(y, y, value=0.25)),
    InplaceCase("part_copy_", lambda base, views, y, view: base[0].copy_(y[0].sin())),
    InplaceCase("view_mul_", _mul_into_view, writes_view=True),
]
INPLACE_BY_NAME = {i.name: i for i in INPLACE}
CORE_INPLACE = ("copy_", "mul_", "add_")
EXTRA_INPLACE = ("addcmul_", "part_copy_", "view_mul_")


def make_primal_fn(view: ViewCase, inplace: InplaceCase) -> Callable[..., tuple]:
    """``f(x, y)``: clone ``x``, take the views, mutate in place with ``y``, return all."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = x.clone()
        views = _as_tuple(view.fn(base))
        inplace.fn(base, views, y, view)
        return (*views, base)

    f.__qualname__ = f"f_{view.name}_{inplace.name}"
    return f


@dataclass(frozen=True)
class Transform:
    """How a primal ``f(x, y)`` becomes the function that is traced and vmapped.

    ``build(f)`` returns ``g(x, y, *extra)``; ``extra_shapes(x_shape, out_shapes)`` gives the
    shapes of the extra arguments (tangent, cotangents).
    """

    name: str
    build: Callable[[Callable], Callable[..., Any]]
    extra_shapes: Callable[[tuple[int, ...], list[tuple[int, ...]]], list[tuple[int, ...]]]


def _build_vjp(f):
    def pull(x, y, *cotangents):
        out, back = vjp(functools.partial(f, x), y)
        return out, back(tuple(cotangents))

    return pull


def _build_jacfwd(f):
    return lambda x, y: jacfwd(functools.partial(f, x))(y)


def _build_jacrev(f):
    return lambda x, y: jacrev(functools.partial(f, x))(y)


def _build_hessian(f):
    return lambda x, y: hessian(lambda y_: nonlinear_loss(f(x, y_)))(y)


def _build_jvp_of_grad(f):
    def forward_over_reverse(x, y, t):
        return jvp(grad(lambda y_: nonlinear_loss(f(x, y_))), (y,), (t,))

    return forward_over_reverse


TRANSFORMS: dict[str, Transform] = {
    "jvp": Transform("jvp", push_in_y, lambda xs, outs: [xs]),
    "grad": Transform("grad", pull_in_y, lambda xs, outs: []),
    "vjp": Transform("vjp", _build_vjp, lambda xs, outs: list(outs)),
    "jacfwd": Transform("jacfwd", _build_jacfwd, lambda xs, outs: []),
    "jacrev": Transform("jacrev", _build_jacrev, lambda xs, outs: []),
    "hessian": Transform("hessian", _build_hessian, lambda xs, outs: []),
    "jvp_of_grad": Transform("jvp_of_grad", _build_jvp_of_grad, lambda xs, outs: [xs]),
}


@dataclass(frozen=True)
class Case:
    """One corpus entry: a view op, an in-place op and a transform; ``id`` names the test."""

    view: ViewCase
    inplace: InplaceCase
    transform: Transform

    @property
    def id(self) -> str:
        return f"{self.view.name}-{self.inplace.name}-{self.transform.name}"

    def primal(self) -> Callable[..., tuple]:
        return make_primal_fn(self.view, self.inplace)

    def arg_shapes(self) -> list[tuple[int, ...]]:
        x_shape = self.view.shape
        probe = self.primal()(torch.zeros(x_shape, dtype=DTYPE), torch.zeros(x_shape, dtype=DTYPE))
        out_shapes = [tuple(o.shape) for o in probe]
        return [x_shape, x_shape, *self.transform.extra_shapes(x_shape, out_shapes)]

    def function(self) -> Callable[..., Any]:
        """The Python function under test: eager reference and trace source."""
        return self.transform.build(self.primal())


FORWARD_TRANSFORMS = ("jvp", "jacfwd")


def _allowed(view: ViewCase, inplace: InplaceCase, transform: str) -> bool:
    """Combinations eager PyTorch itself accepts.

    Reverse mode refuses in-place changes to the base of a multi-output view (split, chunk,
    unbind: "Such functions do not allow the output views to be modified inplace"); forward
    mode accepts them. In-place writes into an expanded (overlapping) view are always an error.
    """
    if view.multi_output and transform not in FORWARD_TRANSFORMS:
        return False
    if inplace.writes_view and view.overlapping:
        return False
    return True


def _case_list() -> list[Case]:
    cases = []
    # The core grid: every view x the core in-place ops x {jvp, grad, vjp}.
    for view in VIEWS:
        for inplace_name in CORE_INPLACE:
            for transform in ("jvp", "grad", "vjp"):
                inplace = INPLACE_BY_NAME[inplace_name]
                if _allowed(view, inplace, transform):
                    cases.append(Case(view, inplace, TRANSFORMS[transform]))
    # More in-place ops (non-linear in y, partial writes, writes through the view): every view
    # with each of them, the transform rotating over jvp/vjp/grad so all pairs appear.
    rotation = ("jvp", "vjp", "grad")
    for v_index, view in enumerate(VIEWS):
        for i_index, inplace_name in enumerate(EXTRA_INPLACE):
            inplace = INPLACE_BY_NAME[inplace_name]
            transform = rotation[(v_index + i_index) % len(rotation)]
            if not _allowed(view, inplace, transform):
                transform = "jvp"
            if _allowed(view, inplace, transform):
                cases.append(Case(view, inplace, TRANSFORMS[transform]))
    # Jacobians, Hessians and forward-over-reverse on a representative subset.
    for view_name, inplace_name, transform in (
        ("select", "copy_", "jacfwd"),
        ("diagonal_offset", "mul_", "jacfwd"),
        ("split", "copy_", "jacfwd"),
        ("slice_step", "copy_", "jacrev"),
        ("unfold_overlap", "mul_", "jacrev"),
        ("expand_new_dim", "copy_", "jacrev"),
        ("index_int_step", "mul_", "hessian"),
        ("transpose", "copy_", "hessian"),
        ("chain", "add_", "hessian"),
        ("diagonal", "mul_", "jvp_of_grad"),
        ("unfold_tiling", "copy_", "jvp_of_grad"),
    ):
        view, inplace = VIEWS_BY_NAME[view_name], INPLACE_BY_NAME[inplace_name]
        assert _allowed(view, inplace, transform)
        cases.append(Case(view, inplace, TRANSFORMS[transform]))
    return cases


CASES: list[Case] = _case_list()
CASES_BY_ID: dict[str, Case] = {c.id: c for c in CASES}
assert len(CASES_BY_ID) == len(CASES), "case ids must be unique"


@functools.cache
def prepared(case_id: str) -> Prepared:
    """Trace the case on sample 0 (unbatched, contiguous) and rewrite it; cached per case."""
    case = CASES_BY_ID[case_id]
    samples = make_samples(case.arg_shapes(), BATCH, seed=stable_seed(case_id), dtype=DTYPE)
    prep = prepare(case_id, case.function(), samples)
    assert prep.eager_error is None, f"eager PyTorch refuses a corpus case: {prep.eager_error}"
    return prep


def _layouts(case_id: str) -> list[tuple]:
    """Every batch position for every argument (aligned and staggered), plus ``y`` unbatched."""
    return in_dims_sweep([len(s) for s in CASES_BY_ID[case_id].arg_shapes()], unbatched=(1,))


CASE_IDS = [c.id for c in CASES]

# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_rewrite_leaves_no_as_strided(case_id: str) -> None:
    """Every as_strided node of the corpus is rewritten (none kept), one record per node."""
    prep = prepared(case_id)
    original = {n.name: n for n in as_strided_nodes(prep.gm)}
    assert original, "corpus case without as_strided: it no longer tests the engine"
    res = prep.result
    records = list(res.records)
    assert sorted(r.node for r in records) == sorted(original), (
        f"expected one record per as_strided node {sorted(original)}, got "
        f"{[(r.node, r.method) for r in records]}"
    )
    kept = [r for r in records if r.method == "kept"]
    assert not kept, f"kept as_strided nodes: {[(r.node, r.before, r.reason) for r in kept]}"
    left = as_strided_nodes(res.graph_module)
    assert not left, f"as_strided nodes left after rewrite: {[n.format_node() for n in left]}"
    assert res.modified
    assert all(r.method in {"provenance", "synthesized", "identity", "scatter"} for r in records)


#: Cases that write in place through overlapping windows: each element is written once per
#: window holding it, read in between, so the result depends on the order of the writes. CPU
#: kernels run them in one defined order; on CUDA the order is undefined (eager on an H200 was
#: repeatable, and 4.8 away from eager on CPU), and a batched call and a per-sample one may
#: order them otherwise: eager there is no reference for vmap, and these run on CPU only.
WRITES_THROUGH_OVERLAP = [
    c.id for c in CASES if c.view.overlapping_windows and c.inplace.writes_view
]
writes_in_a_defined_order = pytest.mark.skipif(
    TEST_DEVICE.type != "cpu",
    reason=f"an in-place write through overlapping windows: on {TEST_DEVICE.type} the order "
    "of the writes is undefined, so eager is no reference under vmap",
)
VMAP_CASES = [
    pytest.param(c, marks=writes_in_a_defined_order) if c in WRITES_THROUGH_OVERLAP else c
    for c in CASE_IDS
]


def test_the_cases_writing_through_overlap_are_known() -> None:
    assert WRITES_THROUGH_OVERLAP == ["unfold_overlap-view_mul_-jvp"]


@pytest.mark.parametrize("case_id", VMAP_CASES)
def test_vmap_of_rewritten_graph_matches_eager(case_id: str) -> None:
    """vmap(rewritten graph) equals eager per sample, batch dim physically at every position.

    One test per case loops over the layouts of :func:`_layouts` and reports every failing one:
    a wrong result or an error.
    """
    prep = prepared(case_id)
    assert_every_layout_matches(
        prep.result.graph_module, prep.fn, prep.samples, layouts=_layouts(case_id), label=case_id
    )


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_rewritten_graph_on_noncontiguous_inputs_matches_eager(case_id: str) -> None:
    """The rewritten graph, called directly on inputs with other layouts, equals eager."""
    prep = prepared(case_id)
    sample = prep.samples[1]
    expected = prep.fn(*sample)
    graph = prep.result.graph_module
    variants = noncontiguous_variants(sample)

    def check(module: torch.fx.GraphModule, args: tuple) -> None:
        assert_tree_close(module(*args), expected, msg=f"{case_id} on non-contiguous inputs")

    checks = {name: functools.partial(check, graph, args) for name, args in variants.items()}
    found = failures(checks)
    assert not found, "\n".join([f"{len(found)}/{len(checks)} variants fail:", *found])


@pytest.mark.parametrize("case_id", [c.id for c in CASES if c.inplace.name == "copy_"])
def test_callers_graph_module_is_unchanged(case_id: str) -> None:
    """rewrite() works on a copy: the traced module's code, graph and outputs stay the same."""
    prep = prepared(case_id)
    nodes_before = [(n.op, n.name, str(n.target), str(n.args)) for n in prep.gm.graph.nodes]
    again = fxviews.rewrite(prep.gm)  # a second rewrite, still on a copy
    assert prep.gm.code == prep.code_before_rewrite
    assert [(n.op, n.name, str(n.target), str(n.args)) for n in prep.gm.graph.nodes] == nodes_before
    assert as_strided_nodes(prep.gm), "the caller's as_strided nodes must still be there"
    assert prep.result.graph_module is not prep.gm and again.graph_module is not prep.gm
    assert again.graph_module.code == prep.result.graph_module.code  # deterministic
    assert_tree_close(prep.gm(*prep.samples[0]), prep.fn(*prep.samples[0]), msg=case_id)


NESTED_CASES = [
    "select-copy_-jvp",
    "diagonal_offset-mul_-jvp",
    "unfold_tiling-copy_-vjp",
    "slice_step-add_-grad",
    "split-copy_-jvp",
]


def _nested_layout(case: Case, outer: tuple, inner: tuple) -> tuple[tuple, tuple]:
    """Clamp a layout pattern to each argument: inner dims index a sample, outer dims the
    inner-batched tensor (one dim more). Patterns are repeated over the arguments."""
    shapes = case.arg_shapes()
    inner = tuple(min(inner[i % len(inner)], len(s)) for i, s in enumerate(shapes))
    outer = tuple(min(outer[i % len(outer)], len(s) + 1) for i, s in enumerate(shapes))
    return outer, inner


@pytest.mark.parametrize(
    ("outer", "inner"),
    [((0,), (3,)), ((3, 2, 1), (0, 1, 2)), ((2,), (2, 0, 1)), ((4, 0), (3, 3, 0))],
    ids=in_dims_id,
)
@pytest.mark.parametrize("case_id", NESTED_CASES)
def test_nested_vmap_of_rewritten_graph_matches_eager(
    case_id: str, outer: tuple, inner: tuple
) -> None:
    """vmap(vmap(graph)) with both batch dims physically placed; eager double-loop reference."""
    prep = prepared(case_id)
    shapes = CASES_BY_ID[case_id].arg_shapes()
    outer, inner = _nested_layout(CASES_BY_ID[case_id], outer, inner)
    grid = [
        make_samples(shapes, BATCH, seed=stable_seed(case_id) + 1 + j, dtype=DTYPE)
        for j in range(2)
    ]
    batched = nested_stack_batched(grid, inner, outer)
    expected = nested_per_sample_reference(prep.fn, grid, inner)
    actual = vmap(vmap(prep.result.graph_module, in_dims=inner), in_dims=outer)(*batched)
    assert_tree_close(actual, expected, msg=f"{case_id} nested vmap outer={outer} inner={inner}")


# --------------------------------------------------------------------------------------------
# Harness self-check: the raw traced graphs are wrong, so the comparisons above can fail.
# --------------------------------------------------------------------------------------------

RAW_BUG_CASES = [
    "select-copy_-jvp",
    "index_int_step-mul_-jvp",
    "diagonal_offset-copy_-jvp",
    "unfold_overlap-add_-jvp",
    "split-copy_-jvp",
    "transpose-mul_-jvp",
]


@pytest.mark.parametrize("case_id", RAW_BUG_CASES)
def test_harness_detects_wrong_numbers_of_raw_graph(case_id: str) -> None:
    """The un-rewritten graph holds as_strided, and it is silently wrong on some layouts.

    This proves what the tests above rely on: the corpus exercises the bug fxviews fixes, and
    the comparison with the eager reference does fail on it (torch 2.13's as_strided batching
    rule no longer raises here). Batch-first layouts are right even without a rewrite.
    """
    assert_raw_graph_is_wrong(prepared(case_id), _layouts(case_id))


# The raw graph of unfold_overlap-add_-jvp happens to be right on these plain inputs.
RAW_NONCONTIGUOUS_BUG_CASES = [c for c in RAW_BUG_CASES if c != "unfold_overlap-add_-jvp"]


@pytest.mark.parametrize("case_id", RAW_NONCONTIGUOUS_BUG_CASES)
def test_harness_detects_raw_graph_on_noncontiguous_inputs(case_id: str) -> None:
    """Without vmap, the un-rewritten graph is silently wrong on some non-contiguous inputs."""
    prep = prepared(case_id)
    sample = prep.samples[1]
    expected = prep.fn(*sample)
    checks = {
        name: functools.partial(lambda args: assert_tree_close(prep.gm(*args), expected), args)
        for name, args in noncontiguous_variants(sample).items()
    }
    wrong = failures(checks)
    assert wrong, f"the raw graph of {case_id} was right on every non-contiguous input"
    assert not any(line.startswith("contiguous:") for line in wrong), wrong
