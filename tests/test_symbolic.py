"""Symbolic shapes: as_strided nodes whose geometry is symbolic are rewritten for every size.

Graphs come from make_fx's symbolic mode, from torch.compile with automatic dynamic shapes and
``dynamic=True``, and from torch.export with ``Dim``s. Every rewritten graph is run at sizes
other than the one it was traced on, and under ``vmap`` with the batch dim physically where
``in_dims`` says, against eager PyTorch one sample at a time.
"""

from __future__ import annotations

import pytest
import sympy
import torch

import fxviews
from fxviews.examples import push_jvp
from fxviews.passes import torch_internals as internals
from fxviews.passes.symbolic_geometry import ShapeFacts
from fxviews.passes.torch_internals import OpOverload, make_fx, reset_dynamo
from tests.reference import as_strided_nodes
from tests.test_backend import (
    Recorder,
    jvp_loss,
    plain_aot,
    run,
    sliding_windows,
    transposed_window_loss,
)

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh_dynamo():
    reset_dynamo()
    yield
    reset_dynamo()


# --- functions whose as_strided geometry follows the input's sizes ---------------------------


def window(x):
    """Overlapping windows of 3 over a 1-D signal: unfold."""
    return x.as_strided((x.shape[0] - 2, 3), (1, 1))


def windows_of_windows(x):
    """Windows of 3 of windows of 2: unfold of unfold."""
    return x.as_strided((x.shape[0] - 3, 3, 2), (1, 1, 1))


def diagonal(v):
    """The main diagonal of the square ``v v^T``: diagonal."""
    n = v.shape[0]
    return (v.unsqueeze(1) * v).as_strided((n,), (n + 1,))


def superdiagonal(v):
    """The diagonal above the main one: diagonal with an offset."""
    n = v.shape[0]
    return (v.unsqueeze(1) * v).as_strided((n - 1,), (n + 1,), 1)


def all_but_first_rows(x):
    """Rows 1.. of a matrix: a slice to the end, counted from the input's sizes."""
    return x.as_strided((x.shape[0] - 1, x.shape[1]), (x.shape[1], 1), x.shape[1])


def transposed_corner(x):
    """Columns 1.. and rows 0..1 of a matrix, read through its transpose."""
    return x.t().as_strided((x.shape[1] - 1, 2), (1, x.shape[1]), 1)


