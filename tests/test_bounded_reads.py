"""The issue's three compiles whose as_strided reads past its input at some allowed size:
rewritten over the input's flat buffer with a runtime assertion of the bounds (see
passes/rewrites/bounded_reads.py), against eager PyTorch at sizes the hint does not have, under
vmap at every batch position, under Inductor, and past the bounds, where eager raises and so
must they.
"""

from __future__ import annotations

import pytest
import sympy
import torch

import fxviews
from fxviews.passes.compat import torch_internals as internals
from fxviews.passes.compat.torch_internals import make_fx, reset_dynamo
from fxviews.passes.geometry.symbolic import ShapeFacts
from tests.reference import as_strided_nodes
from tests.test_backend import Recorder, plain_aot, run, transposed_window_loss
from tests.test_symbolic import (
    COMPILE_SIZES,
    aten_stage_only,
    compile_and_check,
    compile_and_run,
    grad_inputs,
    outcome,
    trained,
)

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
aten = torch.ops.aten


# --- the issue's three functions: rewritten, with a runtime assertion of their bounds -------


def row_windows(x):
    """Overlapping pairs of rows of an (n, 3) input: unfold with step 1."""
    n = x.shape[0]
    return x.as_strided((n - 1, 2, 3), (3, 3, 1))


def transposed_window(a):
    """A window of the transpose of an (n, 3) input, trained."""
    n = a.shape[0]
    return a.t().as_strided((2, n - 1), (1, 3), 1).exp().sum()


def diagonal_window(a):
    """The main diagonal but its last element, of an (n, n) input, trained."""
    n = a.shape[0]
    return a.as_strided((n - 1,), (n + 1,)).exp().sum()


#: name: (function, inputs of size n, trained).
ISSUE = {
    "row_windows": (row_windows, lambda n: (torch.randn(n, 3),), False),
    "transposed_window": (
        transposed_window,
        lambda n: (torch.randn(n, 3, requires_grad=True),),
        True,
    ),
    "diagonal_window": (
        diagonal_window,
        lambda n: (torch.randn(n, n, requires_grad=True),),
        True,
    ),
    # Its windows consumed inside the graph, not returned as a view of the input.
    "row_windows_trained": (
        trained(row_windows),
        lambda n: grad_inputs((torch.randn(n, 3),)),
        True,
    ),
}
#: The compiles in which a size the user wrote as a constant (3 columns, a square's n) is a
#: symbol of its own, so that at some size the graph allows the as_strided reads past its
#: input: (name, dynamic): (shapes inside the bounds whose second dim differs from the
#: hint's, a shape past them). dynamic=True makes the 3 columns a symbol c >= 2, and at c = 2
#: the row windows read 3n of 2n elements; automatic dynamic gives the square's dims their
#: own symbols n, m, and at m < n - 1 the stride n + 1 walks past the last row.
ASSERTED = {
    ("transposed_window", True): ([(3, 2), (7, 5)], (6, 2)),
    ("diagonal_window", None): ([(8, 7), (7, 12)], (6, 3)),
    ("row_windows_trained", True): ([(7, 4), (5, 5)], (6, 2)),
    ("row_windows", True): ([(7, 4), (5, 5)], (6, 2)),
}
ISSUE_SIZES = (6, 8, 11)


def issue_inputs(name, dynamic):
    """The issue function's inputs at :data:`ISSUE_SIZES`, then (where the compile makes the
    second dim a symbol) at shapes whose second dim differs from the hint's."""
    _, make, training = ISSUE[name]
    shapes = ASSERTED.get((name, dynamic), ([], None))[0]
    return [make(n) for n in ISSUE_SIZES] + [
        (torch.randn(shape, requires_grad=training),) for shape in shapes
    ]


