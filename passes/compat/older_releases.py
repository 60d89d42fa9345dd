"""Internals PyTorch fixed or changed form in 2.13, made to behave on 2.11 and 2.12 as there.

Part of :mod:`.torch_internals`, which re-exports every name here: callers reach these private
PyTorch names through it, like all others. Each function does what the newest form does, by
PyTorch's own means from 2.13 and by a stand-in written here on the releases before, so
fxviews behaves the same on every release it supports (the README's range); the function's
docstring names the difference and what the stand-in does about it.

Example::

    >>> TORCH_RELEASE >= (2, 11)
    True
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import torch

#: The release as (major, minor): where an internal changed form, the form this one has.
TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


@contextlib.contextmanager
def traceable_jacobian_basis() -> Iterator[None]:
    """Within, ``jacrev`` and ``jacfwd`` build their standard basis with Python offsets.

    Both compute a Jacobian as vjps (jvps) of the rows of an identity matrix split by tensor,
    made by ``torch._functorch.eager_transforms._chunked_standard_basis_for_``. Before 2.13
    it places each tensor's block with ``int()`` of a tensor built from the tensors' numels:
    a fake-mode trace has no value for that ``int`` (an unbacked symbol: "Could not extract
    specialized integer from data-dependent expression u0") wherever the basis spans two
    tensors or more (a function with two outputs under jacrev). 2.13 computes the offsets in
    Python. On 2.11 and 2.12 this puts :func:`_standard_basis_chunks`, the same basis with
    Python offsets, in its place while the caller traces (the module's global, which jacrev
    and jacfwd look up on each call); on later releases it changes nothing.

    Example::

        >>> with traceable_jacobian_basis():
        ...     jacobian = make_fx(torch.func.jacrev(lambda x: (x, 2 * x)), tracing_mode="fake")
    """
    if TORCH_RELEASE >= (2, 13):
        yield
        return
    from torch._functorch import eager_transforms

    replaced = eager_transforms._chunked_standard_basis_for_
    eager_transforms._chunked_standard_basis_for_ = _standard_basis_chunks
    try:
        yield
    finally:
        eager_transforms._chunked_standard_basis_for_ = replaced


def _standard_basis_chunks(
    tensors: Sequence[torch.Tensor], tensor_numels: Sequence[int], chunk_size: int | None = None
) -> Generator[tuple[torch.Tensor, ...], None, None]:
    """The rows of the identity matrix over all elements of ``tensors``, ``chunk_size`` rows at
    a time (all at once for None), each chunk split by tensor: ``tensor.new_zeros(rows,
    numel)`` with ones where row ``r`` meets the tensor's column ``r - start`` (``start``: how
    many elements the tensors before it hold), viewed as ``(rows, *tensor.shape)``.

    Example::

        >>> one, two = next(_standard_basis_chunks([torch.zeros(1), torch.zeros(2)], [1, 2]))
        >>> one.tolist(), two.tolist()
        ([[1.0], [0.0], [0.0]], [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    """
    total = sum(tensor_numels)
    rows_per_chunk = chunk_size if chunk_size and chunk_size < total else total
    starts = [sum(tensor_numels[:i]) for i in range(len(tensor_numels))]
    for first_row in range(0, total, rows_per_chunk) if total else [0]:
        rows = min(rows_per_chunk, total - first_row)
        chunk = []
        for tensor, numel, start in zip(tensors, tensor_numels, starts, strict=True):
            block = tensor.new_zeros(rows, numel)
            block.diagonal(first_row - start).fill_(1)
            chunk.append(block.view(rows, *tensor.shape))
        yield tuple(chunk)


def close_abandoned_checkpoints(err: BaseException) -> None:
    """Close the ``torch.utils.checkpoint`` calls that ``err`` left open, innermost first.

    Non-reentrant ``checkpoint`` runs the checkpointed function between two steps of a
    generator that pushes saved-tensor hooks on its first step and pops them on its second.
    From 2.13 it throws an exception the function raises into that generator, which pops them.
    Before (2.11, 2.12) it lets the exception pass: the hooks stay pushed until the garbage
    collector closes the generator, which then pops whatever hooks are innermost at that
    moment, and meanwhile every op saves through the abandoned checkpoint (a later eager
    checkpoint's backward then raises "Recomputed values ... have different metadata", a
    ``torch.func.grad`` "don't yet support saved tensor hooks"). On those releases this closes
    each generator left suspended in a frame of ``checkpoint`` on ``err``'s tracebacks (its
    causes' and contexts' included), as 2.13 does on the spot; on later ones it does nothing.

    Example::

        >>> try:
        ...     checkpoint(fails, x, use_reentrant=False)
        ... except ValueError as err:
        ...     close_abandoned_checkpoints(err)
    """
    if TORCH_RELEASE >= (2, 13):
        return
    import inspect

    from torch.utils import checkpoint as checkpointing

    code = inspect.unwrap(checkpointing.checkpoint).__code__
    generators = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        pending += [error.__cause__, error.__context__]
        traceback = error.__traceback__
        while traceback is not None:
            if traceback.tb_frame.f_code is code:
                generators.append(traceback.tb_frame.f_locals.get("gen"))
            traceback = traceback.tb_next
    for generator in reversed(generators):  # innermost first: each pops its own hooks
        if isinstance(generator, types.GeneratorType) and generator.gi_frame is not None:
            generator.close()


def pop_functorch_layers_to(depth: int) -> None:
    """Pop functorch's transform stack down to ``depth`` layers, each undone by its
    transform's own decrement, as ``torch.func`` leaves it (what a failed trace left pushed).

    PyTorch's ``pop_dynamic_layer_stack_and_undo_to_depth`` (2.0) does this. Before 2.13
    (2.11, 2.12) it pops each layer and then calls the decrement, which pops again: the last
    layer raises "!dynamicLayerStack.empty() INTERNAL ASSERT FAILED", deeper stacks lose a
    layer more per step. There the same loop runs here, reading the top layer's kind
    (``peek_interpreter_stack``) without popping it.

    Example::

        >>> pop_functorch_layers_to(0)   # after a vmap trace that raised mid-way
        >>> torch._C._functorch.get_dynamic_layer_stack_depth()
        0
    """
    from torch._C import _functorch as functorch

    if TORCH_RELEASE >= (2, 13):
        functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)
        return
    undo = {
        functorch.TransformType.Vmap: functorch._vmap_decrement_nesting,
        functorch.TransformType.Grad: functorch._grad_decrement_nesting,
        functorch.TransformType.Jvp: functorch._jvp_decrement_nesting,
        functorch.TransformType.Functionalize: functorch._func_decrement_nesting,
    }
    while functorch.get_dynamic_layer_stack_depth() > depth:
        top = functorch.peek_interpreter_stack()
        undo.get(top.key(), functorch.pop_dynamic_layer_stack)()


def inductor_decompositions() -> dict[Any, Callable[..., Any]] | None:
    """The decomposition table for Inductor's lowering, with roll laid out as eager's.

    Eager's ``roll`` keeps a channels_last input's channels_last. Inductor decomposes it into
    ``index_select``, whose entry in Inductor's table (``select_decomp_table``, 2.0) before
    2.13 (2.11, 2.12) makes its result contiguous, so an ``as_strided`` over a roll reads other
    memory under Inductor than in eager, plain Inductor included (pytorch #174963's program).
    2.13's entry lays the result out in its input's suggested memory format
    (``suggest_memory_format``, 2.0). On 2.11 and 2.12 this returns Inductor's table with that
    entry's result laid out so too; from 2.13 None: Inductor's own table, unchanged.

    Example::

        >>> compile_fx(gm, example_inputs, decompositions=inductor_decompositions())
    """
    if TORCH_RELEASE >= (2, 13):
        return None
    from torch._inductor.decomposition import select_decomp_table
    from torch._prims_common import suggest_memory_format

    table = dict(select_decomp_table())
    contiguous_index_select = table[torch.ops.aten.index_select.default]

    def index_select(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        result = contiguous_index_select(x, dim, index)
        return result.contiguous(memory_format=suggest_memory_format(x))

    table[torch.ops.aten.index_select.default] = index_select
    return table


def last_node(graph: torch.fx.Graph) -> torch.fx.Node:
    """The last node of ``graph``: ``reversed(graph.nodes)`` is an iterator from 2.13 on, a
    reversed list of nodes before (where ``next`` of it fails), so it is iterated first."""
    return next(iter(reversed(graph.nodes)))
