"""A 0-d integer tensor as an index stays in the graph as the gather eager ``vmap`` runs.

Eager PyTorch reads ``x[a]`` with a 0-d integer tensor as ``x[a.item()]`` unless vmap batches
``a``; ``transform`` traces it as ``aten.index`` (``index_put_`` for a write), so a Q-network's
``q(s)[a]`` or a KV cache written at a tensor position is one graph for every value (Note [A
0-d integer tensor as an index]). Each program runs under ``vmap`` with its tensors' batch dim
physically at 0, 1 and last (the indices' at 0: one number per sample), against eager
PyTorch one sample at a time; where the gather's copy would differ from eager's view (a write
through it), the function runs eagerly with a message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fxviews
from tests.reference import assert_tree_close, per_sample_reference, randn, stack_batched

torch.manual_seed(0)
Q_NETWORK = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 5))


def q_value_of_action(s, a):
    return Q_NETWORK(s)[a]


def td_error(s, a, r, s_next):
    return (r + 0.9 * Q_NETWORK(s_next).max() - Q_NETWORK(s)[a]) ** 2


def kv_cache_write(cache, k, pos):
    cache = cache.clone()
    cache[:, pos] = k
    return cache[:, : pos.numel() + 2].sum(-1), cache


def mixed_items(x, a):
    return x[a, :, 1], x[:, a], x[..., a, None, 1:3], x[a, 1:, a], x[a, a]


def scalar_write(x, a):
    x = x.clone()
    x[a] = 0.5
    x[-1, a] = x[0, a] * 2
    return x


#: Each program and its arguments: a tuple is a sample's shape (``()``: a 0-d float), an int
#: ``n`` a 0-d integer index below ``n`` (one sample's negative).
PROGRAMS: dict[str, tuple[Callable[..., Any], list[Any]]] = {
    "q_value_of_action": (q_value_of_action, [(4,), 5]),
    "td_error": (td_error, [(4,), 5, (), (4,)]),
    "kv_cache_write": (kv_cache_write, [(2, 6), (2,), 6]),
    "mixed_items": (mixed_items, [(4, 4, 4), 4]),
    "scalar_write": (scalar_write, [(3, 4), 3]),
}


def _samples(name: str, count: int = 3) -> list[tuple[torch.Tensor, ...]]:
    def argument(spec: Any, b: int) -> torch.Tensor:
        if isinstance(spec, int):
            return torch.tensor([1, -1, 0, 2][b % 4] % spec - spec * (b == 1))
        return randn(*spec) if spec else randn(1)[0]

    return [tuple(argument(spec, b) for spec in PROGRAMS[name][1]) for b in range(count)]


def _in_dims(sample: tuple[torch.Tensor, ...], bd: int) -> tuple[int, ...]:
    return tuple(0 if arg.dim() == 0 else bd for arg in sample)


@pytest.mark.parametrize("name", PROGRAMS)
def test_vmap_of_the_gather_matches_eager_per_sample(name: str) -> None:
    fn = PROGRAMS[name][0]
    samples = _samples(name)
    expected = per_sample_reference(fn, samples)
    tf = fxviews.transform(fn, strict=True)
    for bd in (0, 1, -1):
        in_dims = _in_dims(samples[0], bd)
        actual = torch.func.vmap(tf, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, expected, msg=f"batch dim {bd}")
    assert tf.cache_info().eager == 0
    gm = fxviews.trace(fn, *samples[0])
    targets = {node.target for node in gm.graph.nodes}
    assert targets & {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default}
    assert torch.ops.aten._local_scalar_dense.default not in targets


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_direct_call_matches_eager(name: str) -> None:
    fn = PROGRAMS[name][0]
    tf = fxviews.transform(fn, strict=True)
    for sample in _samples(name, 4):
        assert_tree_close(tf(*sample), fn(*sample))


def test_gradients_and_tangents_through_the_gather_match_eager() -> None:
    samples = _samples("q_value_of_action")
    tf = fxviews.transform(q_value_of_action, strict=True)
    s, a = stack_batched(samples, (1, 0))
    grads = torch.func.vmap(torch.func.grad(tf), in_dims=(1, 0))(s, a)
    expected = per_sample_reference(torch.func.grad(q_value_of_action), samples)
    assert_tree_close(grads, expected)

    def tangent(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda s, a, t: torch.func.jvp(lambda s: fn(s, a), (s,), (t,))

    jvp_samples = [(s, a, randn(4)) for s, a in samples]
    expected = per_sample_reference(tangent(q_value_of_action), jvp_samples)
    actual = torch.func.vmap(tangent(tf), in_dims=(1, 0, 1))(*stack_batched(jvp_samples, (1, 0, 1)))
    assert_tree_close(actual, expected)


def test_a_closed_over_index_is_read_on_every_call() -> None:
    position = torch.tensor(0)

    def read_at_position(x):
        return x[position] * 2

    tf = fxviews.transform(read_at_position, strict=True)
    x = randn(5)
    for step in range(3):
        position.fill_(step)
        assert torch.equal(tf(x), read_at_position(x))
    assert tf.cache_info().misses == 1


def test_an_index_out_of_range_raises() -> None:
    tf = fxviews.transform(q_value_of_action, strict=True)
    tf(randn(4), torch.tensor(1))
    with pytest.raises((IndexError, RuntimeError), match="out of bounds|out of range"):
        tf(randn(4), torch.tensor(5))


def bump_in_place(x, a):
    x = x.clone()
    x[a] += 1
    return x


def read_then_scale_the_base(x, a):
    x = x.clone()
    y = x[a]
    x.mul_(2)
    return y + 1


def bump_out_of_place(x, a):
    x = x.clone()
    x[a] = x[a] + 1
    return x


def scale_after_the_last_read(x, a):
    x = x.clone()
    y = x[a] + 1
    x.mul_(2)
    return y, x


@pytest.mark.parametrize(
    "fn, graph",
    [
        (bump_in_place, False),  # the result is written: eager writes x through its view
        (read_then_scale_the_base, False),  # x written while the result is read after: seen
        (bump_out_of_place, True),
        (scale_after_the_last_read, True),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_gather_whose_copy_eager_would_see_through_runs_eagerly(fn, graph, caplog) -> None:
    tf = fxviews.transform(fn)
    samples = [(randn(4), torch.tensor(i)) for i in (1, 3, -2)]
    with caplog.at_level(logging.WARNING, logger="fxviews"):
        for sample in samples:
            assert_tree_close(tf(*sample), fn(*sample))
    assert tf.cache_info().eager == (0 if graph else 1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    assert bool(warnings) != graph
    if warnings:
        assert "indexes with a 0-d integer tensor" in warnings[0]
        assert "`x[i] = x[i] + v`" in warnings[0]
        with pytest.raises(fxviews.TracingError, match="indexes with a 0-d integer tensor"):
            fxviews.trace(fn, *samples[0])  # in fake mode too


def read_then_scale_another_argument(x, y, a):
    row = x[a]
    y.mul_(2)  # `x`'s memory too, where the caller passes it again as `y`
    return row + 1


@pytest.mark.parametrize("second", [lambda t: t, lambda t: t[:]], ids=["same_tensor", "slice"])
def test_a_gather_another_argument_may_write_through_runs_eagerly(second) -> None:
    # Traced as separate tensors, two arguments may still be one memory on a call: eager's
    # view shows the write through `y`, the gather's copy would not (Note [Alias analysis]).
    tf = fxviews.transform(read_then_scale_another_argument)
    expected_x, actual_x = randn(4), randn(4)
    actual_x.copy_(expected_x)
    expected = read_then_scale_another_argument(expected_x, second(expected_x), torch.tensor(1))
    actual = tf(actual_x, second(actual_x), torch.tensor(1))
    assert_tree_close((actual, actual_x), (expected, expected_x))
    assert tf.cache_info().eager == 1
