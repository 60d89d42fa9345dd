"""Symbolic shapes: as_strided nodes whose geometry is symbolic are rewritten for every size.

Graphs come from make_fx's symbolic mode, from torch.compile with automatic dynamic shapes and
``dynamic=True``, and from torch.export with ``Dim``s. Every rewritten graph is run at sizes
other than the one it was traced on, and under ``vmap`` with the batch dim physically where
``in_dims`` says, against eager PyTorch one sample at a time.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import fxviews
from fxviews.consumers.compile import dynamo_stage
from fxviews.examples import push_jvp
from fxviews.passes.compat.torch_internals import OpOverload, make_fx, reset_dynamo
from tests.reference import as_strided_nodes
from tests.test_backend import (
    Recorder,
    jvp_loss,
    run,
    sliding_windows,
)

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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


@contextlib.contextmanager
def aten_stage_only():
    """The backend with its Dynamo-graph rewrite off: the aten graphs' stage alone, as for the
    as_strided AOTAutograd makes itself. Outside vmap the Dynamo stage leaves symbolic
    as_strided that nothing differentiates to the aten stage, while a static one reaches
    AOTAutograd as view ops (so it differentiates no as_strided): comparing a symbolic
    compile with a static one compares the aten stage's graphs, with it alone."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(dynamo_stage, "rewrite_dynamo_graph", lambda gm, strict: None)
        yield


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
    with aten_stage_only():
        static = compile_and_run(fn, make, True, dynamic=False, sizes=COMPILE_SIZES[:1])
    reset_dynamo()
    counts = compile_and_run(fn, make, True, dynamic=dynamic)
    assert len(static) == 2 and counts, counts
    assert all(c == 0 for i, c in enumerate(counts) if static[i % 2] == 0), (static, counts)


def test_jvp_with_a_dynamic_batch_dim_reaches_the_inner_compiler_without_as_strided():
    # Forward AD's tangent views and the backward's scatter buffers of ``jvp_loss``: the rows
    # of every input follow the size; each graph is rewritten for every size.
    def rows(n, requires_grad=False):
        return tuple(torch.randn(n, 6, requires_grad=requires_grad) for _ in range(3))

    assert compile_and_run(push_jvp, rows, False, dynamic=None) == [0, 0]
    reset_dynamo()
    counts = compile_and_run(jvp_loss, lambda n: rows(n, True), True, dynamic=None)
    assert counts == [0, 0, 0, 0]


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
@aten_stage_only()
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
