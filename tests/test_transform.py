"""``fxviews.transform`` and ``fxviews.explain``.

Two ways a transform meets ``transform(f)``:

* **around it**: ``vmap``/``jvp``/``grad``/... of ``transform(f)`` must equal the same transform
  of ``f`` (and, for vmap, eager ``f`` per sample). Here the transformed function is called with
  batched/dual/grad-tracking wrappers and must trace outside them.
* **inside it**: ``f`` itself uses ``torch.func`` (or ``as_strided``), so its traced graph holds
  as_strided nodes with trace-time strides; ``vmap(transform(f))`` with the batch dim physically
  anywhere must still equal eager ``f`` per sample, where ``vmap`` of the raw graph is wrong.

Batched inputs are built with ``torch.stack(samples, dim=bd)`` (tests/reference.py), so the
batch dim really sits where ``in_dims`` says.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import fxviews
from fxviews.rewriting.printouts import DEBUG_ENV
from tests.device_checks import raise_if_test_device_failed
from tests.differential import assert_every_layout_matches
from tests.reference import (
    as_strided_nodes,
    assert_tree_close,
    in_dims_id,
    in_dims_sweep,
    make_samples,
    nested_per_sample_reference,
    nested_stack_batched,
    per_sample_reference,
    stack_batched,
)

BATCH = 3
SHAPE = (3, 4)


# --------------------------------------------------------------------------------------------
# Functions that mutate a base through several views and read other views.
# --------------------------------------------------------------------------------------------


def seed(x: torch.Tensor, y: torch.Tensor) -> Any:
    """The smallest case: a view of a base that is then overwritten, both returned."""
    x = x.clone()
    view = x[0]
    x.copy_(y)
    return view, x


def several_views(x: torch.Tensor, y: torch.Tensor) -> Any:
    x = x.clone()
    row, col, diag = x[1], x[:, 2], x.diagonal()
    col.add_(y[:, 1])
    x[0].mul_(y[0])
    x.t()[1:3].mul_(y.t()[0:2])
    return row, col * 2, diag, x.unfold(1, 2, 1), x


def chunks(x: torch.Tensor, y: torch.Tensor) -> Any:
    x = x.clone()
    left = x[:, :2]
    last = x.select(0, 2)
    left.mul_(y[:, :2])
    # Taken after the base gained a gradient: mutating a view taken before that is rejected
    # by eager grad ("a leaf Variable that requires grad is being used in an in-place op").
    x.narrow(1, 2, 2).copy_(y[:, 2:] * 3)
    return last, left.movedim(0, 1), x[:, ::3], x.narrow(0, 1, 2).expand(2, 2, 4)


CORPUS = [seed, several_views, chunks]


def loss(out: Any) -> torch.Tensor:
    """A nonlinear real scalar of every output leaf, so gradients depend on the values."""
    return sum((leaf * leaf.sin()).sum() for leaf in pytree.tree_leaves(out))


# Wrappers that apply a torch.func transform *inside* the function; their traces hold
# as_strided nodes (forward AD view tangents, AsStridedBackward / CopySlices).


def inner_jvp(f: Callable[..., Any]) -> Callable[..., Any]:
    def push_jvp(x, y, yt):
        return jvp(functools.partial(f, x), (y,), (yt,))

    return push_jvp


def inner_vjp(f: Callable[..., Any]) -> Callable[..., Any]:
    def pull_vjp(x, y):
        out, pullback = vjp(functools.partial(f, x), y)
        return out, pullback(pytree.tree_map(torch.cos, out))

    return pull_vjp


def inner_grad(f: Callable[..., Any]) -> Callable[..., Any]:
    def gradient(x, y):
        return grad(lambda y: loss(f(x, y)))(y)

    return gradient


def inner_jacfwd(f: Callable[..., Any]) -> Callable[..., Any]:
    def jacobian(x, y):
        return jacfwd(lambda y: f(x, y))(y)

    return jacobian


def inner_jacrev(f: Callable[..., Any]) -> Callable[..., Any]:
    def jacobian(x, y):
        return jacrev(lambda y: f(x, y))(y)

    return jacobian


def inner_hessian(f: Callable[..., Any]) -> Callable[..., Any]:
    def hess(x, y):
        return hessian(lambda y: loss(f(x, y)))(y)

    return hess


INNER = {
    "jvp": (inner_jvp, 3),
    "vjp": (inner_vjp, 2),
    "grad": (inner_grad, 2),
    "jacfwd": (inner_jacfwd, 2),
    "jacrev": (inner_jacrev, 2),
    "hessian": (inner_hessian, 2),
}


def samples_for(n_args: int, shape=SHAPE, *, seed: int = 0, dtype=torch.float64, batch=BATCH):
    return make_samples([shape] * n_args, batch, seed=seed, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Transforms inside fn, vmap outside: the push_jvp example and its relatives.
# --------------------------------------------------------------------------------------------


def _inner_cases():
    for f in CORPUS:
        for name, (_, n_args) in INNER.items():
            # Jacobians/Hessians of every corpus function cost more than they add; push_jvp and
            # one multi-view function cover them.
            if name in ("jacfwd", "jacrev", "hessian") and f is chunks:
                continue
            for in_dims in in_dims_sweep([2] * n_args, unbatched=[1]):
                case_id = f"{f.__name__}-{name}-{in_dims_id(in_dims)}"
                yield pytest.param(f, name, in_dims, id=case_id)


@pytest.mark.parametrize("f, inner, in_dims", list(_inner_cases()))
def test_vmap_of_transform_with_inner_functorch_matches_per_sample(f, inner, in_dims):
    wrap, n_args = INNER[inner]
    fn = wrap(f)
    samples = samples_for(n_args)
    batched = stack_batched(samples, in_dims)
    actual = vmap(fxviews.transform(fn), in_dims=in_dims)(*batched)
    assert_tree_close(actual, per_sample_reference(fn, samples, in_dims), msg=fn.__name__)


@pytest.mark.parametrize("f", CORPUS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("inner", sorted(INNER))
def test_explain_leaves_no_as_strided_for_the_corpus(f, inner):
    wrap, n_args = INNER[inner]
    result = fxviews.explain(wrap(f), *samples_for(n_args, batch=1)[0])
    assert result.records, "the corpus is meant to produce as_strided nodes"
    assert all(r.method != "kept" for r in result.records), result
    assert not as_strided_nodes(result.graph_module)


def test_raw_graph_is_wrong_where_transform_is_right():
    """The harness can fail: the traced graph, vmapped as is, gives wrong tangents."""
    fn = inner_jvp(seed)
    samples = samples_for(3)
    in_dims = (1, 2, 2)
    batched = stack_batched(samples, in_dims)
    reference = per_sample_reference(fn, samples, in_dims)
    raw = vmap(fxviews.trace(fn, *samples[0]), in_dims=in_dims)(*batched)
    with pytest.raises(AssertionError):
        assert_tree_close(raw, reference)
    assert_tree_close(vmap(fxviews.transform(fn), in_dims=in_dims)(*batched), reference)


# --------------------------------------------------------------------------------------------
# Transforms around transform(f): equal to the same transform of f.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("f", CORPUS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("in_dims", in_dims_sweep([2, 2], unbatched=[1]), ids=in_dims_id)
def test_vmap_around_transform(f, in_dims):
    samples = samples_for(2)
    batched = stack_batched(samples, in_dims)
    actual = vmap(fxviews.transform(f), in_dims=in_dims)(*batched)
    assert_tree_close(actual, per_sample_reference(f, samples, in_dims))


def _outer(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``name`` applied to ``fn(x, y)`` with respect to ``y``, as a function of ``(x, y)``."""
    scalar = lambda x, y: loss(fn(x, y))  # noqa: E731
    if name == "jvp":
        return lambda x, y: jvp(functools.partial(fn, x), (y,), (y.cos(),))
    if name == "vjp":

        def pull(x, y):
            out, pullback = vjp(functools.partial(fn, x), y)
            return out, pullback(pytree.tree_map(torch.sin, out))

        return pull
    if name == "grad":
        return grad(scalar, argnums=1)
    if name == "jacfwd":
        return jacfwd(fn, argnums=1)
    if name == "jacrev":
        return jacrev(fn, argnums=1)
    if name == "hessian":
        return hessian(scalar, argnums=1)
    if name == "jacfwd(jacrev)":
        return jacfwd(jacrev(scalar, argnums=1), argnums=1)
    raise AssertionError(name)


