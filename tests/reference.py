"""Helpers for differential tests: an independent eager reference, real batched layouts.

The point of every differential test in this suite is the same: run a graph under
``torch.func.vmap`` (or on odd memory layouts) and compare it with eager PyTorch applied to one
sample at a time. These helpers keep that honest:

* :func:`stack_batched` builds batched inputs with ``torch.stack(samples, dim=bd)``, so the batch
  dim is *physically* where ``in_dims`` says. (``movedim`` of a batch-first tensor would leave it
  physically first and hide exactly the bug fxviews fixes.)
* :func:`per_sample_reference` runs a function eagerly on each sample in a Python loop and stacks
  the results; it never calls ``vmap``.
* :func:`nested_stack_batched` and :func:`nested_per_sample_reference` do the same for
  ``vmap`` of ``vmap``: two batch dims, each physically placed, and a double loop.
* :func:`assert_tree_close` compares two pytrees leaf by leaf, structure included.
* :func:`transposed_copy` and :func:`strided_copy` give tensors with the same values as their
  input but a different memory layout (permuted strides; step-sliced storage with an offset).
* :func:`in_dims_sweep` lists ``in_dims`` tuples that put the batch dim of every input at every
  position it can take.
* :data:`TEST_DEVICE` is the device the differential tests run on: ``FXVIEWS_TEST_DEVICE``
  (``cpu`` when unset; ``cuda``, ``cuda:1``, ...). :func:`make_samples` and :func:`randn` put
  their values there, :func:`on_test_device` moves tensors and modules there, and
  :func:`rng_states` reads the random streams a run on it advances. A device this machine
  lacks fails the import of this module, so every test built on it fails at collection saying
  so, rather than running on CPU.

Import them as ``from tests.reference import ...`` (``tests`` is a package).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch

from fxviews.passes.compat.torch_internals import pytree

__all__ = [
    "AS_STRIDED_FAMILY",
    "DEVICE_ENV",
    "TEST_DEVICE",
    "InDims",
    "Sample",
    "as_strided_nodes",
    "assert_tree_close",
    "assert_vmap_matches_per_sample",
    "in_dims_sweep",
    "in_dims_id",
    "make_samples",
    "nested_per_sample_reference",
    "nested_stack_batched",
    "noncontiguous_variants",
    "on_test_device",
    "per_sample_reference",
    "randn",
    "rng_states",
    "stable_seed",
    "stack_batched",
    "strided_copy",
    "transposed_copy",
    "without_values",
]

#: One sample: the positional arguments of the function under test, all tensors.
Sample = tuple[torch.Tensor, ...]
#: ``in_dims`` for ``torch.func.vmap``: one entry per positional argument, ``None`` = unbatched.
InDims = tuple[int | None, ...]

#: The environment variable that names the device of the differential tests.
DEVICE_ENV = "FXVIEWS_TEST_DEVICE"


def _test_device() -> torch.device:
    """The device :data:`DEVICE_ENV` names, checked by allocating on it (``cpu`` if unset).

    A name torch does not know, or a device this machine lacks (``cuda`` on a build or machine
    without CUDA, an index past the last GPU), raises here with the variable's value: tests
    asked to run on a device must never quietly run on another one.
    """
    name = os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    try:
        # An unavailable backend or index raises only on use; the tensor's device also gives
        # "cuda" its index, so results compare equal to it.
        device = torch.empty(1, device=torch.device(name)).device
        if device.type == "meta":
            raise ValueError("meta tensors hold no values to compare")
        return device
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError or AssertionError too
        raise RuntimeError(
            f"{DEVICE_ENV}={name!r}: the differential tests cannot run on that device here "
            f"({type(err).__name__}: {str(err).strip().splitlines()[0]}). Unset it to run "
            "them on CPU."
        ) from err


#: The device every sample of the differential tests lives on (see :func:`_test_device`).
TEST_DEVICE: torch.device = _test_device()
if TEST_DEVICE.type == "cuda":
    # cuDNN convolutions default to TF32 for float32, whose rounding differs between a batched
    # and a per-sample call far beyond the tolerances the comparisons use: full float32 here
    # (matmuls already default to it). The legacy flag: setting only the newer per-operator
    # one (cudnn.conv.fp32_precision) makes reading this one raise, on torch 2.13.
    torch.backends.cudnn.allow_tf32 = False

_Movable = TypeVar("_Movable")


def on_test_device(value: _Movable) -> _Movable:
    """``value`` on :data:`TEST_DEVICE`: a module (moved in place), or a pytree of tensors.

    Values are moved, never redrawn, so a test sees the same numbers on every device (on the
    default CPU device nothing is copied).

    Example::

        >>> on_test_device((torch.zeros(2), 3))[0].device == TEST_DEVICE
        True
    """
    if isinstance(value, torch.nn.Module):
        return value.to(TEST_DEVICE)
    return pytree.tree_map(lambda v: v.to(TEST_DEVICE) if isinstance(v, torch.Tensor) else v, value)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.randn(*shape)`` drawn from the global CPU generator (a seeded test sees the same
    values on every device), on :data:`TEST_DEVICE`.

    Example::

        >>> torch.manual_seed(0); a = randn(2); torch.manual_seed(0)
        >>> torch.equal(a.cpu(), torch.randn(2))
        True
    """
    return torch.randn(*shape, dtype=dtype).to(TEST_DEVICE)


