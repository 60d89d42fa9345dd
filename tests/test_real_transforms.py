"""The real programs through ``transform`` under ``vmap`` at every batch dim, and each forward
program under ``grad`` and ``jvp`` as well: ``vmap(transform(grad(f)))`` and
``vmap(transform(jvp(f)))``, the cases whole-model users run.

The programs are :mod:`tests.test_real_programs`' (blocks of real models, per-sample gradients,
``jvp``/``jacfwd``/``hessian`` through normalization layers, ...) and two of Longformer's
(:mod:`tests.sliding_chunks`): its self-attention layer called directly, with the mask a
model makes when given none, and its sliding-chunk attention of ``q``, ``k``, ``v``. Each runs
as written, and each forward one also as

- ``grad``: the gradient, in its first argument, of the outputs' squared norm (a loss whose
  gradient depends on the outputs' values, and no more sensitive to their float32 rounding
  than they are);
- ``jvp``: its outputs and their tangent along a direction given as one more argument, batched
  like the first;

under ``vmap`` of ``transform`` with every batched argument's batch dim physically at each
position ``0 .. ndim`` (clamped to each argument's own dims), against the same function run
eagerly one sample at a time (outputs, and arguments it writes), with no eager fallback.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.func import grad, jvp, vmap

import fxviews
from fxviews.passes.compat.torch_internals import pytree
from tests.reference import TEST_DEVICE, assert_tree_close, on_test_device
from tests.sliding_chunks import SlidingChunkSelfAttention, sliding_chunk_attention
from tests.test_real_programs import PROGRAMS, Program, _eager_per_sample, _samples


def _longformer_layer() -> Program:
    torch.manual_seed(0)
    layer = on_test_device(SlidingChunkSelfAttention(dim=8, heads=2, window=2)).eval()

    def sample(seed: int) -> tuple[Any, ...]:
        return (torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(seed)),)

    return Program("longformer_self_attention", layer, lambda s: on_test_device(sample(s)), (True,))


def _longformer_attention() -> Program:
    def sample(seed: int) -> tuple[Any, ...]:
        generator = torch.Generator().manual_seed(seed)
        return on_test_device(tuple(torch.randn(1, 16, 2, 4, generator=generator) for _ in "qkv"))

    return Program("sliding_chunk_attention", sliding_chunk_attention, sample, (True,) * 3)


ALL = [*PROGRAMS, _longformer_layer(), _longformer_attention()]
#: The programs that compute a model's outputs (the others already take gradients or
#: tangents) and write none of their arguments: the ones ``grad`` and ``jvp`` go around.
#: Not box_decode, which writes its sigmoid in place (eager's autograd refuses its gradient).
FORWARD = {
    "resnet_block",
    "channel_shuffle",
    "swin_window",
    "vit_block",
    "ensemble",
    "gru_inplace_steps",
    "stft_magnitude",
    "sdpa_heads",
    "scatter_add_rows",
    "longformer_self_attention",
    "sliding_chunk_attention",
}


def _squared_norm(outputs: Any) -> torch.Tensor:
    return sum(leaf.square().sum() for leaf in pytree.tree_leaves(outputs))  # type: ignore[return-value]


def _under_grad(program: Program) -> Program:
    def per_sample_grad(first: Any, *rest: Any) -> Any:
        return grad(lambda x: _squared_norm(program.fn(x, *rest)))(first)

    return Program(f"grad_{program.name}", per_sample_grad, program.sample, program.batched)


def _under_jvp(program: Program) -> Program:
    def push(first: Any, *rest_and_direction: Any) -> Any:
        *rest, direction = rest_and_direction
        return jvp(lambda x: program.fn(x, *rest), (first,), (direction,))

    def sample(seed: int) -> tuple[Any, ...]:
        args = program.sample(seed)
        generator = torch.Generator().manual_seed(seed + 7)
        direction = pytree.tree_map(
            lambda t: torch.randn(t.shape, generator=generator).to(TEST_DEVICE), args[0]
        )
        return (*args, direction)

    return Program(f"jvp_{program.name}", push, sample, (*program.batched, program.batched[0]))


CASES = [
    *ALL,
    *(_under_grad(p) for p in ALL if p.name in FORWARD),
    *(_under_jvp(p) for p in ALL if p.name in FORWARD),
]


def _positions(program: Program, sample: tuple[Any, ...]) -> int:
    """How many batch positions the program's arguments have: one past the most dims of a
    batched argument's tensors."""
    dims = [
        leaf.dim()
        for arg, batched in zip(sample, program.batched, strict=True)
        if batched
        for leaf in pytree.tree_leaves(arg)
    ]
    return max(dims) + 1


