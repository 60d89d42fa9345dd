"""What the device-ready tests do about the device itself: nothing on it may fail silently.

The differential tests run on :data:`tests.reference.TEST_DEVICE` (``FXVIEWS_TEST_DEVICE``).
A test or sweep that reads an error as "this sample is no case" or "this layout fails" must not
read a device fault that way: on CUDA an illegal memory access leaves the context unusable, and
every later sample would then "fail" too, so a sweep would silently find nothing after that op
(Note [A device error is fatal] in ``passes/device_faults.py``). So:

* :func:`raise_if_test_device_failed` is what every such ``except`` calls first: it raises
  :class:`~fxviews.passes.device_faults.DeviceFailure`, naming what ran, when the error is the
  device's or the device no longer works; ``tests/conftest.py`` then stops the whole run with
  that message (later tests would run on a dead device);
* :data:`DEVICE_BREAKING_OPS` names the OpInfo entries known to break a device, each with the
  reason, and :func:`device_breaking_reason` is how a sweep leaves them out, by name, on that
  device only.

Example::

    >>> for info in op_db:
    ...     if device_breaking_reason(info.name):
    ...         continue  # said in the test's docstring, by name
    ...     try:
    ...         run(info)
    ...     except RuntimeError as err:
    ...         raise_if_test_device_failed(err, f"OpInfo {info.name}")
"""

from __future__ import annotations

from fxviews.passes.device_faults import raise_if_device_failed
from tests.reference import TEST_DEVICE

__all__ = ["DEVICE_BREAKING_OPS", "device_breaking_reason", "raise_if_test_device_failed"]

_JITERATOR = (
    "OpInfo's jiterator entries run CUDA kernels compiled from source at run time "
    "(torch.cuda.jiterator); jiterator_unary's samples put in the layout truth sweep's layouts "
    "broke the CUDA context on an H200 (illegal memory access, torch 2.11.0+cu130); the others "
    "are the same mechanism"
)

#: OpInfo entries (their ``name``) whose samples break a device of that type, with the reason:
#: every sweep over OpInfo leaves them out there.
DEVICE_BREAKING_OPS: dict[str, dict[str, str]] = {
    "cuda": dict.fromkeys(
        (
            "jiterator_unary",
            "jiterator_binary",
            "jiterator_binary_return_by_ref",
            "jiterator_2inputs_2outputs",
            "jiterator_4inputs_with_extra_args",
        ),
        _JITERATOR,
    ),
}


def device_breaking_reason(op_name: str) -> str | None:
    """Why OpInfo entry ``op_name`` is left out on the test device, or None where it runs.

    Example::

        >>> device_breaking_reason("jiterator_unary")   # on CPU
    """
    return DEVICE_BREAKING_OPS.get(TEST_DEVICE.type, {}).get(op_name)


def raise_if_test_device_failed(err: BaseException, what: str) -> None:
    """Raise a DeviceFailure from ``err`` if the test device failed while ``what`` ran on it."""
    raise_if_device_failed(err, [TEST_DEVICE], what)