def rng_states() -> tuple[torch.Tensor, ...]:
    """The random streams a run on :data:`TEST_DEVICE` may advance: the CPU generator's state,
    and the device's own generator's where it has one (CUDA draws dropout masks from that).

    Example::

        >>> torch.manual_seed(0); before = rng_states(); torch.rand(1, device=TEST_DEVICE)
        >>> any(not torch.equal(a, b) for a, b in zip(before, rng_states()))
        True
    """
    if TEST_DEVICE.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(TEST_DEVICE)
    return (torch.get_rng_state(),)


#: Every aten overload whose semantics bake sizes/strides/offset into the graph.
AS_STRIDED_FAMILY: frozenset[Any] = frozenset(
    op
    for op in (
        torch.ops.aten.as_strided.default,
        torch.ops.aten.as_strided_.default,
        torch.ops.aten.as_strided_copy.default,
        torch.ops.aten.as_strided_scatter.default,
        getattr(torch.ops.aten.as_strided_copy, "out", None),
        getattr(torch.ops.aten.as_strided_scatter, "out", None),
    )
    if op is not None
)


def as_strided_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ``call_function`` nodes of ``gm`` whose target is in :data:`AS_STRIDED_FAMILY`.

    Any other overload of the ``as_strided*`` packets is caught too (by packet name), so a new
    overload cannot slip past a "no as_strided left" assertion.
    """
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        packet = getattr(node.target, "overloadpacket", None)
        packet_name = getattr(packet, "__name__", "")
        if node.target in AS_STRIDED_FAMILY or packet_name.startswith("as_strided"):
            found.append(node)
    return found


def make_samples(
    shapes: Sequence[Sequence[int]],
    batch: int,
    *,
    seed: int,
    dtype: torch.dtype = torch.float64,
) -> list[Sample]:
    """``batch`` independent samples; sample ``b`` is a tuple of fresh tensors of ``shapes``.

    Values come from a private CPU generator seeded with ``seed``, so the same call always
    returns the same tensors (test parametrizations may cache traces built from
    ``samples[0]``), on every device; they live on :data:`TEST_DEVICE`.
    """
    gen = torch.Generator().manual_seed(seed)
    return [
        tuple(
            torch.randn(tuple(shape), generator=gen, dtype=dtype).to(TEST_DEVICE)
            for shape in shapes
        )
        for _ in range(batch)
    ]


def _shared(samples: Sequence[Sample], index: int) -> torch.Tensor:
    """The value of an unbatched argument: sample 0's, which every sample must agree on."""
    return samples[0][index]


def stack_batched(samples: Sequence[Sample], in_dims: InDims) -> tuple[torch.Tensor, ...]:
    """Batch ``samples`` so that argument ``i``'s batch dim is physically at ``in_dims[i]``.

    ``torch.stack(..., dim=bd)`` allocates a fresh contiguous tensor of the batched shape, so the
    batch dim really has the stride that position implies. An ``in_dims`` entry of ``None``
    passes sample 0's argument unbatched (see :func:`per_sample_reference`, which uses the same
    value for every sample).

    Example::

        >>> s = make_samples([(2, 3)], batch=4, seed=0)
        >>> (xb,) = stack_batched(s, (1,))
        >>> xb.shape, xb.stride()
        (torch.Size([2, 4, 3]), (12, 3, 1))
    """
    if not samples:
        raise ValueError("need at least one sample")
    n_args = len(samples[0])
    if len(in_dims) != n_args:
        raise ValueError(f"in_dims has {len(in_dims)} entries for {n_args} arguments")
    batched = []
    for index, bd in enumerate(in_dims):
        if bd is None:
            batched.append(_shared(samples, index))
            continue
        stacked = torch.stack([sample[index] for sample in samples], dim=bd)
        assert stacked.is_contiguous()  # the batch dim's stride is the one position bd implies
        batched.append(stacked)
    return tuple(batched)