@pytest.mark.parametrize("name", [name for name, (_, _, training) in ISSUE.items() if training])
def test_trained_windows_reach_the_inner_compiler_without_as_strided(name):
    # The backward AOTAutograd derives from a user's as_strided is an as_strided_scatter into
    # the gradient's buffer, whose region takes windows here (no scatter form). The static
    # compile rewrites the as_strided in Dynamo's graph, so the backward differentiates view
    # ops; a dynamic one, whose as_strided is differentiated, must do the same, not leave it
    # to the aten graphs' stage (which handed the backward's as_strided_scatter on).
    fn, make, training = ISSUE[name]
    assert compile_and_run(fn, make, training, dynamic=False, sizes=COMPILE_SIZES[:1]) == [0, 0]
    reset_dynamo()
    assert compile_and_run(fn, make, training, dynamic=True) == [0, 0]


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", ISSUE)
def test_issue_functions_reach_the_inner_compiler_as_static_shapes_do(name, dynamic):
    # Values and gradients equal eager at every size, and no graph holds more as_strided
    # than the static compile's (a forward, and a backward when trained; see aten_stage_only).
    fn, make, training = ISSUE[name]
    with aten_stage_only():
        static = compile_and_run(fn, make, training, dynamic=False, sizes=ISSUE_SIZES[:1])
    reset_dynamo()
    counts = compile_and_check(fn, issue_inputs(name, dynamic), training, dynamic)
    per_graph = len(static)
    assert all(c <= static[i % per_graph] for i, c in enumerate(counts)), (static, counts)


ASSERTION = "fxviews: the view ops that replace 'as_strided' need its reads inside its input"
#: What eager's as_strided raises past its input's storage.
EAGER_ERROR = "out of bounds for storage"


def captured_graphs(name, dynamic):
    """The graphs AOTAutograd gives for the issue function (not rewritten), compiled at
    :data:`ISSUE_SIZES`: the forward (and backward) of the last, symbolic, compile."""
    fn, make, training = ISSUE[name]
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return internals.make_boxed_func(gm.forward)

    compiled = torch.compile(fn, backend=plain_aot(capture), dynamic=dynamic)
    for n in ISSUE_SIZES:
        run(compiled, make(n), training)
    return graphs[-2:] if training else graphs[-1:]