OUTER = ["jvp", "vjp", "grad", "jacfwd", "jacrev", "hessian", "jacfwd(jacrev)"]


@pytest.mark.parametrize("f", CORPUS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("outer", OUTER)
def test_transform_around_transform_equals_transform_of_f(f, outer):
    x, y = samples_for(2, batch=1)[0]
    assert_tree_close(_outer(outer, fxviews.transform(f))(x, y), _outer(outer, f)(x, y))


@pytest.mark.parametrize("outer", ["grad", "jvp", "jacrev"])
@pytest.mark.parametrize("in_dims", in_dims_sweep([2, 2]), ids=in_dims_id)
def test_vmap_of_outer_transform_around_transform(outer, in_dims):
    """vmap(grad(transform(f))) and friends: the wrappers nest (Batched over GradTracking)."""
    samples = samples_for(2)
    batched = stack_batched(samples, in_dims)
    actual = vmap(_outer(outer, fxviews.transform(several_views)), in_dims=in_dims)(*batched)
    assert_tree_close(actual, per_sample_reference(_outer(outer, several_views), samples, in_dims))


@pytest.mark.parametrize(
    "inner_dims, outer_dims", [((0, 0), (0, 0)), ((1, 2), (2, 0)), ((2, 1), (1, 3))]
)
def test_nested_vmap_around_transform_with_inner_jvp(inner_dims, outer_dims):
    fn = inner_vjp(several_views)
    grid = [samples_for(2, seed=i) for i in range(2)]
    batched = nested_stack_batched(grid, inner_dims, outer_dims)
    actual = vmap(vmap(fxviews.transform(fn), in_dims=inner_dims), in_dims=outer_dims)(*batched)
    assert_tree_close(actual, nested_per_sample_reference(fn, grid, inner_dims))


def test_transform_inside_transform_traces_through():
    """A transformed function called while another one is being traced (an outer make_fx)."""
    inner = fxviews.transform(inner_jvp(seed))
    outer = fxviews.transform(lambda x, y, yt: [t * 2 for t in pytree.tree_leaves(inner(x, y, yt))])
    samples = samples_for(3)
    in_dims = (2, 1, 0)
    actual = vmap(outer, in_dims=in_dims)(*stack_batched(samples, in_dims))

    def reference(x, y, yt):
        return [t * 2 for t in pytree.tree_leaves(inner_jvp(seed)(x, y, yt))]

    assert_tree_close(actual, per_sample_reference(reference, samples, in_dims))


def test_tracing_a_transformed_function_traces_through_it():
    """fxviews.trace of a transformed function records the function's own ops, as tracing the
    function itself does (no machinery of the transform leaks in), and explain rewrites them."""
    sample = samples_for(3, batch=1)[0]
    gm = fxviews.trace(fxviews.transform(inner_jvp(seed)), *sample)
    direct = fxviews.trace(inner_jvp(seed), *sample)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [n.target for n in direct.graph.nodes if n.op == "call_function"]
    assert all(node.op != "get_attr" for node in gm.graph.nodes), gm.code
    explained = fxviews.explain(fxviews.transform(inner_jvp(seed)), *sample)
    assert as_strided_nodes(gm) and not as_strided_nodes(explained.graph_module)


# --------------------------------------------------------------------------------------------
# User-written as_strided: eager vmap is silently wrong unless the batch dim is first.
# --------------------------------------------------------------------------------------------


def sliding_windows(x):
    return x.as_strided((x.numel() - 2, 3), (1, 1)) * 1


def patches(x):
    h, w = x.shape
    return x.as_strided((h - 1, w - 1, 2, 2), (w, 1, w, 1)).sum((-1, -2))


def hankel(v):
    n = (v.numel() + 1) // 2
    return v.as_strided((n, n), (1, 1)) * 1


def strided_diagonal(x):
    return x.as_strided((x.shape[0],), (x.shape[1] + 1,)) * 1


def stride0_broadcast(v):
    return v.as_strided((3, v.numel()), (0, 1)) * v.as_strided((v.numel(), 3), (1, 0)).t()


def blocks(x):
    n = x.shape[1]
    return x.as_strided((2, 2), (n, 1), n + 1) * 1 + x.as_strided((2, 2), (n, 1), 0)


def offset_view_blocks(x):
    # as_strided of a view with a storage offset: read relative to the view's own layout.
    inner = x[1:]
    return inner.as_strided((2, 2), (x.shape[1], 1), x.shape[1] + 1) * 1


def stft_frames(x):
    window = torch.hann_window(8, dtype=x.dtype.to_real(), device=x.device)
    spec = torch.stft(x, 8, hop_length=2, window=window, center=False, return_complex=True)
    return spec.abs() if not x.is_complex() else spec.real


USER = [
    (sliding_windows, (7,)),
    (patches, (4, 5)),
    (hankel, (7,)),
    (strided_diagonal, (4, 4)),
    (stride0_broadcast, (5,)),
    (blocks, (4, 4)),
    (offset_view_blocks, (4, 4)),
    (stft_frames, (24,)),
]


def _user_cases():
    for fn, shape in USER:
        for bd in range(len(shape) + 1):
            yield pytest.param(fn, shape, bd, id=f"{fn.__name__}-bd={bd}")


@pytest.mark.parametrize("fn, shape, bd", list(_user_cases()))
def test_vmap_of_user_as_strided(fn, shape, bd):
    samples = make_samples([shape], BATCH, seed=1)
    (batched,) = stack_batched(samples, (bd,))
    actual = vmap(fxviews.transform(fn), in_dims=bd)(batched)
    assert_tree_close(actual, per_sample_reference(fn, samples, (bd,)))


@pytest.mark.parametrize("fn, shape, bd", list(_user_cases()))
def test_vmap_of_jvp_of_user_as_strided(fn, shape, bd):
    samples = make_samples([shape, shape], BATCH, seed=2)
    batched = stack_batched(samples, (bd, (bd + 1) % (len(shape) + 1)))
    in_dims = (bd, (bd + 1) % (len(shape) + 1))
    tf = fxviews.transform(fn)
    actual = vmap(lambda x, t: jvp(tf, (x,), (t,)), in_dims=in_dims)(*batched)
    expected = per_sample_reference(lambda x, t: jvp(fn, (x,), (t,)), samples, in_dims)
    assert_tree_close(actual, expected)


def test_eager_vmap_of_user_as_strided_is_wrong_when_batch_is_not_first():
    """Why transform exists: the same comparison fails for eager vmap (documents the bug)."""
    samples = make_samples([(7,)], BATCH, seed=1)
    (batched,) = stack_batched(samples, (1,))
    with pytest.raises(AssertionError):
        assert_tree_close(
            vmap(hankel, in_dims=1)(batched), per_sample_reference(hankel, samples, (1,))
        )


@pytest.mark.parametrize("inner_bd, outer_bd", [(0, 1), (1, 0), (2, 2)])
def test_nested_vmap_of_user_as_strided(inner_bd, outer_bd):
    grid = [make_samples([(4, 5)], 2, seed=10 + i) for i in range(3)]
    (batched,) = nested_stack_batched(grid, (inner_bd,), (outer_bd,))
    actual = vmap(vmap(fxviews.transform(patches), in_dims=inner_bd), in_dims=outer_bd)(batched)
    assert_tree_close(actual, nested_per_sample_reference(patches, grid, (inner_bd,)))


# --------------------------------------------------------------------------------------------
# dtypes and edge shapes.
# --------------------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("in_dims", [(0, 0, 0), (1, 2, 2), (2, 0, 1)], ids=in_dims_id)
def test_seed_dtypes(dtype, in_dims):
    fn = inner_jvp(several_views)
    samples = samples_for(3, dtype=dtype)
    actual = vmap(fxviews.transform(fn), in_dims=in_dims)(*stack_batched(samples, in_dims))
    assert_tree_close(actual, per_sample_reference(fn, samples, in_dims))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "fn, shape",
    [(hankel, (7,)), (patches, (4, 5)), (stft_frames, (24,))],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_user_as_strided_dtypes(dtype, fn, shape):
    samples = make_samples([shape], BATCH, seed=3, dtype=dtype)
    (batched,) = stack_batched(samples, (1,))
    actual = vmap(fxviews.transform(fn), in_dims=1)(batched)
    assert_tree_close(actual, per_sample_reference(fn, samples, (1,)))


def scalar_seed(x, y):
    x = x.clone()
    view = x[...]
    x.mul_(y)
    return view * 2, x


def first_column(x, y):
    x = x.clone()
    col = x[:, 0]
    x.copy_(y)
    return col, x[0:0]


EDGE = [
    pytest.param(scalar_seed, (), id="0-dim"),
    pytest.param(first_column, (0, 3), id="0-size"),
    pytest.param(seed, (2, 0), id="0-size-views"),
    pytest.param(seed, (1, 4), id="size-1-rows"),
    pytest.param(first_column, (4, 1), id="size-1-cols"),
    pytest.param(several_views, (3, 4), id="regular"),
]


@pytest.mark.parametrize("f, shape", EDGE)
@pytest.mark.parametrize("inner", ["jvp", "vjp"])
def test_edge_shapes(f, shape, inner):
    wrap, n_args = INNER[inner]
    fn = wrap(f)
    samples = make_samples([shape] * n_args, BATCH, seed=4)
    assert_every_layout_matches(fxviews.transform(fn), fn, samples, label=f"{inner} {shape}")


def test_non_contiguous_arguments_without_vmap():
    fn = inner_jvp(several_views)
    x, y, yt = samples_for(3, batch=1)[0]
    odd = (x.t().contiguous().t(), y[:, None].expand(3, 2, 4)[:, 1], yt.clone())
    assert_tree_close(fxviews.transform(fn)(*odd), fn(*odd))


# --------------------------------------------------------------------------------------------
# Call semantics: signature cache, pytrees, aliasing, metadata.
# --------------------------------------------------------------------------------------------


def test_cache_hits_for_same_signature_and_inside_vmap():
    tf = fxviews.transform(inner_jvp(seed))
    x, y, yt = samples_for(3, batch=1)[0]
    tf(x, y, yt)
    tf(x + 1, y, yt)
    assert tf.cache_info()[:2] == (1, 1)
    # Inside vmap the logical shapes are the per-sample ones: the same graph is reused.
    vmap(tf, in_dims=(1, 2, 2))(*stack_batched(samples_for(3), (1, 2, 2)))
    assert tf.cache_info().hits == 2 and tf.cache_info().misses == 1


def test_cache_keys_on_shape_dtype_and_non_tensor_values(capsys: pytest.CaptureFixture[str]):
    # Each trace runs fn once, and fn's print with it (a Python side effect happens at trace
    # time only; a list it appended to would make the trace refused).
    def fn(x, scale, *, mode):
        print("traced")
        return x * scale if mode == "mul" else x + scale

    tf = fxviews.transform(fn)
    x = torch.ones(2)
    assert torch.equal(tf(x, 2, mode="mul"), torch.full((2,), 2.0))
    assert torch.equal(tf(x, 2, mode="add"), torch.full((2,), 3.0))
    tf(x, 2.0, mode="mul")  # 2 and 2.0 hash equal but are different signatures
    tf(x.double(), 2, mode="mul")
    tf(torch.ones(3), 2, mode="mul")
    tf(x, 2, mode="mul")
    assert capsys.readouterr().out.split() == ["traced"] * 5
    assert tf.cache_info() == (1, 5, 32, 5, 0)  # hits, misses, maxsize, currsize, eager


@pytest.mark.parametrize("zero", [0.0, -0.0, 0j, complex(-0.0, 0.0)])
def test_the_sign_of_a_zero_argument_selects_its_own_graph(zero):
    # 0.0 == -0.0 (and they hash equal), but a graph bakes the number in: atan2 turns the sign
    # into pi or -pi. Each sign, called after the other, must give eager's value.
    def fn(x, s):
        return torch.atan2(torch.full_like(x, s.real if isinstance(s, complex) else s), -x)

    other = -zero if isinstance(zero, float) else complex(-zero.real, zero.imag)
    tf, x = fxviews.transform(fn), torch.ones(2)
    for s in (other, zero, other, zero):
        torch.testing.assert_close(tf(x, s), fn(x, s), rtol=0, atol=0)
    assert tf.cache_info()[:2] == (2, 2)  # hits, misses


LAZY_BIT_FNS = {
    "resolve_conj().add_": lambda x: x.resolve_conj().add_(1),
    "is_conj branch": lambda x: x * (2 if x.is_conj() else 1),
    "imag": lambda x: x.imag * 1,
    "view_as_real": lambda x: torch.view_as_real(x.resolve_conj()) + 0,
}


@pytest.mark.parametrize("vmapped", [False, True])
@pytest.mark.parametrize("name", sorted(LAZY_BIT_FNS))
def test_an_argument_with_the_conjugate_bit_runs_as_eager_does(name, vmapped, caplog):
    # The trace's samples are plain tensors: a graph would write resolve_conj()'s "copy" into
    # the caller's memory, and read is_conj() as False. Such a call runs eagerly, and a plain
    # call of the same values (before or after it) has its own graph.
    fn = LAZY_BIT_FNS[name]
    tf = fxviews.transform(fn)
    if vmapped:
        fn, tf = torch.func.vmap(fn, in_dims=1), torch.func.vmap(tf, in_dims=1)

    def call(f, conj):  # the result and the caller's tensor after the call, or eager's error
        base = torch.tensor([[1 + 1j, 2 - 2j], [3 + 3j, -4j]])
        x = base.conj() if conj else base
        try:
            return f(x), base
        except RuntimeError as err:  # vmap has no batching rule for x.imag's _neg_view
            return str(err)

    for conj in (False, True, False, True):
        got, want = call(tf, conj), call(fn, conj)
        if isinstance(want, str):
            assert got == want
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert "lazy conjugate bit" in caplog.text


def test_an_argument_with_the_negative_bit_runs_as_eager_does():
    def fn(x):
        return x.resolve_neg().add_(10)

    tf = fxviews.transform(fn)
    for f in (tf, fn):
        z = torch.tensor([1 + 1j, 2 + 2j])
        torch.testing.assert_close(f(z.conj().imag), torch.tensor([9.0, 8.0]))
        torch.testing.assert_close(z, torch.tensor([1 + 1j, 2 + 2j]))  # eager wrote a copy


def test_cache_is_bounded_lru():
    tf = fxviews.transform(lambda x: x * 2, cache_size=2)
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    tf(a), tf(b), tf(a), tf(c)  # c evicts b, the least recently used
    assert tf.cache_info().currsize == 2
    tf(a)
    assert tf.cache_info().misses == 3
    tf(b)
    assert tf.cache_info().misses == 4
    tf.cache_clear()
    assert tf.cache_info() == (0, 0, 2, 0, 0)


def test_cache_keys_on_device(capsys: pytest.CaptureFixture[str]):
    def double(x):
        print(x.device.type)
        return x * 2

    tf = fxviews.transform(double)
    assert torch.equal(tf(torch.ones(2)), torch.full((2,), 2.0))
    on_meta = tf(torch.ones(2, device="meta"))
    assert on_meta.device.type == "meta" and on_meta.shape == (2,)
    tf(torch.ones(2))
    assert capsys.readouterr().out.split() == ["cpu", "meta"]
    assert tf.cache_info()[:2] == (1, 2)


def test_lru_counts_every_hit_of_both_key_kinds(capsys: pytest.CaptureFixture[str]):
    """Positional-tensor calls (the inline hit) and keyword calls (the general key) share one
    LRU order; a run of hits on one signature keeps it the most recently used."""

    def scaled(x, scale=1):
        print(x.shape[0], scale)
        return x * scale

    tf = fxviews.transform(scaled, cache_size=2)
    a, b = torch.ones(1), torch.ones(2)
    tf(a), tf(a, scale=3), tf(a), tf(a)  # a used last, (a, scale=3) before it
    tf(b)  # evicts (a, scale=3)
    assert tf.cache_info()[:2] == (2, 3)
    tf(a)
    tf(a, scale=3)  # traced again; evicts b, now the least recently used
    tf(a)
    tf(b)
    assert capsys.readouterr().out.splitlines() == ["1 1", "1 3", "2 1", "1 3", "2 1"]
    assert tf.cache_info() == (4, 5, 2, 2, 0)


class _Marked(torch.Tensor):
    """A tensor subclass with nothing of its own, as a user's marker class is."""


def test_hot_call_serves_only_tensors_of_its_signature(capsys: pytest.CaptureFixture[str]):
    """The hot call (the entry the last positional call ran, checked in C++) hands a call to
    the keyed lookup whenever its tensors differ in anything the key holds (strides: Note [The
    layout of a call]; requires_grad: the trace's tensors require grad where the call's do;
    being an nn.Parameter, which isinstance sees), and still serves tensors that differ only in
    what the key leaves out (another subclass). Each call is compared with eager, and each
    trace with the signatures seen so far (each trace prints what it sees)."""

    def scaled(x, y):
        print((tuple(x.shape), x.dtype, x.device.type, y.dim(), x.stride()))
        return x.sum(-1, keepdim=True) * y

    tf = fxviews.transform(scaled)
    x, y = torch.randn(2, 3), torch.randn(2, 1)
    traced: list[str] = []
    calls = [
        (x, y),
        (x, y),  # the hot call
        (torch.randn(3, 3), torch.randn(3, 1)),  # shape
        (x, y),
        (x.double(), y.double()),  # dtype
        (x.to("meta"), y.to("meta")),  # device
        (x, torch.randn(1)),  # the second tensor's rank
        (x.t().contiguous().t(), y),  # strides only: a layout of its own
        (x.clone().requires_grad_(), y),  # requires_grad
        (torch.nn.Parameter(x.clone()), y),  # a Parameter: a signature of its own
        (torch.Tensor._make_subclass(_Marked, x.clone(), True), y),  # a subclass of the last
        (x, y),
    ]
    for args in calls:
        got = tf(*args)
        traced += capsys.readouterr().out.splitlines()
        want = scaled(*args)
        capsys.readouterr()  # the eager reference's own line
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.device == want.device and got.requires_grad == want.requires_grad
        if got.device.type != "meta":
            torch.testing.assert_close(got, want)
    assert traced == [
        str(signature)
        for signature in [
            ((2, 3), torch.float32, "cpu", 2, (3, 1)),
            ((3, 3), torch.float32, "cpu", 2, (3, 1)),
            ((2, 3), torch.float64, "cpu", 2, (3, 1)),
            ((2, 3), torch.float32, "meta", 2, (3, 1)),
            ((2, 3), torch.float32, "cpu", 1, (3, 1)),
            ((2, 3), torch.float32, "cpu", 2, (1, 2)),  # traced on the call's own layout
            ((2, 3), torch.float32, "cpu", 2, (3, 1)),  # requiring grad
            ((2, 3), torch.float32, "cpu", 2, (3, 1)),  # a Parameter
        ]
    ]
    assert tf.cache_info()[:2] == (len(calls) - len(traced), len(traced))
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(tf(leaf, y).sum(), leaf)
    torch.testing.assert_close(grad, y.expand(2, 3))


def test_hot_call_of_an_evicted_or_cleared_entry_traces_again(capsys: pytest.CaptureFixture[str]):
    def traced() -> list[str]:
        return capsys.readouterr().out.split()

    def double(x):
        print(x.shape[0])
        return x * 2

    tf = fxviews.transform(double, cache_size=1)
    a, b = torch.ones(1), torch.ones(2)
    tf(a), tf(a), tf(b), tf(a)  # b evicts a, the hot entry; a evicts b
    assert traced() == ["1", "2", "1"] and tf.cache_info().currsize == 1
    tf.cache_clear()
    assert torch.equal(tf(a), a * 2) and traced() == ["1"]


def test_unhashable_non_tensor_argument_is_keyed_by_identity():
    class Config:  # unhashable on purpose
        __hash__ = None

        def __init__(self, k):
            self.k = k

    tf = fxviews.transform(lambda x, cfg: x * cfg.k)
    cfg = Config(3)
    assert torch.equal(tf(torch.ones(2), cfg), torch.full((2,), 3.0))
    assert torch.equal(tf(torch.ones(2), Config(4)), torch.full((2,), 4.0))
    tf(torch.ones(2), cfg)
    assert tf.cache_info()[:2] == (1, 2)


def test_pytree_inputs_and_outputs_with_constants():
    def fn(inputs, n):
        a, b = inputs["a"], inputs["b"][0]
        return {"sum": a + b, "n": n, "none": None, "shape": a.shape[0], "pair": (a * 2, "tag")}

    tf = fxviews.transform(fn)
    inputs = {"a": torch.arange(3.0), "b": [torch.ones(3)]}
    out = tf(inputs, 7)
    assert out["n"] == 7 and out["none"] is None and out["shape"] == 3 and out["pair"][1] == "tag"
    assert_tree_close(out["sum"], torch.arange(3.0) + 1)


def test_pytree_inputs_under_vmap():
    tf = fxviews.transform(lambda inputs: {"sum": inputs["a"] + inputs["b"][0]})
    a, b = torch.arange(6.0).view(3, 2), torch.ones(3)
    batched = vmap(tf, in_dims=({"a": 1, "b": [None]},))({"a": a, "b": [b]})
    assert_tree_close(batched, {"sum": a.t() + b})


def test_aliasing_and_in_place_mutation_of_arguments_are_kept():
    tf = fxviews.transform(lambda x: (x.add_(1), x[0]))
    x = torch.zeros(2, 3)
    out, row = tf(x)
    assert torch.equal(x, torch.ones(2, 3))
    assert out.data_ptr() == x.data_ptr() and row.data_ptr() == x.data_ptr()


def test_closure_tensors_are_used_by_reference():
    weight = torch.ones(3, requires_grad=True)
    tf = fxviews.transform(lambda x: (x * weight).sum())
    tf(torch.arange(3.0)).backward()
    assert torch.equal(weight.grad, torch.arange(3.0))


def test_data_dependent_values_trace_like_eager():
    tf = fxviews.transform(lambda x: (x * x.max().item(), x[x > 0]))
    x = torch.tensor([1.0, -2.0, 3.0])
    assert_tree_close(tf(x), (x * 3, torch.tensor([1.0, 3.0])))


def eager_outcome(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or the type and first line of the error it raises."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as err:
        raise_if_test_device_failed(err, f"{fn}")
        return type(err), str(err).splitlines()[0]


#: Per sample shapes of functions with a data-dependent output shape, under vmap. A zero-size
#: dim makes the result static; otherwise every sample must have as many nonzeros (eager
#: vmap's per-sample fallback stacks them) or eager vmap raises.
DYNAMIC_SHAPE_CASES = {
    "argwhere_empty": (torch.argwhere, lambda: torch.randn(3, 0, 4), 0),
    "argwhere_empty_last": (torch.argwhere, lambda: torch.randn(2, 0, 5), -1),
    "argwhere_full": (torch.argwhere, lambda: torch.randn(3, 2, 4), 1),
    "argwhere_uneven": (
        torch.argwhere,
        lambda: torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 1.0]]),
        0,
    ),
    "mask_then_view": (lambda x: x[x != 0].as_strided((2,), (1,)) * 2, lambda: torch.ones(3, 4), 0),
}