def per_sample_reference(
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    in_dims: InDims | None = None,
) -> Any:
    """Eager reference for ``vmap(fn, in_dims)(*stack_batched(samples, in_dims))``.

    Calls ``fn`` once per sample in a Python loop (unbatched arguments get sample 0's value, as
    in :func:`stack_batched`), then stacks every output leaf along dim 0, vmap's default
    ``out_dims``. No vmap, no batching rule is involved.
    """
    if in_dims is None:
        in_dims = (0,) * len(samples[0])
    outputs = []
    for sample in samples:
        args = tuple(
            _shared(samples, i) if bd is None else arg
            for i, (arg, bd) in enumerate(zip(sample, in_dims, strict=True))
        )
        outputs.append(fn(*args))
    leaves_per_sample = []
    spec = None
    for out in outputs:
        leaves, out_spec = pytree.tree_flatten(out)
        if spec is None:
            spec = out_spec
        elif out_spec != spec:
            raise AssertionError(f"output structure differs between samples: {spec} vs {out_spec}")
        leaves_per_sample.append(leaves)
    stacked = [torch.stack(list(column), dim=0) for column in zip(*leaves_per_sample, strict=True)]
    return pytree.tree_unflatten(stacked, spec)


def nested_stack_batched(
    grid: Sequence[Sequence[Sample]], inner: InDims, outer: InDims
) -> tuple[torch.Tensor, ...]:
    """Batch ``grid[j][b]`` twice, for ``vmap(vmap(f, inner), outer)``: ``b`` then ``j``.

    Each row is batched with :func:`stack_batched` at ``inner``, then the rows are stacked so
    argument ``i``'s outer batch dim is physically at ``outer[i]`` of the row-batched tensor.

    Example::

        >>> grid = [make_samples([(2, 3)], batch=4, seed=j) for j in range(5)]
        >>> nested_stack_batched(grid, (1,), (2,))[0].shape
        torch.Size([2, 4, 5, 3])
    """
    rows = [stack_batched(row, inner) for row in grid]
    return tuple(torch.stack([row[i] for row in rows], dim=bd) for i, bd in enumerate(outer))


def nested_per_sample_reference(
    fn: Callable[..., Any], grid: Sequence[Sequence[Sample]], inner: InDims
) -> Any:
    """Eager reference for :func:`nested_stack_batched`: a double loop, output dims ``(j, b)``."""
    rows = [per_sample_reference(fn, row, inner) for row in grid]
    return pytree.tree_map(lambda *leaves: torch.stack(leaves), *rows)


def assert_tree_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    msg: str = "",
    equal_nan: bool = False,
) -> None:
    """Assert two pytrees have the same structure and ``torch.testing.assert_close`` leaves.

    Tuples and lists are treated alike (GraphModules return lists where Python returned tuples);
    shapes and dtypes must match exactly. ``msg`` is prefixed to the failure message;
    ``equal_nan=True`` takes a NaN where the other has one as equal (an op's samples outside
    its domain).
    """
    actual_leaves, actual_spec = pytree.tree_flatten(_tuples_to_lists(actual))
    expected_leaves, expected_spec = pytree.tree_flatten(_tuples_to_lists(expected))
    if actual_spec != expected_spec:
        raise AssertionError(
            f"{msg}: output structure differs\n  actual:   {actual_spec}\n"
            f"  expected: {expected_spec}"
        )
    for position, (a, e) in enumerate(zip(actual_leaves, expected_leaves, strict=True)):
        torch.testing.assert_close(
            a,
            e,
            rtol=rtol,
            atol=atol,
            equal_nan=equal_nan,
            msg=lambda m, position=position: f"{msg}: output leaf {position}: {m}",
        )


def without_values(tree: Any) -> Any:
    """``tree`` with each tensor's values dropped: an empty tensor of its dtype, and its shape.
    What to compare of ops whose values are undefined (``empty`` and its kin: the memory's).

    Example::

        >>> without_values([torch.zeros(2, 3)])
        [(tensor([]), (2, 3))]
    """
    return pytree.tree_map_only(
        torch.Tensor, lambda t: (torch.empty(0, dtype=t.dtype), tuple(t.shape)), tree
    )