def graph_inputs(gm, x):
    """The arguments of a forward graph whose one tensor input is ``x``: each int input is
    its symbol's value at ``x``'s sizes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    [tensor] = [p for p in placeholders if isinstance(p.meta["val"], torch.Tensor)]
    values = {
        size.node.expr: actual
        for size, actual in zip(tensor.meta["val"].shape, x.shape, strict=True)
        if isinstance(size, torch.SymInt)
    }
    return [
        x if p is tensor else int(p.meta["val"].node.expr.xreplace(values)) for p in placeholders
    ]


@pytest.mark.parametrize("key", ASSERTED)
def test_rewritten_graph_asserts_its_bounds_and_raises_past_them(key):
    name, dynamic = key
    fn, _, training = ISSUE[name]
    forward = captured_graphs(name, dynamic)[0]
    val = next(
        n.meta["val"] for n in forward.graph.nodes if isinstance(n.meta["val"], torch.SymInt)
    )
    guards = list(val.node.shape_env.guards)
    res = fxviews.rewrite(forward)
    assert val.node.shape_env.guards == guards  # the proof and the emission add no guard
    [record] = [r for r in res.records if r.node == "as_strided"]
    assert record.method == "synthesized" and "asserts at run time that" in record.reason
    gm = res.graph_module
    assert len(as_strided_nodes(gm)) == 0
    assert any(n.target is aten._assert_scalar.default for n in gm.graph.nodes)
    assert not any(n.target is aten.sym_size.int for n in gm.graph.nodes)
    inside, past = ASSERTED[key]
    for shape in inside:  # the rewritten graph itself, at sizes the hint does not have
        x = torch.randn(shape)
        torch.testing.assert_close(gm(*graph_inputs(gm, x))[0], fn(x))
    # Past the bounds eager raises, and so does the graph: with the assertion's message, not
    # a clamped or garbage answer.
    x = torch.randn(past)
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        fn(x)
    with pytest.raises(RuntimeError, match=ASSERTION):
        gm(*graph_inputs(gm, x))
    # ... and so does the compiled function. Untrained, the aten stage's assertion fires: no
    # guard made Dynamo recompile there. Trained, the first stage rewrites the as_strided, so
    # that the backward differentiates view ops (docs/compile.md); AOTAutograd's trace of the
    # assertion guards on the bound, and past it Dynamo compiles again, keeps the as_strided
    # and raises eager's error.
    reset_dynamo()
    compiled = torch.compile(fn, backend=fxviews.backend(), dynamic=dynamic)
    for args in issue_inputs(name, dynamic):
        run(compiled, args, training)
    with pytest.raises(RuntimeError, match=EAGER_ERROR if training else ASSERTION):
        run(compiled, (torch.randn(past, requires_grad=training),), training)


def batched(args, samples, bd):
    """``args`` with its one tensor replaced by ``samples`` stacked at ``bd``, and in_dims."""
    position = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    args = [*args]
    args[position] = torch.stack(samples, dim=bd if bd >= 0 else samples[0].dim())
    return args, tuple(bd if i == position else None for i in range(len(args)))


@pytest.mark.parametrize("bd", [0, 1, -1])
@pytest.mark.parametrize("key", ASSERTED)
def test_vmap_of_a_graph_with_the_assertion_is_right_at_every_batch_position(key, bd):
    name, dynamic = key
    fn = ISSUE[name][0]
    res = fxviews.rewrite(captured_graphs(name, dynamic)[0])
    gm = res.graph_module

    def first_output(*args):
        return gm(*args)[0]

    inside, past = ASSERTED[key]
    for shape in [(7, 7) if name == "diagonal_window" else (7, 3), *inside]:
        samples = [torch.randn(shape) for _ in range(3)]
        args, in_dims = batched(graph_inputs(gm, samples[0]), samples, bd)
        if name == "row_windows" and bd == 1:
            # The graph returns a view of its input through view(x, [-1]): its aliasing is
            # observable, so the view stays one, and pinning never copies a graph input. It
            # is layout-bound (README, Limitations): vmap raises where the batch dim sits
            # between the merged dims, and says why.
            assert any(r.method == "kept" and "graph input" in r.reason for r in res.pin_records)
            with pytest.raises(RuntimeError, match="view size is not compatible"):
                torch.func.vmap(first_output, in_dims=in_dims)(*args)
            continue
        out = torch.func.vmap(first_output, in_dims=in_dims)(*args)
        for b, sample in enumerate(samples):
            torch.testing.assert_close(out[b], fn(sample))
    x = torch.randn(past)
    args, in_dims = batched(graph_inputs(gm, x), [x, x], bd)
    with pytest.raises(RuntimeError, match=ASSERTION):
        torch.func.vmap(first_output, in_dims=in_dims)(*args)


def test_inductor_compiles_the_asserted_rewrites_and_stays_right():
    # Inductor lowers _assert_scalar on sizes to nothing (torch 2.13), but its own lowering of
    # the chain's first slice guards on the same bound: past it Dynamo recompiles, fxviews
    # keeps the as_strided for a graph traced there, and the inner compiler gets what plain
    # Inductor gets. Inside the bounds every compile is right.
    for name, dynamic in ASSERTED:
        fn, _, training = ISSUE[name]
        reset_dynamo()
        compiled = torch.compile(fn, backend=fxviews.backend(inner="inductor"), dynamic=dynamic)
        for args in issue_inputs(name, dynamic):
            torch.testing.assert_close(run(compiled, args, training), run(fn, args, training))
    # The last compile was row_windows': past its bounds it raises, as eager does.
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        compiled(torch.randn(ASSERTED["row_windows", True][1]))


@pytest.mark.parametrize("name", ISSUE)
def test_make_fx_graphs_without_size_inputs_keep_the_issue_functions_and_say_why(name):
    # make_fx graphs read sizes from tensors, so no int input can carry the assertion.
    fn = ISSUE[name][0]
    x = torch.randn(8, 9 if name == "diagonal_window" else 5)  # two symbols: no duck sizing
    gm = make_fx(fn, tracing_mode="symbolic")(x)
    [record] = fxviews.rewrite(gm).records
    assert record.method == "kept"
    assert "cannot assert at run time: no graph input holds those sizes" in record.reason
    torch.testing.assert_close(fxviews.rewrite(gm).graph_module(x), fn(x))


def test_a_window_past_the_smallest_input_is_rewritten_with_its_bounds_asserted():
    # a.t().as_strided((2, 3), (1, 2), 1) reads storage elements 1..6 of an (n, 3) input: inside
    # it only for n >= 3, and the shape environment allows n = 2. Rewritten, asserting
    # 7 <= 3n, in Dynamo's graph (the loss is trained: its backward differentiates view ops),
    # whose trace guards on that bound; at n = 2 Dynamo compiles again and the compiled loss
    # raises eager's error.
    def make(n):
        return (torch.randn(n, 3, requires_grad=True),)

    assert compile_and_run(transposed_window_loss, make, True, None) == [0, 0, 0, 0]
    reset_dynamo()
    compiled = torch.compile(transposed_window_loss, backend=fxviews.backend())
    for n in COMPILE_SIZES:
        run(compiled, make(n), True)
    with pytest.raises(RuntimeError, match=EAGER_ERROR):
        run(transposed_window_loss, make(2), True)
    with pytest.raises(RuntimeError, match=EAGER_ERROR):
        run(compiled, make(2), True)


def test_a_stride_past_the_row_is_rewritten_with_its_bounds_asserted():
    # x.as_strided((n,), (n + 1,)) of an (n, m) input (dynamic=True: m is its own symbol)
    # reads up to element (n - 1)(n + 1): inside where n*n <= n*m. The stepped slice over the
    # flat buffer asserts that; the backward's buffer is sized for the reads, and needs none.
    def rows_stride(x):
        n = x.shape[0]
        return x.as_strided((n,), (n + 1,))

    recorder = Recorder()
    compiled = torch.compile(rows_stride, backend=fxviews.backend(inner=recorder), dynamic=True)
    for n in COMPILE_SIZES:
        x = torch.randn(n, n + 3)
        torch.testing.assert_close(compiled(x), rows_stride(x))
    assert recorder.as_strided_counts() == [0]
    [gm] = recorder.graphs
    assert any(n.target is aten._assert_scalar.default for n in gm.graph.nodes)
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        rows_stride(torch.randn(6, 4))
    with pytest.raises(RuntimeError, match=ASSERTION):
        compiled(torch.randn(6, 4))


# --- the proofs the asserted rewrites rest on ------------------------------------------------


def test_shape_facts_prove_under_an_assumption_and_only_there():
    gm = make_fx(lambda x: x + 1, tracing_mode="symbolic")(torch.randn(8, 9))
    n, m = next(p for p in gm.graph.nodes if p.op == "placeholder").meta["val"].shape
    facts = ShapeFacts.of([n])
    n, m = facts.expression(n), facts.expression(m)
    reads_inside = sympy.Le(n**2 - n - 1, n * m)  # the diagonal window's in-bounds condition
    assumed = facts.assuming(n * m - (n**2 - n - 1))
    assert not facts.proves(reads_inside) and assumed.proves(reads_inside)
    assert not facts.proves(reads_inside)  # assuming makes new facts; these are unchanged
    # Only what follows: 3n <= n*m fails at m = 2, and the assumption does not give it.
    assert not assumed.proves(sympy.Le(3 * n, n * m))
    assert assumed.holds_at({n: 6, m: 5}) and not assumed.holds_at({n: 6, m: 3})


def test_shape_facts_prove_polynomials_and_maxima_from_lower_bounds():
    gm = make_fx(lambda x: x + 1, tracing_mode="symbolic")(torch.randn(8, 9))
    n_int, m_int = next(p for p in gm.graph.nodes if p.op == "placeholder").meta["val"].shape
    facts = ShapeFacts.of([n_int])
    n, m = facts.expression(n_int), facts.expression(m_int)
    # n >= 2: n**2 - n - 1 >= 1, which interval arithmetic on n**2 and -n alone cannot see.
    assert facts.proves(sympy.Ge(n**2 - n - 1, 1))
    assert not facts.proves(sympy.Ge(n**2 - n - 1, 2))  # 1 at n = 2
    # n//2 >= 1 over n >= 2: an integer, so a bound of 1/2 for (n - r)/2 (r = n % 2) shows it.
    assert facts.proves(sympy.Ge(facts.expression(n_int // 2), 1))
    assert not facts.proves(sympy.Ge(facts.expression(n_int // 2), 2))
    # A backward's buffer is Max(n*m, 3n - 3) long: each argument fits in it.
    buffer = facts.expression(torch.sym_max(n_int * m_int, 3 * n_int - 3))
    assert facts.proves(sympy.Le(n * m, buffer)) and facts.proves(sympy.Le(3 * n - 3, buffer))
    assert not facts.proves(sympy.Le(n * m + 1, buffer))


# --- more geometries over a dense input: right where eager is, raising where it raises --------


def _columns(x):
    return x.shape[1]


#: name: function of an (n, c) input. dynamic=True makes n and c symbols; some read past the
#: input at small c, some never do, one has no flat chain (a symbolic step unfold cannot take).
GEOMETRIES = {
    # Windows of 3 every 2 elements: they end at 2n - 1 <= n*c, inside at every size.
    "windows_every_two": lambda x: x.as_strided((x.shape[0] - 1, 3), (2, 1)),
    # Two rows of n from element 1: inside where 2n + 1 <= n*c (not at c = 2).
    "rows_of_n": lambda x: x.as_strided((2, x.shape[0]), (x.shape[0], 1), 1),
    # Pairs every c + 1 elements: a symbolic unfold step, so no flat chain (kept).
    "pairs_past_each_row": lambda x: x.as_strided((x.shape[0] - 1, 2), (_columns(x) + 1, 1)),
    # The transpose of a (3, n) window, consumed: inside where 3n <= n*c.
    "transposed_block": lambda x: x.as_strided((x.shape[0], 3), (1, x.shape[0])).sin(),
    # A read every n + 2 elements, n//2 of them: its end (n//2)(n + 2) - n + 1 mixes a floor
    # division and a product, which the bounds cannot order (kept).
    "every_n_plus_two": lambda x: x.as_strided((x.shape[0] // 2,), (x.shape[0] + 2,), 1),
    # n elements 3 apart: inside where 3n - 2 <= n*c, a stepped slice of the flat buffer.
    "every_third": lambda x: x.as_strided((x.shape[0],), (3,)),
}
#: The geometries kept (by their own reason); the others reach the inner compiler as views.
KEPT_GEOMETRIES = ("pairs_past_each_row", "every_n_plus_two")
#: Shapes past the hint's: column counts above, at and below the sizes the reads need.
GEOMETRY_SHAPES = ((9, 7), (5, 2), (7, 3), (4, 4), (12, 2), (3, 9))


@pytest.mark.parametrize("name", GEOMETRIES)
def test_dense_geometries_are_right_where_eager_is_and_raise_where_it_raises(name):
    fn = GEOMETRIES[name]
    recorder = Recorder()
    compiled = torch.compile(fn, backend=fxviews.backend(inner=recorder), dynamic=True)
    torch.testing.assert_close(compiled(x := torch.randn(8, 6)), fn(x))
    for shape in GEOMETRY_SHAPES:
        x = torch.randn(shape)
        want, got = outcome(fn, x), outcome(compiled, x)
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, msg=f"{shape}")
        else:  # eager raises here: so must the compiled function, never answer
            assert got is want, f"{shape}: {got}"
    assert recorder.as_strided_counts()[0] == (name in KEPT_GEOMETRIES)
