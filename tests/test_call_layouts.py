"""The layout a call brings (Note [The layout of a call]): a direct call is traced on its
arguments' own layout and gives eager's numbers, a user's ``as_strided`` included; under
``vmap`` each sample is read as a contiguous tensor, as the README documents; graphs that read
an argument's memory by position are held to its storage offset. Every result is compared with
eager PyTorch on identically laid-out tensors, on the first call and on cached ones.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, vmap

import fxviews
from tests.reference import per_sample_reference, randn, stack_batched


def _roll_window(x: torch.Tensor) -> torch.Tensor:
    # pytorch/pytorch#174963: eager roll keeps channels_last, which the as_strided reads raw.
    return torch.roll(x, shifts=-1, dims=0).as_strided((5, 10), (4, 1), 0)


def _copysign_window(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # copysign's result follows a's transposed layout: the as_strided reads it raw.
    return torch.copysign(a, b - 1.5).as_strided((5, 6), (6, 1))


def _channels_last_input() -> torch.Tensor:
    return torch.arange(100.0).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)


def test_a_user_as_strided_over_a_channels_last_roll_gives_eager_numbers() -> None:
    x = _channels_last_input()
    tf = fxviews.transform(_roll_window)
    for _ in range(2):  # traced, then cached
        torch.testing.assert_close(tf(x), _roll_window(x), rtol=0, atol=0)
    contiguous = x.contiguous()  # another layout: another graph, eager's numbers there too
    torch.testing.assert_close(tf(contiguous), _roll_window(contiguous), rtol=0, atol=0)
    assert not torch.equal(_roll_window(x), _roll_window(contiguous))
    assert tf.cache_info().misses == 2


def test_a_user_as_strided_over_copysign_of_a_transposed_argument_gives_eager_numbers() -> None:
    a, b = randn(6, 5).mT, randn(5, 6) + 1
    tf = fxviews.transform(_copysign_window)
    for _ in range(2):
        torch.testing.assert_close(tf(a, b), _copysign_window(a, b), rtol=0, atol=0)


def _windows(x: torch.Tensor) -> torch.Tensor:
    return x.as_strided((x.numel() - 2, 3), (1, 1))


@pytest.mark.parametrize("bd", [0, 1])
def test_under_vmap_each_sample_is_read_as_contiguous_and_directly_as_it_lies(bd: int) -> None:
    """One transformed function: the README's per-sample reading under vmap, eager's reading
    of a direct call on a transposed argument (two graphs)."""
    tf = fxviews.transform(_windows)
    samples = [(randn(8),) for _ in range(3)]
    expected = per_sample_reference(_windows, samples, (bd,))
    torch.testing.assert_close(vmap(tf, in_dims=bd)(*stack_batched(samples, (bd,))), expected)
    x = randn(16)[::2]  # called directly: eager reads every element of the storage
    torch.testing.assert_close(tf(x), _windows(x), rtol=0, atol=0)
    assert not torch.equal(_windows(x), _windows(x.contiguous()))


def _absolute_window(x: torch.Tensor) -> torch.Tensor:
    return x.as_strided((3,), (1,), 5) * 1  # storage elements 5..7, wherever x starts


def _relative_window(x: torch.Tensor) -> torch.Tensor:
    return x.as_strided((3,), (1,), x.storage_offset() + 1) * 1  # x[1:4], read from Python


@pytest.mark.parametrize("fn", [_absolute_window, _relative_window], ids=lambda f: f.__name__)
def test_a_graph_reading_an_argument_by_position_is_held_to_its_offset(fn) -> None:
    buffer = randn(20)
    tf = fxviews.transform(fn)
    for start in [0, 2, 4, 2, 0]:
        x = buffer[start : start + 10]
        torch.testing.assert_close(tf(x), fn(x), rtol=0, atol=0)
    assert tf.cache_info().misses == 3  # one graph per offset: 0, 2, 4


def test_a_graph_that_reads_no_position_is_not_held_to_offsets() -> None:
    buffer = randn(20)
    tf = fxviews.transform(lambda x: x.reshape(2, 5).sin())
    for start in range(5):
        x = buffer[start : start + 10]
        torch.testing.assert_close(tf(x), x.reshape(2, 5).sin())
    assert tf.cache_info()[:2] == (4, 1)


def test_batched_calls_of_an_offset_bound_graph_share_it_wherever_their_memory_starts() -> None:
    """Each batched sample is read as a contiguous tensor at offset 0, so the offset its batch
    starts at in memory picks no graph (and costs the hot call no check); a direct call at an
    offset of its own still gets its own graph."""
    tf = fxviews.transform(_absolute_window)
    buffer = randn(3, 20)
    for start in [0, 3, 0, 5]:
        x = buffer[:, start : start + 10]  # batch dim 0, memory from offset `start`
        samples = [(sample.clone(),) for sample in x]  # each contiguous, at offset 0
        expected = per_sample_reference(_absolute_window, samples, (0,))
        torch.testing.assert_close(vmap(tf)(x), expected, rtol=0, atol=0)
    assert tf.cache_info()[:2] == (3, 1)
    direct = buffer[0, 2:12]
    torch.testing.assert_close(tf(direct), _absolute_window(direct), rtol=0, atol=0)
    torch.testing.assert_close(vmap(tf)(buffer[:, 4:14]), vmap(tf)(buffer[:, 4:14].clone()))
    assert tf.cache_info()[1] == 2


def _column_reads(x: torch.Tensor) -> torch.Tensor:
    return (x.as_strided((2, 2), (1, 3)) ** 2).sum()


def test_the_hot_call_tells_a_grad_wrapper_of_a_batched_tensor_from_a_plain_one() -> None:
    """``grad`` wraps a batched and a plain tensor alike for Dynamo's check; the two calls read
    the as_strided differently (per sample as contiguous; the argument as it lies)."""
    tf = fxviews.transform(_column_reads)
    samples = [(randn(4, 3),) for _ in range(3)]
    batch = stack_batched(samples, (1,))
    expected = per_sample_reference(grad(_column_reads), samples, (1,))
    # A direct argument with the per-sample strides the batch has: (3 * batch, 1).
    direct = randn(4, 3 * len(samples))[:, :3]
    assert direct.stride() == batch[0].select(1, 0).stride()
    for _ in range(2):
        torch.testing.assert_close(vmap(grad(tf), in_dims=1)(*batch), expected)
        torch.testing.assert_close(grad(tf)(direct), grad(_column_reads)(direct), rtol=0, atol=0)


def test_a_direct_contiguous_call_shares_the_graph_of_batched_calls() -> None:
    tf = fxviews.transform(lambda x: x.flatten().cumsum(0))
    x = randn(4, 3)
    tf(x)
    vmap(tf, in_dims=1)(randn(4, 5, 3))
    assert tf.cache_info()[:2] == (1, 1)


def _doubled_window(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)  # in place on the argument: the trace's sample must be a non-leaf
    return x.as_strided((2, 2), (1, 2), 1) * 3


@pytest.mark.parametrize(
    "lay_out",
    [lambda b: b[:, 1:4], lambda b: b[1:], lambda b: b.t()],
    ids=["sliced", "offset", "transposed"],
)
def test_an_argument_requiring_grad_is_traced_in_its_own_layout(lay_out) -> None:
    """A direct call's argument that requires grad is traced on a sample requiring grad too
    (docs/autograd.md) and still in the argument's exact layout, storage offset included: its
    as_strided reads eager's elements, and the gradient reaches eager's."""
    base = randn(4, 6)
    tf = fxviews.transform(_doubled_window)
    for _ in range(2):  # traced, then cached
        leaves = [base.clone().requires_grad_() for _ in range(2)]
        got, want = tf(lay_out(leaves[0] * 1)), _doubled_window(lay_out(leaves[1] * 1))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        got_grad, want_grad = (
            torch.autograd.grad(y.sum(), leaf)[0]
            for y, leaf in zip((got, want), leaves, strict=True)
        )
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