def every_second(x):
    """Elements 0, 2, 4, ...: a stepped slice, ``(n + 1)//2`` long."""
    return x.as_strided(((x.shape[0] + 1) // 2,), (2,))


def pairs(x):
    """Disjoint windows of 2 (step 2), ``n//2`` of them: unfold, counted by a floor division."""
    return x.as_strided((x.shape[0] // 2, 2), (2, 1))


def pairs_but_last(x):
    """Disjoint windows of 2 but the last: unfold of a slice ending 2 before the end."""
    return x.as_strided((x.shape[0] // 2 - 1, 2), (2, 1))


def windows_step_two(x):
    """Windows of 2 every 2 columns of each row of a matrix, and the rows' transpose."""
    n = x.shape[1]
    return x.as_strided(((n - 2) // 2 + 1, x.shape[0], 2), (2, n, 1))


def row_prefix(x):
    """Three elements of row 0: inside the row only when it has at least three (not proven)."""
    return x[0].as_strided((3,), (1,), 0)


SYMBOLIC = {
    "window": (window, lambda n: (torch.randn(n),)),
    "windows_of_windows": (windows_of_windows, lambda n: (torch.randn(n),)),
    "diagonal": (diagonal, lambda n: (torch.randn(n),)),
    "superdiagonal": (superdiagonal, lambda n: (torch.randn(n),)),
    "all_but_first_rows": (all_but_first_rows, lambda n: (torch.randn(n, n + 2),)),
    "transposed_corner": (transposed_corner, lambda n: (torch.randn(n, n + 1),)),
    "every_second": (every_second, lambda n: (torch.randn(n),)),
    "pairs": (pairs, lambda n: (torch.randn(n),)),
    "pairs_but_last": (pairs_but_last, lambda n: (torch.randn(n),)),
    "windows_step_two": (windows_step_two, lambda n: (torch.randn(n - 3, n),)),
}
SIZES = (7, 9, 12)


# --- make_fx symbolic graphs -----------------------------------------------------------------


@pytest.mark.parametrize("name", SYMBOLIC)
def test_symbolic_graph_is_rewritten_and_right_at_other_sizes(name):
    fn, make = SYMBOLIC[name]
    gm = make_fx(fn, tracing_mode="symbolic")(*make(8))
    assert len(as_strided_nodes(gm)) == 1
    res = fxviews.rewrite(gm)
    [record] = res.records
    assert record.method != "kept", record.reason
    assert len(as_strided_nodes(res.graph_module)) == 0
    for n in SIZES:
        args = make(n)
        torch.testing.assert_close(res.graph_module(*args), fn(*args))


@pytest.mark.parametrize("name", SYMBOLIC)
@pytest.mark.parametrize("bd", [0, 1, -1])
def test_vmap_of_symbolic_graph_is_right_at_every_batch_position(name, bd):
    fn, make = SYMBOLIC[name]
    res = fxviews.rewrite(make_fx(fn, tracing_mode="symbolic")(*make(8)))
    for n in (6, 11):
        samples = [make(n)[0] for _ in range(3)]
        xs = torch.stack(samples, dim=bd if bd >= 0 else samples[0].dim())
        out = torch.func.vmap(res.graph_module, in_dims=bd)(xs)
        for b, sample in enumerate(samples):
            torch.testing.assert_close(out[b], fn(sample))


def test_in_bounds_at_the_hint_only_is_kept_with_the_reason():
    x = torch.randn(4, 5)
    gm = make_fx(row_prefix, tracing_mode="symbolic")(x)
    res = fxviews.rewrite(gm)
    [record] = res.records
    assert record.method == "kept"
    assert "every size" in record.reason and "slice" in record.reason
    # At the trace-time sizes alone it would be rewritten: the proof is what keeps it.
    assert [r.method for r in fxviews.rewrite(make_fx(row_prefix)(x)).records] == ["synthesized"]
    with pytest.raises(fxviews.UnsafeAsStridedError, match="every size"):
        fxviews.rewrite(gm, strict=True)
    # The kept node is right where as_strided is (it reads row 1 when rows are short).
    for shape in ((3, 2), (4, 5)):
        y = torch.randn(shape)
        torch.testing.assert_close(res.graph_module(y), row_prefix(y))


def test_rewrite_adds_no_guard_to_the_shape_environment():
    gm = make_fx(window, tracing_mode="symbolic")(torch.randn(8))
    val = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")
    shape_env = val.shape[0].node.shape_env
    guards = list(shape_env.guards)
    fxviews.rewrite(gm)
    assert shape_env.guards == guards


# --- torch.compile: automatic dynamic and dynamic=True ---------------------------------------


def sliding_window_loss(x):
    """Trained: the backward scatters the windows' gradients back (overlapping: kept)."""
    return (windows_of_windows(x) ** 2).sum()


def trained(fn):
    """``fn`` as a loss: its backward scatters gradients through the as_strided."""

    def loss(x):  # one named argument: Dynamo's automatic dynamic does not track *args
        return (fn(x) ** 2).sum()

    loss.__name__ = f"{fn.__name__}_loss"
    return loss


def grad_inputs(args):
    return tuple(a.requires_grad_() for a in args)


#: name: (function, inputs of size n, trained). Each keeps no as_strided with static shapes.
COMPILED = {
    "window": (sliding_windows, lambda n: (torch.randn(n),), False),
    "windows_of_windows": (windows_of_windows, lambda n: (torch.randn(n),), False),
    "diagonal": (diagonal, lambda n: (torch.randn(n),), False),
    "superdiagonal": (superdiagonal, lambda n: (torch.randn(n),), False),
    "all_but_first_rows": (all_but_first_rows, lambda n: (torch.randn(n, n + 2),), False),
    "transposed_corner": (transposed_corner, lambda n: (torch.randn(n, n + 1),), False),
    "every_second": (every_second, lambda n: (torch.randn(n),), False),
    "pairs_but_last": (pairs_but_last, lambda n: (torch.randn(n),), False),
    "windows_step_two": (windows_step_two, lambda n: (torch.randn(n - 3, n),), False),
    "expand_to_size": (
        lambda v: v.as_strided((v.shape[0], v.shape[0]), (0, 1)),
        lambda n: (torch.randn(n),),
        False,
    ),
}
#: The same functions as losses, trained: name: (loss, inputs of size n).
TRAINED = {
    f"{name}_trained": (trained(fn), lambda n, make=make: grad_inputs(make(n)))
    for name, (fn, make, _) in COMPILED.items()
}


def tail_after_loss(x, y):
    """The elements of ``x`` past the first ``len(y)``: a slice ``s0 - s1`` long, trained."""
    return (x.as_strided((x.shape[0] - y.shape[0],), (1,), y.shape[0]) ** 2).sum()


#: A slice whose length combines two symbols: tracing the loss records the guard
#: ``s0 - s1 >= 2``, so the slice from len(y) is right for every size the graph allows (the
#: forward alone records none: there as_strided raises on a negative size, and it is kept).
TRAINED["tail_after_trained"] = (
    tail_after_loss,
    lambda n: (torch.randn(n + 4, requires_grad=True), torch.randn(n, requires_grad=True)),
)
COMPILE_SIZES = (6, 8, 11, 15)


def compile_and_run(fn, make, training, dynamic, sizes=COMPILE_SIZES):
    """Compile ``fn`` with a capturing inner compiler, check every size against eager, and
    return the as_strided count of each graph the inner compiler got."""
    return compile_and_check(fn, [make(n) for n in sizes], training, dynamic)


def compile_and_check(fn, inputs, training, dynamic):
    """:func:`compile_and_run` over a list of argument tuples."""
    recorder = Recorder()
    compiled = torch.compile(fn, backend=fxviews.backend(inner=recorder), dynamic=dynamic)
    for args in inputs:
        expected = run(fn, args, training)
        torch.testing.assert_close(run(compiled, args, training), expected)
    return recorder.as_strided_counts()


@pytest.mark.parametrize("name", COMPILED)
def test_automatic_dynamic_rewrites_what_static_shapes_rewrite(name):
    fn, make, training = COMPILED[name]
    counts = compile_and_run(fn, make, training, dynamic=None)
    # A static graph for the first size, then one symbolic graph for every later size.
    assert counts == [0, 0]


@pytest.mark.parametrize("name", COMPILED)
def test_dynamic_true_rewrites_what_static_shapes_rewrite(name):
    fn, make, training = COMPILED[name]
    assert compile_and_run(fn, make, training, dynamic=True) == [0]


@pytest.mark.parametrize("name", TRAINED)
@pytest.mark.parametrize("dynamic", [None, True])
def test_trained_losses_reach_the_inner_compiler_as_static_shapes_do(name, dynamic):
    # Loss and gradients equal eager at every size; a forward or backward graph holds an
    # as_strided only where the static one does (AOTAutograd compiles forward, backward).
    fn, make = TRAINED[name]
    static = compile_and_run(fn, make, True, dynamic=False, sizes=COMPILE_SIZES[:1])
    reset_dynamo()
    counts = compile_and_run(fn, make, True, dynamic=dynamic)
    assert len(static) == 2 and counts, counts
    assert all(c == 0 for i, c in enumerate(counts) if static[i % 2] == 0), (static, counts)


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


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", ISSUE)
def test_issue_functions_reach_the_inner_compiler_as_static_shapes_do(name, dynamic):
    # Values and gradients equal eager at every size, and no graph holds more as_strided
    # than the static compile's (a forward, and a backward when trained).
    fn, make, training = ISSUE[name]
    static = compile_and_run(fn, make, training, dynamic=False, sizes=ISSUE_SIZES[:1])
    reset_dynamo()
    counts = compile_and_check(fn, issue_inputs(name, dynamic), training, dynamic)
    per_graph = len(static)
    assert all(c <= static[i % per_graph] for i, c in enumerate(counts)), (static, counts)


ASSERTION = "fxviews: the view ops that replace 'as_strided' need its reads inside its input"


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
    # ... and so does the compiled function: the assertion fires, so no guard made Dynamo
    # recompile there (a recompile would keep the as_strided and raise eager's error).
    reset_dynamo()
    compiled = torch.compile(fn, backend=fxviews.backend(), dynamic=dynamic)
    for args in issue_inputs(name, dynamic):
        run(compiled, args, training)
    with pytest.raises(RuntimeError, match=ASSERTION):
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


def test_jvp_with_a_dynamic_batch_dim_reaches_the_inner_compiler_without_as_strided():
    # Forward AD's tangent views and the backward's scatter buffers of ``jvp_loss``: the rows
    # of every input follow the size; each graph is rewritten for every size.
    def rows(n, requires_grad=False):
        return tuple(torch.randn(n, 6, requires_grad=requires_grad) for _ in range(3))

    assert compile_and_run(push_jvp, rows, False, dynamic=None) == [0, 0]
    reset_dynamo()
    counts = compile_and_run(jvp_loss, lambda n: rows(n, True), True, dynamic=None)
    assert counts == [0, 0, 0, 0]


def test_a_window_past_the_smallest_input_is_rewritten_with_its_bounds_asserted():
    # a.t().as_strided((2, 3), (1, 2), 1) reads storage elements 1..6 of an (n, 3) input: inside
    # it only for n >= 3, and the shape environment allows n = 2. Rewritten in both graphs,
    # the forward asserting 7 <= 3n; at n = 2 the compiled loss raises, as eager does.
    def make(n):
        return (torch.randn(n, 3, requires_grad=True),)

    assert compile_and_run(transposed_window_loss, make, True, None) == [0, 0, 0, 0]
    reset_dynamo()
    compiled = torch.compile(transposed_window_loss, backend=fxviews.backend())
    for n in COMPILE_SIZES:
        run(compiled, make(n), True)
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        run(transposed_window_loss, make(2), True)
    with pytest.raises(RuntimeError, match=ASSERTION):
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


def test_pytorch_failures_are_reported_unchanged():
    # Forward AD over views with dynamic shapes fails inside PyTorch's own tracing on torch
    # 2.13 ("Cannot call storage_offset() on tensor with symbolic sizes"), before any backend
    # sees a graph; later releases trace it. Either way fxviews must do what PyTorch's own
    # backend does: raise exactly its error, or return the same values.
    args = [tuple(torch.randn(2, n) for _ in range(3)) for n in (6, 8)]
    outcomes = []
    for backend in ("aot_eager", fxviews.backend()):
        reset_dynamo()
        compiled = torch.compile(push_jvp, backend=backend)
        compiled(*args[0])
        try:
            outcomes.append(("values", compiled(*args[1])))
        except Exception as error:  # PyTorch's own failure, whatever its type
            outcomes.append(("error", (type(error), str(error))))
    (kind, plain), (fx_kind, fx) = outcomes
    assert kind == fx_kind, outcomes
    if kind == "error":
        assert "Cannot call storage_offset() on tensor with symbolic sizes" in plain[1]
        assert plain[0] is fx[0] and plain[1].splitlines()[0] == fx[1].splitlines()[0]
    else:
        torch.testing.assert_close(fx, push_jvp(*args[1]))
        torch.testing.assert_close(plain, push_jvp(*args[1]))


# --- torch.export with Dims ------------------------------------------------------------------


class Corner(torch.nn.Module):
    def forward(self, x):
        return transposed_corner(x)


class Windows(torch.nn.Module):
    def forward(self, x):
        return windows_of_windows(x) * 2


@pytest.mark.parametrize(
    "module, make, dims",
    [
        (Corner(), lambda n: torch.randn(n, n + 1), lambda n: ({0: n, 1: n + 1},)),
        (Windows(), lambda n: torch.randn(n), lambda n: ({0: n},)),
    ],
)
def test_exported_program_with_dims_is_rewritten(module, make, dims):
    n = torch.export.Dim("n", min=6, max=64)
    ep = torch.export.export(module, (make(8),), dynamic_shapes=dims(n))
    res = fxviews.rewrite(ep)
    assert [r.method for r in res.records] == ["synthesized"]
    assert len(as_strided_nodes(res.exported_program.graph_module)) == 0
    program = res.exported_program.module()
    for k in (6, 9, 20):
        x = make(k)
        torch.testing.assert_close(program(x), module(x))
    # vmap of the program's module at every batch position, against eager per sample.
    for bd in (0, 1):
        samples = [make(7) for _ in range(3)]
        out = torch.func.vmap(program, in_dims=bd)(torch.stack(samples, dim=bd))
        for b, sample in enumerate(samples):
            torch.testing.assert_close(out[b], module(sample))


def size_argument(node):
    """The argument of a view op that a graph input holding a size gives (a node)."""
    args = [a for arg in node.args[1:] for a in (arg if isinstance(arg, list) else [arg])]
    return any(isinstance(a, torch.fx.Node) for a in args)


#: name: (function, inputs of size n, trained, which captured graph, the op taking a size).
#: Each graph reads a size from the graph's own int inputs, never sym_size of a tensor.
SIZED_BY_INPUTS = {
    # The backward unflattens its flat gradient buffer into (n, n) with view(buffer, [n, n])
    # (the reshape step may make it a reshape).
    "diagonal_backward": (*TRAINED["diagonal_trained"], True, -1, ("view", "reshape")),
    "expand_to_size": (*COMPILED["expand_to_size"], 0, ("expand",)),
    # The backward scatters into s//2 - 1 pairs of its flat buffer: a slice ending at
    # 2 * k for the size k the forward saved, as int arithmetic on that input.
    "pairs_backward": (*TRAINED["pairs_but_last_trained"], True, -1, ("slice", "slice_scatter")),
    # ... and into windows of 2 of every row of its (rows, cols) buffer: a view splitting the
    # sliced columns into [rows, k, 2], undone by view(..., [rows, -1]).
    "row_windows_backward": (*TRAINED["windows_step_two_trained"], True, -1, ("view", "reshape")),
    "slice_from_a_size": (*TRAINED["tail_after_trained"], True, 0, ("slice",)),
}


@pytest.mark.parametrize("name", SIZED_BY_INPUTS)
def test_graph_inputs_holding_sizes_are_vmappable(name):
    # vmap runs the rewritten graph at every batch position, against the graph per sample.
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    fn, make, training, position, ops = SIZED_BY_INPUTS[name]
    compiled = torch.compile(fn, backend=fxviews.backend(inner=capture), dynamic=True)
    args = make(6)
    torch.testing.assert_close(run(compiled, args, training), run(fn, args, training))
    gm, example_inputs = graphs[position]
    assert len(as_strided_nodes(gm)) == 0
    assert any(
        str(n.target).split(".")[-2] in ops and size_argument(n)
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, OpOverload)
    ), gm.code
    assert not any(n.target is aten.sym_size.int for n in gm.graph.nodes)

    def tensors_of(graph):  # a backward returns None for inputs without a gradient, and a
        # forward saves sizes (ints) for its backward
        return lambda *args: [out for out in graph(*args) if isinstance(out, torch.Tensor)]

    def concrete(value):
        if isinstance(value, torch.SymInt):
            return int(value.node.hint)
        return torch.randn([concrete(d) for d in value.shape])

    for bd in (0, 1, -1):
        samples = [[concrete(v) for v in example_inputs] for _ in range(3)]
        batched, in_dims = [], []
        for position, value in enumerate(samples[0]):
            if isinstance(value, int):
                batched.append(value)
                in_dims.append(None)
            else:
                column = [sample[position] for sample in samples]
                dim = value.dim() if bd == -1 else min(bd, value.dim())
                batched.append(torch.stack(column, dim=dim))
                in_dims.append(dim)
        out = torch.func.vmap(tensors_of(gm), in_dims=tuple(in_dims))(*batched)
        for b, sample in enumerate(samples):
            for got, want in zip(out, tensors_of(gm)(*sample), strict=True):
                torch.testing.assert_close(got[b], want)


#: More symbolic geometries: name: (function, input of size n, whether it is rewritten).
PROBES = {
    "every_other": (lambda x: x.as_strided((x.shape[0] // 2,), (2,), 1), torch.randn, True),
    "tail": (lambda x: x.as_strided((x.shape[0] - 3,), (1,), 3), torch.randn, True),
    "last_column": (
        lambda x: x.as_strided((x.shape[0],), (x.shape[1],), x.shape[1] - 1),
        lambda n: torch.randn(n, n + 2),
        True,
    ),
    "broadcast_column": (
        lambda x: x[:, :1].as_strided((x.shape[0], 4), (x.shape[1], 0)),
        lambda n: torch.randn(n, 5),
        True,
    ),
    "flatten": (
        lambda x: x.as_strided((x.shape[0] * x.shape[1],), (1,)),
        lambda n: torch.randn(n, n + 1),
        True,
    ),
    "transpose": (
        lambda x: x.as_strided((x.shape[1], x.shape[0]), (1, x.shape[1])),
        lambda n: torch.randn(n, n + 1),
        True,
    ),
    "past_a_short_row": (
        lambda x: x[1].as_strided((4,), (1,), x.shape[1]),
        lambda n: torch.randn(n, n),
        False,
    ),
}


def outcome(fn, *args):
    """``fn(*args)``, or the type of the error it raises."""
    try:
        return fn(*args)
    except (RuntimeError, IndexError) as err:
        return type(err)


@pytest.mark.parametrize("name", PROBES)
def test_symbolic_geometries_are_rewritten_or_kept_and_right_at_every_size(name):
    fn, make, rewritten = PROBES[name]
    res = fxviews.rewrite(make_fx(fn, tracing_mode="symbolic")(make(8)))
    [record] = res.records
    assert (record.method != "kept") == rewritten, record
    for n in (3, 4, 5, 8, 13):
        x = make(n)
        want, got = outcome(fn, x), outcome(res.graph_module, x)
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, msg=f"n={n}")
        else:  # eager raises at this size: so must the graph
            assert got is want, f"n={n}: {got}"


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
    # A backward's buffer is Max(n*m, 3n - 3) long: each argument fits in it.
    buffer = facts.expression(torch.sym_max(n_int * m_int, 3 * n_int - 3))
    assert facts.proves(sympy.Le(n * m, buffer)) and facts.proves(sympy.Le(3 * n - 3, buffer))
    assert not facts.proves(sympy.Le(n * m + 1, buffer))
