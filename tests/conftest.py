"""Every test leaves PyTorch's thread-local state as it found it.

A trace that fails deep inside forward AD or vmap can leave dispatch keys excluded, modes
pushed or transform levels open, and every later eager call in the process then fails far from
the cause. fxviews guarantees it never does that; this check makes any test that does (ours, or
PyTorch failing in a test that expects it to) fail where it happens.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fxviews.torch_state import TorchStateSnapshot


@pytest.fixture(autouse=True)
def _leaves_pytorch_as_it_found_it() -> Iterator[None]:
    before = TorchStateSnapshot.take()
    yield
    after = TorchStateSnapshot.take()
    assert after == before, f"the test left PyTorch's state changed:\n{before}\n{after}"
