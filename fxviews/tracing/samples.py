"""The layout a call's tensors bring: part of ``transform``'s key, the samples its trace runs on,
and the storage offsets a graph is held to.

Note [The layout of a call]
---------------------------
A graph traced on one layout bakes in more than the ``as_strided`` calls the engine rewrites
and the reshape-like calls that decide at run time (Note [Layout decisions at run time]):
everything the trace read of its inputs' layouts holds for that layout only. A kernel's output
follows its input's layout (``roll`` keeps channels_last, ``copysign`` a transposed input's
order), and a user's own ``as_strided`` then reads that output's memory raw; Python may read
``stride()`` or ``is_contiguous()``; autograd's formulas inside ``fn`` decide their own views
and copies. Eager reads each call's layout afresh. So ``transform`` keys and traces each tensor
argument by what its layout means for the call:

1. **Called directly** (no ``vmap`` batches it; ``grad`` or ``jvp`` may wrap it): the layout is
   a fact of the call. The key holds the tensor's strides, and the trace runs on a fresh tensor
   of exactly its geometry (sizes, strides and storage offset, over a storage of its own that
   holds the same memory from the offset to the last element), so the graph computes what eager
   computes on that argument, a user's ``as_strided`` over it included.
2. **Batched by vmap**, at any level: each sample is traced as a fresh contiguous tensor at
   offset 0, as the README documents, so an ``as_strided`` in ``fn`` reads each sample as if it
   were contiguous (the physical layout is vmap's there, not the user's). Its key holds those
   contiguous strides, so a direct call on a contiguous tensor shares its graph; the user's
   reshape-like calls still decide view or copy per sample when the graph runs.
3. **Storage offsets** are not in the key: a loop over slices of one buffer would retrace at
   every step. A graph depends on an argument's offset only where it reads the argument's memory
   by absolute position: through an ``as_strided``-family node over the argument or a view of
   it, or where Python read a ``storage_offset()`` of it. Such a graph is held to the offsets it
   was traced with (:func:`offset_bound_inputs`): a call at another offset traces again.
4. **The hot call** (Note [The cached call]) checks the strides of directly called tensors in
   its C++ check; a batched tensor's per-sample strides change with the batch size and are left
   out, as from its key. Dynamo's check tells a BatchedTensor from a plain tensor, but not a
   ``grad`` or ``jvp`` wrapper of one from a wrapper of the other: where a call passes such
   wrappers, :func:`hot_check` asks each whether it is batched too, and it checks the offsets a
   graph is held to of the tensors called directly (a batched one's is always 0).

What a trace on exact geometry costs: a recording holds the sample's storage from offset 0 to
its last element (a slice deep into a large buffer may exceed the recording limit and trace in
fake mode, which holds no memory), and each distinct strides of a directly called argument is
one trace.
"""

from __future__ import annotations

from typing import Any

import torch

from fxviews.passes.compat.torch_internals import (
    FakeTensor,
    FakeTensorMode,
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
)

__all__ = [
    "fake_sample",
    "innermost",
    "is_batched",
    "real_sample",
    "sample_bytes",
    "traced_offset",
    "untraced_kind",
]


def is_batched(tensor: Any) -> bool:
    """Whether ``tensor`` is batched by a ``vmap`` at any level of the transforms around it.

    Example::

        >>> torch.func.vmap(lambda x: torch.tensor(is_batched(x)))(torch.ones(2, 3))
        tensor([True, True])
    """
    while isinstance(tensor, torch.Tensor) and is_functorch_wrapped_tensor(tensor):
        if is_batchedtensor(tensor):
            return True
        tensor = get_unwrapped(tensor)
    return False


