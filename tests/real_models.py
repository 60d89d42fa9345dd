"""Whether this run may skip the real-model tests: torchvision's and timm's models, and the
client libraries of ``tests/test_clients.py``.

Those tests need the extra ``fxviews[zoo]`` (or ``fxviews[clients]``) and a torchvision that
imports beside the installed torch (a wheel built for another torch, or a CUDA build beside a
CPU torch, fails at import; laplace-torch and nngeometry import torchvision too).
Where the libraries are missing or broken the tests skip, saying why; but a run that is meant
to test the real models (CI's virtualenv with a matching torch and torchvision) sets
``FXVIEWS_REQUIRE_ZOO=1``, and there the same reason fails the test, so a broken install cannot
pass as a green run with the real models left out.

Example::

    >>> require_zoo_or_skip("torchvision", "timm")   # at the top of a test, or of a module
"""

from __future__ import annotations

import os

import pytest

from fxviews.bench import zoo

__all__ = ["REQUIRE_ZOO", "require_zoo_or_skip", "zoo_required"]

#: The environment variable that makes a skipped real-model test a failure.
REQUIRE_ZOO = "FXVIEWS_REQUIRE_ZOO"


def zoo_required() -> bool:
    """Whether this run must run the real-model tests (``FXVIEWS_REQUIRE_ZOO=1``)."""
    return os.environ.get(REQUIRE_ZOO, "") == "1"


def require_zoo_or_skip(*libraries: str, extra: str = "zoo") -> None:
    """Return if every one of ``libraries`` imports; otherwise skip the test (or, at a module's
    top level, the module) saying why, or fail it where :func:`zoo_required`, naming the
    ``extra`` of fxviews that installs them (the client libraries of ``tests/test_clients.py``
    are ``extra="clients"``)."""
    for library in libraries:
        reason = zoo.unavailable(library)
        if reason is None:
            continue
        if zoo_required():
            pytest.fail(
                f"{REQUIRE_ZOO}=1 requires the real-model tests to run, but {reason}. Install "
                f"torch with a torchvision built for it from the same index (`pip install "
                f"-e '.[{extra}]'` after the matching torch), or unset {REQUIRE_ZOO}.",
                pytrace=False,
            )
        pytest.skip(reason, allow_module_level=True)
