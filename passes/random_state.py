"""Forking the random generators a run on some tensors' devices may advance.

Note [Which generators to fork]
-------------------------------
fxviews runs kernels for its own purposes (a real-mode trace, a recording, layout truth's eager
runs) and must leave every random stream as it found it. ``torch.random.fork_rng`` saves and
restores the CPU generator and the CUDA generators it is given. The CUDA ones are those of the
devices holding tensors among the values at hand (a kernel runs on its arguments' device), and
only the ones this process can reach: a graph traced on fake CUDA tensors can be rewritten on a
machine without CUDA (an export for a GPU, made on a CPU host), where no kernel can run on them
and so advance a generator, and where asking CUDA for its state fails.

Example::

    >>> with forked_rng([torch.ones(2)]):
    ...     _ = torch.rand(1)   # the CPU stream is as before after the block
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .torch_internals import pytree


def reachable_cuda_devices(values: Any) -> list[int]:
    """The indices of the CUDA devices holding tensors among the pytree ``values`` that this
    process can use (none without CUDA), sorted.

    Example::

        >>> reachable_cuda_devices([torch.ones(2)])
        []
    """
    wanted = {
        leaf.device.index
        for leaf in pytree.tree_leaves(values)
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"
    }
    if not wanted or not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    found = {torch.cuda.current_device() if index is None else index for index in wanted}
    return sorted(index for index in found if index < count)


@contextlib.contextmanager
def forked_rng(values: Any) -> Iterator[None]:
    """Restore the CPU generator and those of :func:`reachable_cuda_devices` afterwards."""
    with torch.random.fork_rng(devices=reachable_cuda_devices(values)):
        yield