@pytest.mark.parametrize("name", DYNAMIC_SHAPE_CASES)
def test_vmap_of_a_graph_with_a_data_dependent_shape_runs_as_eager_vmap(name):
    # vmap cannot batch nonzero (what argwhere and boolean masks trace into): the graph runs
    # unbatched, and under vmap fn runs as eager vmap runs it, values or error.
    fn, make, bd = DYNAMIC_SHAPE_CASES[name]
    x = make()
    tf = fxviews.transform(fn)
    want, got = eager_outcome(vmap(fn, in_dims=bd), x), eager_outcome(vmap(tf, in_dims=bd), x)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want
    sample = x.select(bd, 0)
    assert_tree_close(tf(sample), fn(sample))  # unbatched: the graph itself
    assert tf.cache_info().eager == 0


def test_functools_wraps():
    def documented(x):
        """Docstring."""
        return x

    tf = fxviews.transform(documented)
    assert tf.__name__ == "documented" and tf.__doc__ == "Docstring."
    assert tf.__wrapped__ is documented


def test_explain_returns_the_rewrite_result():
    result = fxviews.explain(inner_jvp(seed), *samples_for(3, batch=1)[0])
    assert isinstance(result, fxviews.RewriteResult)
    assert [r.method for r in result.records] == ["provenance"]
    assert "select" in str(result)


