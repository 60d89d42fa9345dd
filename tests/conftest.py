"""Every test leaves PyTorch's thread-local state as it found it, and a device fault ends the run.

A trace that fails deep inside forward AD or vmap can leave dispatch keys excluded, modes
pushed or transform levels open, and every later eager call in the process then fails far from
the cause. fxviews guarantees it never does that; this check makes any test that does (ours, or
PyTorch failing in a test that expects it to) fail where it happens.

A test that fails with a device's error (a DeviceFailure, a ``torch.AcceleratorError``), or
after which the test device no longer works, stops the whole run, saying so: every later test
would run on a dead device (Note [A device error is fatal] in ``passes/device_faults.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from fxviews.passes.compat.torch_internals import reset_dynamo
from fxviews.passes.device_faults import DeviceFailure, still_works
from fxviews.tracing.torch_state import TorchStateSnapshot


@pytest.fixture(autouse=True)
def _leaves_pytorch_as_it_found_it() -> Iterator[None]:
    before = TorchStateSnapshot.take()
    yield
    after = TorchStateSnapshot.take()
    assert after == before, f"the test left PyTorch's state changed:\n{before}\n{after}"


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's compiled frames and guards outlive a test: a module that compiles asks each of
    its tests to start from scratch (``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    reset_dynamo()
    yield
    reset_dynamo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.excinfo is not None:
        reason = _device_failure(call.excinfo.value)
        if reason is not None:
            item.session.shouldstop = f"{item.nodeid}: {reason}"


def _device_failure(err: BaseException) -> str | None:
    """Why the run cannot go on after ``err``, or None: a device's error, in ``err``'s chain,
    or a test device that no longer works (checked only where a test used one)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, DeviceFailure | torch.AcceleratorError):
            return f"{type(seen).__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    reference = sys.modules.get("tests.reference")
    device = getattr(reference, "TEST_DEVICE", None)
    if device is not None and not still_works(device):
        return f"the test device {device} no longer works after this test"
    return None
