"""Restore PyTorch's process and thread state after tracing, whether the trace worked or not.

Tracing ``torch.func`` code runs PyTorch's transform machinery inside make_fx. When an op fails
deep inside it (a fake-mode limitation, a data-dependent branch), some C++ guards are not
unwound: the thread-local dispatch key sets keep functorch's keys excluded, and every later
*eager* ``vmap`` or ``jvp`` in the process fails ("Cannot access data pointer of Tensor that
doesn't have storage", forward-AD internal asserts). :func:`preserved_torch_state` snapshots
every piece of state a trace can touch and puts it back on exit.

Example::

    >>> with preserved_torch_state():
    ...     make_fx(fn, tracing_mode="fake")(*args)   # may raise; the state is restored anyway
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.passes.compat import torch_internals as internals


@dataclass(frozen=True)
class TorchStateSnapshot:
    """The global and thread-local settings a trace may leave changed.

    Two snapshots compare equal when PyTorch is in the same state (the test suite checks that
    every test leaves it as it found it).
    """

    grad_enabled: bool
    forward_grad_enabled: bool
    view_replay: bool
    inplace_requires_grad_allowed: bool
    dispatch_modes: int
    function_modes: int
    functorch_depth: int
    python_dual_level: int
    # Compared, not restored: the innermost saved-tensor hooks, (pack, unpack) or None. A trace
    # leaves them changed only through a checkpoint left open, which it closes on the way out.
    saved_tensors_hooks: Any
    # Compared, not restored field by field: the dispatch key guard restores them.
    included_keys: str
    excluded_keys: str

    @classmethod
    def take(cls) -> TorchStateSnapshot:
        return cls(
            grad_enabled=torch.is_grad_enabled(),
            forward_grad_enabled=internals.is_fwd_grad_enabled(),
            view_replay=internals.is_view_replay_enabled(),
            inplace_requires_grad_allowed=internals.get_inplace_requires_grad_allowed(),
            dispatch_modes=internals.dispatch_mode_depth(),
            function_modes=internals.function_mode_depth(),
            functorch_depth=internals.functorch_layer_depth(),
            python_dual_level=internals.python_dual_level(),
            saved_tensors_hooks=internals.top_saved_tensors_hooks(),
            included_keys=str(internals.dispatch_tls_include_set()),
            excluded_keys=str(internals.dispatch_tls_exclude_set()),
        )

    def restore(self) -> None:
        torch.set_grad_enabled(self.grad_enabled)
        internals.set_fwd_grad_enabled(self.forward_grad_enabled)
        internals.set_view_replay_enabled(self.view_replay)
        internals.set_inplace_requires_grad_allowed(self.inplace_requires_grad_allowed)
        while internals.dispatch_mode_depth() > self.dispatch_modes:
            internals.pop_dispatch_mode()
        while internals.function_mode_depth() > self.function_modes:
            internals.pop_function_mode()
        if internals.functorch_layer_depth() > self.functorch_depth:
            internals.pop_functorch_layers_to(self.functorch_depth)
        internals.set_python_dual_level(self.python_dual_level)


@contextlib.contextmanager
def preserved_torch_state() -> Iterator[None]:
    """Run the body, then restore grad modes, dispatch keys, modes and transform levels.

    What is restored: grad and forward-grad mode, view replay, functorch's in-place flag, the
    torch dispatch and torch function mode stacks, the functorch dynamic layer stack, the
    Python-level forward-AD level, and the thread-local included/excluded dispatch keys; the
    saved-tensor hooks of a ``torch.utils.checkpoint`` the body raised through are popped.
    Random number generators are not touched here: only a trace that runs real ops consumes
    them, and that trace forks them itself.
    """
    snapshot = TorchStateSnapshot.take()
    # The guard saves the thread-local dispatch key sets on entry and reinstates them on exit.
    with internals.PreserveDispatchKeyGuard():
        try:
            yield
        except BaseException as err:
            # Before torch 2.13 a checkpoint fn raised through keeps its saved-tensor hooks.
            internals.close_abandoned_checkpoints(err)
            raise
        finally:
            snapshot.restore()