def test_debug_env_prints_each_rewrite_once(monkeypatch, capsys):
    monkeypatch.setenv(DEBUG_ENV, "1")
    tf = fxviews.transform(inner_jvp(seed))
    args = samples_for(3, batch=1)[0]
    tf(*args)
    first = capsys.readouterr().err
    assert "fxviews rewrite: transform(" in first and "+++ after" in first and "provenance" in first
    tf(*args)  # cached: nothing is rewritten, nothing printed
    assert capsys.readouterr().err == ""


def test_debug_logging(caplog):
    with caplog.at_level(logging.DEBUG, logger="fxviews"):
        fxviews.transform(inner_jvp(seed))(*samples_for(3, batch=1)[0])
    messages = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    assert any("as_strided" in m and "provenance" in m for m in messages)


# --------------------------------------------------------------------------------------------
# Errors.
# --------------------------------------------------------------------------------------------


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="callable"):
        fxviews.transform(torch.ones(2))
    with pytest.raises(TypeError, match="callable"):
        fxviews.explain("not a function", torch.ones(2))


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_bad_cache_size(size):
    with pytest.raises(ValueError, match="cache_size"):
        fxviews.transform(lambda x: x, cache_size=size)


def branchy(x):
    if x.sum() > 0:
        return x * 2
    return x