def assert_vmap_matches_per_sample(
    batched_fn: Callable[..., Any],
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    batch_dims: Sequence[int] = (0, 1, -1),
    **tolerance: float,
) -> None:
    """``vmap(batched_fn)`` with every argument's batch dim physically at each of
    ``batch_dims`` equals ``fn`` run eagerly one sample at a time."""
    expected = per_sample_reference(fn, samples)
    for bd in batch_dims:
        in_dims = (bd,) * len(samples[0])
        actual = torch.func.vmap(batched_fn, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, expected, msg=f"batch dim {bd}", **tolerance)  # type: ignore[arg-type]


def _tuples_to_lists(tree: Any) -> Any:
    if isinstance(tree, (tuple, list)):
        return [_tuples_to_lists(item) for item in tree]
    if isinstance(tree, dict):
        return {key: _tuples_to_lists(value) for key, value in tree.items()}
    return tree


def transposed_copy(t: torch.Tensor) -> torch.Tensor:
    """Same values as ``t``, dims stored in reverse order: permute, copy, permute back.

    The result is dense (so ``clone`` keeps its strides, as preserve_format does) but not
    contiguous when ``t`` has two or more dims of size > 1. 0-d and 1-d tensors are copied.
    """
    order = list(reversed(range(t.dim())))
    result = t.permute(order).contiguous().permute(order)
    assert torch.equal(result, t)
    return result


def strided_copy(t: torch.Tensor, step: int = 2, offset: int = 1) -> torch.Tensor:
    """Same values as ``t``, living in every ``step``-th element of a bigger buffer at ``offset``.

    Built by slicing a larger tensor with ``[offset::step]`` on every dim, so strides are
    ``step`` times the contiguous ones, the storage offset is non-zero and the memory between the
    elements belongs to the buffer (filled with NaN: reading it shows up in any comparison).
    """
    if t.dim() == 0:
        buffer = torch.full((offset + 1,), float("nan"), dtype=t.dtype, device=t.device)
        result = buffer[offset]
    else:
        big_shape = [offset + step * size for size in t.shape]
        buffer = torch.full(big_shape, float("nan"), dtype=t.dtype, device=t.device)
        index = tuple(slice(offset, offset + step * size, step) for size in t.shape)
        result = buffer[index]
    result.copy_(t)
    assert torch.equal(result, t)
    return result


def noncontiguous_variants(args: Sequence[torch.Tensor]) -> dict[str, tuple[torch.Tensor, ...]]:
    """Named versions of ``args`` with equal values and other layouts, for plain (unbatched) runs.

    ``"contiguous"`` is the baseline; ``"transposed"`` uses :func:`transposed_copy` on every
    argument, ``"strided"`` uses :func:`strided_copy`, and ``"mixed"`` alternates the two.
    """
    makers = (transposed_copy, strided_copy)
    return {
        "contiguous": tuple(a.contiguous() for a in args),
        "transposed": tuple(transposed_copy(a) for a in args),
        "strided": tuple(strided_copy(a) for a in args),
        "mixed": tuple(makers[i % 2](a) for i, a in enumerate(args)),
    }


def in_dims_sweep(ndims: Sequence[int], *, unbatched: Iterable[int] = ()) -> list[InDims]:
    """``in_dims`` tuples placing each argument's batch dim at every position it can take.

    An argument with ``n`` per-sample dims has ``n + 1`` batch positions. The sweep holds the
    "aligned" tuples (every argument at position ``k``, clamped to its range) for every ``k``
    and "staggered" ones (argument ``i`` at ``(k + i) mod (n_i + 1)``), so arguments also differ
    from each other. ``unbatched`` lists argument indices for which one extra tuple with that
    argument ``None`` (the others last) is added. Duplicates are dropped; order is stable.
    """
    top = max(ndims, default=0)
    candidates: list[InDims] = []
    for k in range(top + 1):
        candidates.append(tuple(min(k, n) for n in ndims))
    for k in range(top + 1):
        candidates.append(tuple((k + i) % (n + 1) for i, n in enumerate(ndims)))
    for index in unbatched:
        candidates.append(tuple(None if i == index else n for i, n in enumerate(ndims)))
    seen: dict[InDims, None] = {}
    for candidate in candidates:
        seen.setdefault(candidate, None)
    return list(seen)


def in_dims_id(in_dims: InDims) -> str:
    """A readable pytest id for an ``in_dims`` tuple, e.g. ``bd=2,0,N``."""
    return "bd=" + ",".join("N" if bd is None else str(bd) for bd in in_dims)


def stable_seed(text: str) -> int:
    """A per-case random seed derived from ``text``, the same in every process.

    (``hash`` of a str is randomized per process, so it would make failures irreproducible.)
    """
    return sum((i + 1) * ord(ch) for i, ch in enumerate(text)) % (2**31)