def untraced_kind(tensor: torch.Tensor) -> str | None:
    """What ``tensor`` is where it is of a kind no trace runs on, or None: a trace runs on
    fresh strided tensors of its logical shape (see the Note), which a quantized, nested,
    sparse or oneDNN tensor is not, and whose graph would decide views and layouts for them as
    for a dense tensor. A call passing one runs eagerly, saying so.

    Example::

        >>> untraced_kind(torch.ones(2, 2).to_sparse()), untraced_kind(torch.ones(2))
        ('a sparse tensor (torch.sparse_coo)', None)
    """
    inner = innermost(tensor)
    if inner.is_nested:
        return f"a nested tensor ({inner.layout})"
    if inner.is_quantized:
        return "a quantized tensor"
    if inner.layout != torch.strided:
        kind = "oneDNN" if inner.is_mkldnn else "sparse" if inner.is_sparse or _csr(inner) else ""
        return f"a {kind} tensor ({inner.layout})".replace("a  ", "a ")
    return None


def _csr(tensor: torch.Tensor) -> bool:
    compressed = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
    return tensor.layout in compressed


def innermost(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor inside the wrappers of enclosing transforms (``tensor`` if none)."""
    while is_functorch_wrapped_tensor(tensor):
        tensor = get_unwrapped(tensor)
    return tensor


def _traced_exactly(value: torch.Tensor) -> bool:
    """Whether ``value`` is traced on its own geometry: called directly, strided, and a plain or
    fake tensor (a subclass such as DTensor is traced on a plain tensor of its logical shape)."""
    if is_batched(value):
        return False
    inner = innermost(value)
    plain = type(inner) in (torch.Tensor, torch.nn.Parameter) or isinstance(inner, FakeTensor)
    return inner.layout == torch.strided and plain


def _extent(tensor: torch.Tensor) -> int:
    """How many elements from its storage offset ``tensor``'s geometry spans (0 if empty)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))


def sample_bytes(value: torch.Tensor) -> int:
    """The bytes a recording's sample of ``value`` holds (see :func:`real_sample`)."""
    if not _traced_exactly(value):
        return value.numel() * value.element_size()
    inner = innermost(value)
    return int(inner.storage_offset() + _extent(inner)) * inner.element_size()


def real_sample(value: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """A fresh tensor a recording runs on for argument ``value``, holding ``sample``'s values (one
    sample of it, unwrapped): contiguous where vmap batches ``value``, else of ``sample``'s exact
    geometry over a storage of its own holding the same memory from the offset on.

    Example::

        >>> x = torch.arange(12.0).view(3, 4)[:, 1:3]
        >>> copy = real_sample(x, x)
        >>> copy.stride(), copy.storage_offset(), torch.equal(copy, x)
        ((4, 1), 1, True)
    """
    with torch.no_grad():
        if not _traced_exactly(value):
            return sample.detach().clone(memory_format=torch.contiguous_format)
        offset, extent = sample.storage_offset(), _extent(sample)
        memory = torch.empty(offset + extent, dtype=sample.dtype, device=sample.device)
        if extent:  # the memory the geometry spans, gaps between its elements included
            memory[offset:].copy_(sample.detach().as_strided((extent,), (1,), offset))
        return _over(memory, sample)


def fake_sample(value: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
    """A fake tensor of ``mode`` a fake-mode trace runs on for argument ``value``: contiguous
    where vmap batches it, else of its exact geometry over a storage of its storage's size."""
    if not _traced_exactly(value):
        with mode:
            return torch.empty(value.shape, dtype=value.dtype, device=value.device)
    inner = innermost(value)
    elements = inner.untyped_storage().nbytes() // inner.element_size()
    with mode:
        memory = torch.empty(elements, dtype=value.dtype, device=value.device)
        return _over(memory, inner)


def _over(memory: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s geometry over ``memory``'s storage, not a view of ``memory``: the
    traced function may write it in place, which autograd refuses (or make_fx records as an
    ``as_strided`` of the base) for a view of a tensor the trace did not make."""
    fresh = torch.empty(0, dtype=like.dtype, device=memory.device)
    return fresh.set_(memory.untyped_storage(), like.storage_offset(), like.shape, like.stride())


def traced_offset(tensor: torch.Tensor) -> int:
    # A batched sample is traced at offset 0, whatever its physical tensor's offset.
    return int(innermost(tensor).storage_offset()) if _traced_exactly(tensor) else 0
