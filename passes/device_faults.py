"""Device faults: an error after which a device is unusable is fatal, never an answer.

Note [A device error is fatal]
------------------------------
Some code runs kernels and reads a failure as an answer: layout truth's eager run of a kernel
("this layout stays unchecked"), the recording a trace starts with ("fake mode will do"), a
real-mode trace ("report both causes"), a sweep over samples ("this sample is no case"). On CPU
such a failure is the op's own. On an accelerator it may be the device's: a kernel that faults
(an illegal memory access, a device-side assert) leaves the context unusable, so every later
call on that device fails too, and since kernels run asynchronously the call that reports the
fault need not be the one that caused it. Read as an answer, the error turns every later one
into a false one (each later op "fails on zeros", each later sample "is no case"), and a sweep
that finds nothing after that op still passes.

So every such ``except`` asks :func:`raise_if_device_failed` first, which raises
:class:`DeviceFailure`, naming what ran and chaining the error, when

1. the error is a ``torch.AcceleratorError`` (PyTorch's error from an accelerator's runtime:
   "CUDA error: an illegal memory access was encountered"), or
2. a device the work ran on, other than CPU and meta and reachable from this process, no longer
   runs a one-element kernel and copies its result back (after a fault, later calls fail with
   plain ``RuntimeError``\\ s too, such as cuBLAS's "CUBLAS_STATUS_EXECUTION_FAILED").

Otherwise the caller's own handling stands. The probe runs only on that error path and only on
an accelerator: nothing is added where nothing fails, or on CPU. An out-of-memory error leaves
the device usable, passes the probe and stays the caller's to handle.

Example::

    >>> try:
    ...     kernel(*args)
    ... except RuntimeError as err:
    ...     raise_if_device_failed(err, devices_of(args), "the eager kernel of roll")
    ...     unchecked = str(err)  # the op's own refusal: an answer
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .compat.torch_internals import disable_current_modes, pytree

__all__ = [
    "DeviceFailure",
    "current_accelerator",
    "devices_of",
    "raise_if_device_failed",
    "still_works",
]


class DeviceFailure(Exception):
    """A device failed while something ran on it and cannot be trusted afterwards.

    Not a ``RuntimeError``: the handlers that read an op's refusal as an answer catch those.
    """


def devices_of(values: Any) -> list[torch.device]:
    """The devices, other than CPU and meta, of the tensors among the pytree ``values``.

    Fake tensors count by the device they stand for.

    Example::

        >>> devices_of([torch.ones(2), {"w": torch.ones(1, device="meta")}])
        []
    """
    found = {
        leaf.device
        for leaf in pytree.tree_leaves(values)
        if isinstance(leaf, torch.Tensor) and leaf.device.type not in ("cpu", "meta")
    }
    return sorted(found, key=str)


def still_works(device: torch.device) -> bool:
    """Whether ``device`` runs a one-element kernel and copies its result back.

    True for a device this process cannot reach (fake CUDA tensors on a machine without
    CUDA): nothing ran there. Runs outside every dispatch mode, so a fake mode around the
    caller does not answer for the device.

    Example::

        >>> still_works(torch.device("cpu"))
        True
    """
    if not _reachable(device):
        return True
    try:
        with disable_current_modes():
            return torch.ones(1, device=device).add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure of the probe is the device's
        return False


def current_accelerator() -> list[torch.device]:
    """This machine's current accelerator, as a list (empty without one): the device to probe
    where the work that failed does not say which it used.

    Example::

        >>> current_accelerator()   # on a machine without an accelerator
        []
    """
    if not torch.accelerator.is_available():
        return []
    accelerator = torch.accelerator.current_accelerator()
    return [] if accelerator is None else [accelerator]


def raise_if_device_failed(err: BaseException, devices: Iterable[torch.device], what: str) -> None:
    """Raise :class:`DeviceFailure` from ``err`` if it is a device's error, or if one of
    ``devices`` no longer works after it (see the Note); return otherwise."""
    devices = list(devices)
    broken = [d for d in devices if not still_works(d)]
    if not broken and not isinstance(err, torch.AcceleratorError):
        return
    where = ", ".join(str(d) for d in broken or devices) or "an accelerator"
    text = str(err).strip()
    raise DeviceFailure(
        f"{what} failed on {where} ({type(err).__name__}: "
        f"{text.splitlines()[0] if text else ''}): a device error is fatal, not a failed "
        f"sample; nothing run on that device afterwards can be trusted. Kernels run "
        f"asynchronously: with CUDA_LAUNCH_BLOCKING=1 the error names the kernel that faulted."
    ) from err


def _reachable(device: torch.device) -> bool:
    """Whether this process has ``device``'s backend and index (CPU and meta excluded)."""
    if device.type in ("cpu", "meta"):
        return False
    if not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != device.type:
        return False
    return device.index is None or device.index < torch.accelerator.device_count()