def test_data_dependent_control_flow_names_fn_under_strict():
    with pytest.raises(fxviews.TracingError, match=r"branchy.*control flow") as info:
        fxviews.transform(branchy, strict=True)(torch.ones(3))
    assert info.value.cause == "control flow"
    with pytest.raises(fxviews.FxViewsError, match="branchy"):
        vmap(fxviews.transform(branchy, strict=True))(torch.ones(2, 3))


def test_data_dependent_control_flow_runs_eagerly_and_says_so(caplog):
    tf = fxviews.transform(branchy)
    x = torch.tensor([1.0, -3.0, 0.5])
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        assert torch.equal(tf(x), branchy(x))
        assert torch.equal(tf(-x), branchy(-x))  # the other branch: no graph baked one in
    assert tf.cache_info()[:2] == (1, 1) and tf.cache_info().eager == 1  # the hit: once
    warnings = [r for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(warnings) == 1 and "branchy" in warnings[0].getMessage()
    batched = torch.stack([x, -x], dim=1)
    with pytest.raises(RuntimeError):  # eager vmap refuses the branch: so does the fallback
        vmap(branchy, in_dims=1)(batched)
    with pytest.raises(RuntimeError):
        vmap(tf, in_dims=1)(batched)


def _closes_over_transformed(v):
    return fxviews.transform(lambda x: (x * v).sum())(torch.arange(3.0))


def _closes_over_transformed_strict(v):
    return fxviews.transform(lambda x: (x * v).sum(), strict=True)(torch.arange(3.0))


_ENCLOSING = {
    "vmap": lambda f: vmap(f)(torch.stack([torch.ones(3), torch.arange(3.0)])),
    "grad": lambda f: grad(f)(torch.ones(3)),
    "jvp": lambda f: jvp(f, (torch.ones(3),), (torch.arange(3.0),)),
}


@pytest.mark.parametrize("transform", sorted(_ENCLOSING))
def test_tensor_captured_from_enclosing_transform(transform):
    """Traced outside the transforms it would be a constant (zero derivative, no batch dim):
    the signature runs eagerly instead, with eager's values; strict=True refuses it."""
    enclose = _ENCLOSING[transform]
    eager = enclose(lambda v: (torch.arange(3.0) * v).sum())
    assert_tree_close(enclose(_closes_over_transformed), eager)
    with pytest.raises(fxviews.TracingError, match="argument"):
        enclose(_closes_over_transformed_strict)


def reads_outside(x):
    # Starts one element before the slice it is given: memory the slice does not expose. A
    # same-dtype view.dtype hides the slice's base from the engine (through plain views the
    # node is rewritten relative to x: tests/test_kept_nodes.py).
    return x[1:].view(x.dtype).as_strided((3,), (1,), 0) * 1


def test_strict_raises_for_an_unsafe_as_strided():
    with pytest.raises(fxviews.UnsafeAsStridedError):
        fxviews.transform(reads_outside, strict=True)(torch.arange(4.0))
    # Not strict: kept, and it still computes what eager computes on a fresh input.
    x = torch.arange(4.0)
    assert_tree_close(fxviews.transform(reads_outside)(x), reads_outside(x))


def test_errors_raised_by_fn_propagate_unchanged():
    def broken(x):
        raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        fxviews.transform(broken)(torch.ones(1))