def _stacked(
    samples: list[tuple[Any, ...]], program: Program, position: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The samples batched with each batched tensor's batch dim physically at ``position``
    (clamped to its dims), and the matching ``in_dims``; unbatched arguments are sample 0's."""
    args, in_dims = [], []
    for index, batched in enumerate(program.batched):
        if not batched:
            args.append(samples[0][index])
            in_dims.append(None)
            continue
        spec = pytree.tree_structure(samples[0][index])
        columns = zip(*(pytree.tree_leaves(s[index]) for s in samples), strict=True)
        stacked, dims = [], []
        for column in columns:
            dim = min(position, column[0].dim())
            stacked.append(torch.stack(column, dim=dim))
            dims.append(dim)
        args.append(pytree.tree_unflatten(stacked, spec))
        in_dims.append(pytree.tree_unflatten(dims, spec))
    return tuple(args), tuple(in_dims)


@pytest.mark.parametrize("program", CASES, ids=lambda p: p.name)
def test_vmap_of_transform_matches_eager_per_sample_at_every_batch_dim(program: Program) -> None:
    samples = _samples(program)
    tf = fxviews.transform(program.fn, strict=True)
    try:
        expected, written = _eager_per_sample(program, samples)
    except NotImplementedError as missing:  # torch 2.15: no forward AD of CPU flash attention
        args, in_dims = _stacked(samples, program, 0)
        with pytest.raises((NotImplementedError, fxviews.TracingError)) as raised:
            vmap(tf, in_dims=in_dims)(*args)
        assert str(missing).split(" because")[0] in str(raised.value), raised.value
        return
    tolerance = _tolerance(expected)
    for position in range(_positions(program, samples[0])):
        args, in_dims = _stacked(samples, program, position)
        actual = vmap(tf, in_dims=in_dims)(*args)
        label = f"{program.name} batch dim {position}"
        assert_tree_close(actual, expected, msg=label, **tolerance)
        if program.mutates_inputs:
            after = _stacked(written, program, position)[0]
            assert_tree_close(args, after, msg=f"{label}: written inputs", **tolerance)
    assert tf.cache_info().eager == 0


def _tolerance(expected: Any) -> dict[str, float]:
    """float32 tolerances, the absolute one scaled to the largest value: a batched kernel
    sums in another order, and an element's error is relative to the sums it comes from (a
    gradient of 1e5 differs by 0.1 between eager vmap and the loop)."""
    largest = max((leaf.abs().max().item() for leaf in pytree.tree_leaves(expected)), default=1)
    return {"rtol": 1e-4, "atol": 1e-5 * max(1.0, largest)}


def test_the_longformer_layer_called_directly_gives_eagers_outputs() -> None:
    # The mask made inside is a result of no input, and so is its band: computed once when
    # the graph is built (Note [Results that depend on no input]).
    program = _longformer_layer()
    (hidden,) = program.sample(0)
    tf = fxviews.transform(program.fn, strict=True)
    assert_tree_close(tf(hidden), program.fn(hidden), atol=1e-5, rtol=1e-4)
    assert tf.cache_info().eager == 0


def test_every_forward_program_is_one() -> None:
    assert FORWARD <= {p.name for p in ALL}
